"""Device results keep the evidence, and the device side fails closed (issue #50 items 2, 3, 6): which result of a
device and file `collect` keeps (a measured FAIL is never replaced by a verified-only result, nor by an older one;
"newer" is the result's own timestamp, the future refused), publish judging devices.json again with collect's
function and rendering its strings table-safe, the size cap and whitelist of a result, one-line errors for malformed
results and devices.json, `judge` failing on a NaN or missing value or tolerance, the ranges of a result's numbers and
of `device-check --threads`. Results and manifests are built by tests/unit/test_device_check.py's helpers."""

from __future__ import annotations

import json
import math
import os
import re

import pytest

from pipeline.devices.check import judge
from pipeline.devices.collect import collect
from pipeline.errors import PipelineError
from pipeline.layout import Layout
from pipeline.stages.publish_devices import TOLERANCE, device_results
from pipeline.stages.report_devices import device_check_text

from .test_device_check import _folder, _result, _speedup

FAIL_KLD = 0.9  # the build box measured 0.003 on the slice: far outside the tolerance


def _stored(folder) -> dict:
    """devices.json's results by (device label, file)."""
    data = json.loads((folder / "devices.json").read_text())
    return {(r["device"]["label"], r["file"]): r for r in data["results"]}


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    return msg


# ------------------------------------------------------------------ defect 2: which result is kept


def test_a_verified_only_result_never_replaces_a_measured_fail(tmp_path):
    """The issue's case: a measured FAIL for pi5-8g, then a verified-only result (no llama.cpp on the device) for the
    same file and device, timestamped 2020. On 1506cb4 the FAIL was replaced and devices.json said
    "pass (verified only)"; the FAIL stays, and so it does against a newer verified-only result."""
    folder, _manifest, entry = _folder(tmp_path)
    root = folder.parent
    fail = _result(folder, entry, label="pi5-8g", kld=FAIL_KLD, timestamp="2024-03-01T12:00:00Z")
    collect([fail], root)
    before = (folder / "devices.json").read_bytes()
    for when in ("2020-01-01T00:00:00Z", "2024-03-02T00:00:00Z"):
        verified = _result(folder, entry, label="pi5-8g", checked=False, slice=None, bench=None, tools=None,
                           timestamp=when, out=tmp_path / f"verified-{when[:4]}.json")
        _, notes = collect([verified], root)
        (r,) = _stored(folder).values()
        assert (r["checked"], r["passed"]) == (True, False), r
        assert r["slice"]["measured"]["kld_mean"] == FAIL_KLD
        assert notes[-1] == (f"kept pi5-8g's result for m-Q8_0.gguf measured 2024-03-01T12:00:00Z (FAIL): {verified} "
                             "is verified only, which never replaces a measured result"), notes
        assert (folder / "devices.json").read_bytes() == before
    text = device_check_text(_manifest, list(_stored(folder).values()), short=True)
    assert text.endswith("| **FAIL** |") and "verified only" not in text


def test_a_measured_result_is_replaced_only_by_a_newer_measured_one(tmp_path):
    folder, _manifest, entry = _folder(tmp_path)
    root = folder.parent
    collect([_result(folder, entry, kld=FAIL_KLD, timestamp="2024-03-01T12:00:00Z")], root)
    older = _result(folder, entry, kld=0.0031, timestamp="2024-02-28T00:00:00Z")
    _, notes = collect([older], root)
    assert notes == [f"kept pi5's result for m-Q8_0.gguf of 2024-03-01T12:00:00Z (FAIL): {older}'s is older "
                     "(2024-02-28T00:00:00Z)"]
    assert _stored(folder)[("pi5", entry["file"])]["passed"] is False
    newer = _result(folder, entry, kld=0.0032, timestamp="2024-03-01T12:00:01Z")
    _, notes = collect([newer], root)
    assert notes[0].startswith("replaced pi5's result for m-Q8_0.gguf of 2024-03-01T12:00:00Z (FAIL) from ")
    assert _stored(folder)[("pi5", entry["file"])]["passed"] is True
    # a verified-only result: replaced by any measured one (more evidence), by a newer verified-only one only
    v1 = _result(folder, entry, label="phone", checked=False, slice=None, bench=None, tools=None,
                 timestamp="2024-03-05T00:00:00Z", out=tmp_path / "v1.json")
    v0 = _result(folder, entry, label="phone", checked=False, slice=None, bench=None, tools=None,
                 timestamp="2024-03-04T00:00:00Z", out=tmp_path / "v0.json")
    _, notes = collect([v1, v0], root)
    assert notes[1].startswith("kept phone's result for m-Q8_0.gguf of 2024-03-05T00:00:00Z (pass (verified only))")
    m = _result(folder, entry, label="phone", timestamp="2024-01-01T00:00:00Z", out=tmp_path / "m.json")
    collect([m], root)
    assert _stored(folder)[("phone", entry["file"])]["checked"] is True


def test_several_results_in_one_call_are_merged_by_the_same_rule_in_any_order(tmp_path):
    folder, _manifest, entry = _folder(tmp_path)
    paths = [_result(folder, entry, kld=FAIL_KLD, timestamp="2024-03-02T00:00:00Z", out=tmp_path / "a.json"),
             _result(folder, entry, kld=0.0031, timestamp="2024-03-01T00:00:00Z", out=tmp_path / "b.json"),
             _result(folder, entry, checked=False, slice=None, bench=None, tools=None,
                     timestamp="2024-03-03T00:00:00Z", out=tmp_path / "c.json")]
    written = set()
    for order in (paths, paths[::-1], [paths[1], paths[2], paths[0]]):
        (folder / "devices.json").unlink(missing_ok=True)
        collect(order, folder.parent)
        written.add((folder / "devices.json").read_bytes())
        assert _stored(folder)[("pi5", entry["file"])]["slice"]["measured"]["kld_mean"] == FAIL_KLD
    assert len(written) == 1


def test_the_same_time_with_other_numbers_is_refused(tmp_path):
    folder, _manifest, entry = _folder(tmp_path)
    a = _result(folder, entry, kld=0.0031, out=tmp_path / "a.json")
    b = _result(folder, entry, kld=FAIL_KLD, out=tmp_path / "b.json")
    with pytest.raises(PipelineError) as exc:
        collect([a, b], folder.parent)
    assert _one_line(exc) == (f"{b}: pi5's result for m-Q8_0.gguf of 2024-01-01T00:00:00Z differs from the one of the "
                              f"same time in {a}: neither is newer; collect one of them")
    assert not (folder / "devices.json").exists()
    collect([a, a], folder.parent)  # the same result twice: one
    assert len(_stored(folder)) == 1


@pytest.mark.parametrize("when,what", [
    (None, "field timestamp missing"),
    ("yesterday", "field timestamp: 'yesterday' is not a UTC time as device-check writes it (YYYY-MM-DDTHH:MM:SSZ)"),
    ("2024-02-30T00:00:00Z", "field timestamp: '2024-02-30T00:00:00Z' is not a UTC time"),
    (1767225600, "field timestamp: 1767225600 is not a UTC time"),
    ("2999-01-01T00:00:00Z", "field timestamp: 2999-01-01T00:00:00Z is in the future (here it is "),
])
def test_a_result_without_its_own_time_or_from_the_future_is_refused(tmp_path, when, what):
    folder, _manifest, entry = _folder(tmp_path)
    over = {"timestamp": when} if when is not None else {}
    bad = _result(folder, entry, **over)
    if when is None:
        raw = json.loads(bad.read_text())
        del raw["timestamp"]
        bad.write_text(json.dumps(raw))
    with pytest.raises(PipelineError) as exc:
        collect([bad], folder.parent)
    msg = _one_line(exc)
    assert msg.startswith(f"{bad}: {what}"), msg
    assert not (folder / "devices.json").exists()


def test_a_device_clock_a_little_ahead_is_allowed(tmp_path):
    from pipeline.stages.device_results import CLOCK_SKEW_S, TIME_FORMAT, check_timestamp

    now = 1_800_000_000
    ahead = lambda s: __import__("time").strftime(TIME_FORMAT, __import__("time").gmtime(now + s))  # noqa: E731
    assert check_timestamp("r.json", ahead(CLOCK_SKEW_S), now) == ahead(CLOCK_SKEW_S)
    with pytest.raises(PipelineError, match="is in the future .* at most 5 minutes ahead"):
        check_timestamp("r.json", ahead(CLOCK_SKEW_S + 1), now)


# ------------------------------------------------------------------ defect 3: publish judges devices.json again


def _publish_view(tmp_path, folder, manifest):
    return device_results(Layout(folder.parent, tmp_path / "work"), "m", manifest)


def _edit_devices_json(folder, edit) -> None:
    data = json.loads((folder / "devices.json").read_text())
    edit(data)
    (folder / "devices.json").write_text(json.dumps(data))


def test_publish_judges_a_hand_edited_devices_json_again(tmp_path, capsys):
    """A devices.json edited by hand (or in a pull request) to a mean KLD of 0.9 still saying "pass": on 1506cb4 the
    card showed pass; publish judges it again with collect's function, and the report and card show FAIL."""
    folder, manifest, entry = _folder(tmp_path)
    collect([_result(folder, entry)], folder.parent)

    def forge(data):
        r = data["results"][0]
        r["slice"]["measured"]["kld_mean"] = FAIL_KLD  # "passed": true, delta and limit left as they were

    _edit_devices_json(folder, forge)
    (r,) = _publish_view(tmp_path, folder, manifest)
    assert r["passed"] is False and r["slice"]["delta"]["kld_mean"] == pytest.approx(FAIL_KLD - 0.003)
    assert "judged again: FAIL, not the result's pass" in capsys.readouterr().out
    for short in (False, True):
        row = device_check_text(manifest, [r], short=short).splitlines()[-1]
        assert row.startswith("| pi5 (aarch64) | `m-Q8_0.gguf` | b11312 | 0.90000 (+0.89700) |") and \
            row.endswith("| **FAIL** |"), row


@pytest.mark.parametrize("edit,what", [
    (lambda r: r["device"].update(label="pi5 <img src=x onerror=alert(1)>"), "field device.label: 'pi5 <img"),
    (lambda r: r["device"].update(machine="aarch64\n## injected"), "field device.machine: 'aarch64\\n## injected'"),
    (lambda r: r["tools"].update(llama_cpp_build="11312 | <b>x</b>"), "field tools.llama_cpp_build: must be an "),
    (lambda r: r["slice"]["measured"].update(kld_mean=float("nan")), "field slice.measured.kld_mean: must be a "),
    (lambda r: r.update(timestamp="2999-01-01T00:00:00Z"), "field timestamp: 2999-01-01T00:00:00Z is in the future"),
])
def test_publish_refuses_a_devices_json_entry_it_cannot_check(tmp_path, edit, what):
    """An entry that fails collect's checks stops the publish in one line naming devices.json, the entry and the
    field: shown, it would bring unchecked text to the card; dropped, a FAIL could vanish. On 1506cb4 it was shown as
    it was."""
    folder, manifest, entry = _folder(tmp_path)
    collect([_result(folder, entry)], folder.parent)
    _edit_devices_json(folder, lambda data: edit(data["results"][0]))
    with pytest.raises(PipelineError) as exc:
        _publish_view(tmp_path, folder, manifest)
    assert _one_line(exc).startswith(f"{folder / 'devices.json'} results[0]: {what}"), exc.value


HOSTILE = "x<script>alert(1)</script> | [a](https://e.example) ![i](https://e.example/p.png) \\| `c`\n## h\r\u2028z"
_CODE_SPAN = re.compile(r"(?<![`\\])(`+)(?!`)(.+?)(?<!`)\1(?!`)")


def _markup(row: str) -> str:
    """What of a table row markdown would read as markup: the row without its code spans (literal text, where no tag
    or link is read) and without backslash-escaped characters."""
    return re.sub(r"\\.", "", _CODE_SPAN.sub("", row))


def test_stored_strings_reach_report_and_card_as_table_safe_text(tmp_path):
    """Whatever a stored string holds, its cell stays one cell of one row, with no HTML tag, link, image or line break
    in report.md and README.md (rendered from results given as they are, without collect's checks). On 1506cb4 the
    row was split and the tags were raw."""
    from pipeline.stages.card import card_text

    _, manifest, entry = _folder(tmp_path)
    manifest = {**manifest, "draft": None, "tools": {"llama_cpp_build": 11312, "llama_cpp_commit": "abc"},
                "artifacts": [{**entry, "role": "quant", "size_bytes": 1, "bits_per_weight": 8.5}]}
    r = {"checked": True, "passed": True, "file": entry["file"], "tools": {"llama_cpp_build": 11312},
         "device": {"label": HOSTILE, "machine": HOSTILE, "power_mode": HOSTILE},
         "slice": {"measured": {"kld_mean": 0.0031, "same_top_p": 0.96}, "delta": {"kld_mean": 0.0001,
                                                                                "same_top_p_points": 0.0}},
         "speedup": {**_speedup(), "pair": f"{entry['file']} + {HOSTILE}"}}
    verified = {"checked": False, "passed": True, "file": entry["file"], "device": {"label": HOSTILE, "machine": "a"}}
    for text in (device_check_text(manifest, [r, verified]), card_text(manifest, [r, verified])):
        lines = text.splitlines()
        header = lines.index("| device | file | llama.cpp | mean KLD (Δ) | same top p (Δ points) | tg t/s | draft "
                             "speed-up | result |")
        rows = lines[header + 2:header + 4]
        assert rows[0].endswith("| pass |") and rows[1].endswith("| verified only |"), rows
        for row in rows:
            assert len(re.findall(r"(?<!\\)\|", row)) == 9, row  # 8 cells: the header's pipes, no more
            assert not re.search(r"[<>\[\]`]", _markup(row)), _markup(row)
        assert not any(line.startswith("## h") for line in lines) and "\u2028" not in text and "\r" not in text


def test_the_table_text_helper():
    from pipeline.stages.table_text import cell

    assert cell("a|b<c>&d") == "a\\|b&lt;c&gt;&amp;d" and cell("q8_0 x86_64 *") == "q8_0 x86_64 *"
    assert cell("a\\|b") == "a\\\\\\|b"  # a backslash cannot undo the escape of the | after it
    assert cell("[x](u) ![i](u)") == "\\[x\\](u) !\\[i\\](u)"
    assert cell("x`y|z", code=True) == "``x`y\\|z``" and cell("l1\nl2\u202e", code=True) == "`l1 l2 `"
    assert cell(11312) == "11312"


# ------------------------------------------------------------------ item 3: size cap, only checked fields stored


def test_a_result_over_the_size_cap_is_refused(tmp_path):
    from pipeline.devices.collect import RESULT_MAX_BYTES

    folder, _manifest, entry = _folder(tmp_path)
    big = _result(folder, entry)
    text = big.read_text()
    big.write_text(text[:-1] + " " * (RESULT_MAX_BYTES - len(text) + 1) + "}")
    with pytest.raises(PipelineError) as exc:
        collect([big], folder.parent)
    assert _one_line(exc) == (f"{big}: cannot read a device-check result: {RESULT_MAX_BYTES + 1} bytes, more than the "
                              f"{RESULT_MAX_BYTES} allowed")
    big.write_text(text[:-1] + " " * (RESULT_MAX_BYTES - len(text)) + "}")  # at the cap: taken
    collect([big], folder.parent)


def test_only_checked_fields_reach_devices_json(tmp_path):
    folder, manifest, entry = _folder(tmp_path)
    unknown = "<b>not checked</b>\n| x |"
    path = _result(folder, entry, note=unknown, verified=unknown, extra={"a": unknown}, buffers_mib={"x": 1.0},
                   device={"label": "pi5", "machine": "aarch64", "hostname": unknown, "cpu": "Cortex-A76"},
                   tools={"llama_cpp_build": 11312, "path": unknown},
                   slice={"measured": {"kld_mean": 0.0031, "same_top_p": 0.96, "ppl_q": 27.0, "x": unknown},
                          "expected": {"kld_mean": 0.5}, "limit": {"kld_mean": 9.0}, "passed": True, "x": unknown},
                   bench={"tg_tokens_per_s": 9.5, "x": unknown}, speedup=_speedup(x=unknown, build_box=unknown))
    collect([path], folder.parent)
    raw = (folder / "devices.json").read_text()
    assert "not checked" not in raw and "hostname" not in raw and "buffers_mib" not in raw
    (r,) = json.loads(raw)["results"]
    assert set(r) == {"kind", "version", "name", "build_id", "file", "sha256", "timestamp", "checked", "passed",
                      "device", "slice", "tools", "bench", "speedup"}
    assert r["device"] == {"label": "pi5", "machine": "aarch64", "cpu": "Cortex-A76"}
    assert set(r["slice"]) == {"measured", "expected", "delta", "limit", "passed"}
    assert r["slice"]["expected"] == entry["slice"] and r["slice"]["limit"]["kld_mean"] == 0.002
    assert _publish_view(tmp_path, folder, manifest) == [r]


def test_a_result_as_device_check_writes_it_is_taken(tmp_path):
    """Every field device-check writes (this machine's device facts, the tools' description, llama-bench's figures, a
    draft speed-up with its build-box figures) either passes the checks or is one collect drops: none is refused."""
    from pipeline.devices.check import device_facts
    from pipeline.tools import Toolchain

    folder, _manifest, entry = _folder(tmp_path)
    tools = Toolchain(root=tmp_path, bin_dir=tmp_path, convert_script=tmp_path, gguf_py=tmp_path, build_number=11312,
                      commit="0c1e570", origin="device", backend="cuda", ngl=999).describe()
    sp = {**_speedup(), "flags": ["--spec-draft-p-min", "0.5"], "spec_type": "draft-simple", "rounds": 3,
          "prompts": 2, "prompt_tokens": 150, "n_predict": 48, "speedup_by_round": [0.5, 0.55, 0.45], "drafted": 90,
          "accepted": 36, "build_box": {"speedup": 1.2, "interval": [1.1, 1.3], "box": "x86_64 AMD, 16 cores"}}
    path = _result(folder, entry, device=device_facts("pi5", "15W"), tools=tools, threads=4, verified="OK  x (...)",
                   buffers_mib={"CPU_REPACK model": 52.59}, bench={"pp_tokens_per_s": 120.5, "pp_tokens": 64,
                                                                   "tg_tokens_per_s": 9.5, "tg_tokens": 16, "threads": 4},
                   slice={"expected": entry["slice"], "measured": {"kld_mean": 0.0031, "same_top_p": 0.96, "ppl_q": 27.0},
                          "seconds": 6.3, "delta": {}, "limit": {}, "passed": True}, speedup=sp)
    collect([path], folder.parent)
    (r,) = _stored(folder).values()
    assert r["device"]["label"] == "pi5" and r["device"]["power_mode"] == "15W" and r["threads"] == 4
    assert r["tools"] == {"llama_cpp_build": 11312, "llama_cpp_commit": "0c1e570", "origin": "device",
                          "backend": "cuda", "ngl": 999}
    assert r["bench"]["pp_tokens"] == 64 and r["slice"]["seconds"] == 6.3
    assert r["speedup"]["drafted"] == 90 and "build_box" not in r["speedup"] and "flags" not in r["speedup"]


# ------------------------------------------------------------------ item 4: one line, never a traceback


def _deep(n: int) -> str:
    return '{"a": ' * n + "1" + "}" * n


@pytest.mark.parametrize("content,what", [
    ("[1, 2]", "not a `ggufpipe device-check --out` result: a JSON object expected, got list"),
    (None, "field name: must be a recipe name, got ['m']"),
    (_deep(100_000), "cannot read a device-check result: nested too deeply"),
    ("{\"kind\": ", "cannot read a device-check result: "),
    (b'{"a": "\x80"}', "cannot read a device-check result: not UTF-8"),
])
def test_malformed_result_files_give_one_line(tmp_path, content, what):
    folder, _manifest, entry = _folder(tmp_path)
    path = _result(folder, entry, name=["m"]) if content is None else tmp_path / "r.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(PipelineError) as exc:
        collect([path], folder.parent)
    assert _one_line(exc).startswith(f"{path}: {what}"), exc.value
    assert not (folder / "devices.json").exists()


@pytest.mark.parametrize("speedup", ["fast", [1, 2], {"tokens_per_s": "x"}, _speedup()])
def test_a_verified_only_result_with_a_speed_up_gives_one_line(tmp_path, speedup):
    folder, _manifest, entry = _folder(tmp_path)
    bad = _result(folder, entry, checked=False, slice=None, bench=None, tools=None, speedup=speedup)
    with pytest.raises(PipelineError) as exc:
        collect([bad], folder.parent)
    assert _one_line(exc) == f"{bad}: field speedup: must be null in a verified-only result (checked: false)"


@pytest.mark.parametrize("stored,what", [
    ({"kind": "ggufpipe-device-check-results"}, "field results: must be a list of results, got nothing"),
    ({"kind": "ggufpipe-device-check-results", "results": {"a": 1}}, "field results: must be a list of results, "
                                                                      "got dict"),
    ({"kind": "ggufpipe-device-check-results", "results": [["x"]]}, "field results[0]: must be a result (a mapping), "
                                                                    "got list"),
    ({"kind": "ggufpipe-device-check-results", "results": [{"file": ["x"]}]}, None),  # dropped: not a published file
    ({"kind": "ggufpipe-device-check-results", "results": [{"file": "m-Q8_0.gguf", "sha256": "a" * 64}]},
     "results[0]: kind None version None: not a `ggufpipe device-check --out` result"),
    ([], "not a `ggufpipe collect` results file: a JSON object expected, got list"),
    ({"kind": "other"}, "kind 'other': not a `ggufpipe collect` results file"),
])
def test_a_malformed_devices_json_gives_one_line(tmp_path, stored, what):
    folder, manifest, entry = _folder(tmp_path)
    out = folder / "devices.json"
    out.write_text(json.dumps(stored))
    for run in (lambda: collect([_result(folder, entry)], folder.parent),
                lambda: _publish_view(tmp_path, folder, manifest)):
        if what is None:
            run()
            continue
        with pytest.raises(PipelineError) as exc:
            run()
        assert _one_line(exc).startswith(f"{out}"), exc.value
        assert what in str(exc.value), exc.value
        assert json.loads(out.read_text()) == stored  # nothing written


def test_a_fifo_is_refused_without_blocking(tmp_path):
    folder, manifest, entry = _folder(tmp_path)
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    with pytest.raises(PipelineError) as exc:
        collect([fifo], folder.parent)
    assert _one_line(exc) == f"{fifo}: cannot read a device-check result: not a regular file (a FIFO, socket or device)"
    os.mkfifo(folder / "devices.json")
    for run in (lambda: collect([_result(folder, entry)], folder.parent),
                lambda: _publish_view(tmp_path, folder, manifest)):
        with pytest.raises(PipelineError, match="devices.json: cannot read collected results: not a regular file"):
            run()


def test_the_command_prints_one_error_line(tmp_path, capsys):
    from pipeline.cli import main

    folder, _manifest, _entry = _folder(tmp_path)
    (tmp_path / "r.json").write_text(_deep(100_000))
    assert main(["collect", str(tmp_path / "r.json"), "--artifacts", str(folder.parent)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err


# ------------------------------------------------------------------ item 5: gates fail closed on the device side

GOOD = ({"kld_mean": 0.003, "same_top_p": 0.96}, {"kld_mean": 0.003, "same_top_p": 0.96}, dict(TOLERANCE), 510)


@pytest.mark.parametrize("where,key,value", [
    (0, "kld_mean", math.nan), (0, "kld_mean", math.inf), (0, "kld_mean", None), (0, "kld_mean", -0.1),
    (1, "kld_mean", math.nan), (1, "same_top_p", math.nan), (1, "same_top_p", 1.5), (1, "kld_mean", "0.003"),
    (2, "kld_mean_abs", math.inf), (2, "kld_mean_abs", math.nan), (2, "kld_mean_rel", math.nan),
    (2, "same_top_p_points", math.nan), (2, "same_top_p_flip_rate", math.nan), (2, "same_top_p_sigmas", math.inf),
    (2, "kld_mean_rel", None), (3, None, math.nan), (3, None, 0), (3, None, True),
])
def test_judge_fails_on_a_value_or_tolerance_that_is_not_a_number(where, key, value):
    """1506cb4 passed a NaN kld_mean_rel or flip rate (max() dropped it) and an infinite kld_mean_abs."""
    args = [dict(a) if isinstance(a, dict) else a for a in GOOD]
    assert judge(*args)["passed"] is True
    if key is None:
        args[where] = value
    elif value is None:
        del args[where][key]
    else:
        args[where][key] = value
    v = judge(*args)
    name = {0: "expected", 1: "measured", 2: "tolerance", 3: "scored_tokens"}[where] + (f".{key}" if key else "")
    assert v["passed"] is False and any(p.startswith(f"{name}: ") for p in v["problems"]), v


def test_a_manifest_tolerance_that_is_not_a_number_refuses_collect(tmp_path):
    folder, manifest, entry = _folder(tmp_path)
    manifest["device_check"]["tolerance"]["kld_mean_rel"] = math.nan
    (folder / "manifest.json").write_text(json.dumps(manifest))  # json writes NaN, and reads it back
    with pytest.raises(PipelineError) as exc:
        collect([_result(folder, entry)], folder.parent)
    assert _one_line(exc) == (f"{folder / 'manifest.json'}: cannot judge pi5's result for m-Q8_0.gguf against it: "
                              "device_check.tolerance.kld_mean_rel: must be a number 0..10, got nan")


@pytest.mark.parametrize("over,what,got", [
    ({"slice": {"measured": {"kld_mean": -0.001, "same_top_p": 0.96}}},
     "field slice.measured.kld_mean: must be a number 0..1000000", "-0.001"),
    ({"slice": {"measured": {"kld_mean": 0.003, "same_top_p": 1.01}}}, "field slice.measured.same_top_p: must be a "
                                                                       "number 0..1", "1.01"),
    ({"slice": {"measured": {"kld_mean": 0.003, "same_top_p": 0.9, "ppl_q": 0.5}}}, "field slice.measured.ppl_q", "0.5"),
    ({"bench": {"tg_tokens_per_s": 0}}, "field bench.tg_tokens_per_s: must be a number > 0", "0"),
    ({"bench": {"tg_tokens_per_s": 1e300}}, "field bench.tg_tokens_per_s: must be a number", "1e+300"),
    ({"tools": {"llama_cpp_build": -1}}, "field tools.llama_cpp_build: must be an integer", "-1"),
    ({"tools": {"llama_cpp_build": 2**40}}, "field tools.llama_cpp_build: must be an integer", "1099511627776"),
    ({"tools": {"llama_cpp_build": 11312.0}}, "field tools.llama_cpp_build: must be an integer", "11312.0"),
    ({"threads": 0}, "field threads: must be an integer 1..512", "0"),
    ({"speedup": _speedup(acceptance_rate=1.5)}, "field speedup.acceptance_rate: must be a number 0..1", "1.5"),
    ({"speedup": _speedup(acceptance_rate=math.nan)}, "field speedup.acceptance_rate: must be a number 0..1", "nan"),
    ({"speedup": _speedup(tokens_per_s=[40.0, math.nan, 60.0])}, "field speedup.tokens_per_s[1]: must be a number",
     "nan"),
    ({"speedup": _speedup(tokens_per_s=[40.0, -1.0, 60.0])}, "field speedup.tokens_per_s[1]: must be a number", "-1.0"),
    ({"speedup": _speedup(n_max=True)}, "field speedup.n_max: must be an integer 1..64", "True"),
    ({"device": {"label": "pi5", "machine": "aarch64", "memory_bytes": -1}}, "field device.memory_bytes: must be",
     "-1"),
])
def test_result_numbers_have_ranges(tmp_path, over, what, got):
    folder, _manifest, entry = _folder(tmp_path)
    bad = _result(folder, entry, **over)
    with pytest.raises(PipelineError) as exc:
        collect([bad], folder.parent)
    assert _one_line(exc).startswith(f"{bad}: {what}") and _one_line(exc).endswith(f"got {got}"), exc.value
    assert not (folder / "devices.json").exists()


def test_the_speed_up_decision_never_passes_on_nan():
    """summarize's min() keeps a NaN only in first place: [2, nan, 3] gave the interval 2-3, "helps"."""
    from pipeline.stages.device_results import rejudge_speedup

    r = {"device": {"label": "pi5"}, "speedup": _speedup(tokens_per_s=[40.0, math.nan, 60.0])}
    with pytest.raises(PipelineError, match=r"^field speedup.tokens_per_s\[1\]: must be a number > 0"):
        rejudge_speedup(r)
    ok, _ = rejudge_speedup({"device": {"label": "pi5"}, "speedup": _speedup(tokens_per_s=[40.0, 50.0, 60.0])})
    assert ok["speedup"]["helps"] is True and ok["speedup"]["interval"] == [2.0, 3.0]


# ------------------------------------------------------------------ item 6: device-check's numeric flags


@pytest.mark.parametrize("value", ["0", "-1", "513", "nan", "4.5", "1e9", ""])
def test_device_check_threads_has_a_range(value, capsys):
    from pipeline.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["device-check", "m-Q8_0.gguf", "--threads", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and err[-1].startswith("ggufpipe device-check: error: argument --threads: "), err
    assert "1..512" in err[-1], err


def test_device_check_says_why_it_cannot_judge():
    from pipeline.devices.check import summary

    v = judge({"kld_mean": math.nan, "same_top_p": 0.96}, GOOD[1], dict(TOLERANCE), 510)
    r = {"checked": True, "passed": v["passed"], "file": "m-Q8_0.gguf", "device": {"label": "pi5"},
         "slice": {"expected": GOOD[0], "measured": GOOD[1], **v}}
    assert summary(r) == ("FAIL  m-Q8_0.gguf on pi5: cannot judge the slice: expected.kld_mean: must be a number "
                          "0..1000000 (a mean KL divergence, in nats), got nan")


def test_a_split_file_is_named_by_its_unsplit_sha256(tmp_path):
    """A split entry has no sha256 of its own (publish_files.py): a result names it by the unsplit file's; a result
    with no sha256 never matches an entry without one."""
    folder, manifest, entry = _folder(tmp_path)
    split = {k: v for k, v in entry.items() if k != "sha256"}
    split["split"] = {"shards": [], "unsplit": {"file": entry["file"], "sha256": entry["sha256"], "size_bytes": 1}}
    (folder / "manifest.json").write_text(json.dumps({**manifest, "artifacts": [split]}))
    collect([_result(folder, entry)], folder.parent)
    del split["split"]
    (folder / "manifest.json").write_text(json.dumps({**manifest, "artifacts": [split]}))
    with pytest.raises(PipelineError, match=r"\(sha256 None…\) is not a file the manifest publishes"):
        collect([_result(folder, entry, sha256=None)], folder.parent)
