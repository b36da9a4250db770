"""The on-device check (issue #20 item 4) without llama.cpp: recipe `device_slice`, cutting a slice out of a generated
base-logits file, the chunk rows of llama-perplexity's output, the verdict's tolerance, the slice's checks against the
manifest (a tampered slice fails naming the field), `ggufpipe collect`, the DVC matrix entry, and the report's section.
The real runs (a slice equal to a fresh `--chunks 2` run, device-check passing on this machine) are in
tests/integration/test_device_check.py and tests/e2e/test_device_check.py."""

from __future__ import annotations

import hashlib
import json
import random
import struct

import pytest
import yaml
from helpers import recipe_error

from pipeline.devices.check import RESULT_KIND, RESULT_VERSION, check_slice, judge, summary
from pipeline.devices.collect import RESULTS_KIND, collect
from pipeline.distribution.verify import verify
from pipeline.errors import ArtifactError, PipelineError
from pipeline.layout import Layout
from pipeline.recipe import load_recipe
from pipeline.stages.device_slice import write_slice
from pipeline.stages.evaluate import parse_chunk_rows, parse_kld_statistics
from pipeline.stages.logitsfile import read_logits_file
from pipeline.stages.publish_devices import SLICE_FILE, TOLERANCE, device_results, same_top_p_limit
from pipeline.stages.report_devices import device_check_text

SHA = "6b5982a638c6ed4e3da15711b6a5a1328c34a53e"


# ------------------------------------------------------------------ recipe


def _recipe(tmp_path, **extra):
    text = tmp_path / "t.txt"
    text.write_text("x " * 4200)  # 16 x 512 tokens fit
    d = {"name": "m", "source": {"repo": "org/model", "revision": SHA}, "quants": ["Q8_0"],
         "gates": [{"name": "g", "text": str(text), "ctx": 512, "chunks": 16}], **extra}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def test_device_slice_defaults_to_two_chunks_of_the_first_eval_set(tmp_path):
    assert load_recipe(_recipe(tmp_path)).device_slice == 2
    assert load_recipe(_recipe(tmp_path, device_slice=0)).device_slice == 0
    assert load_recipe(_recipe(tmp_path, device_slice=1)).device_slice == 1
    no_gates = yaml.safe_load(_recipe(tmp_path).read_text())
    del no_gates["gates"]
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(no_gates))
    assert load_recipe(tmp_path / "n.yaml").device_slice == 0


@pytest.mark.parametrize("value,what", [(3, "must be an integer 0..2, got 3"), (-1, "must be an integer 0..2, got -1"),
                                        ("2", "must be an integer 0..2, got '2'"),
                                        (True, "must be an integer 0..2, got True")])
def test_device_slice_refusals_name_file_and_field(tmp_path, value, what):
    exc = recipe_error(_recipe(tmp_path, device_slice=value))
    assert exc.field == "device_slice" and what in exc.message, exc


def test_device_slice_longer_than_the_eval_set_is_refused(tmp_path):
    d = yaml.safe_load(_recipe(tmp_path, device_slice=2).read_text())
    d["gates"][0].update(ctx=8192, chunks=1)
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(d))
    exc = recipe_error(tmp_path / "r.yaml")
    assert exc.field == "device_slice" and exc.message.startswith("2 chunks, the first eval set 'g' has 1"), exc
    del d["device_slice"]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(d))
    assert load_recipe(tmp_path / "r.yaml").device_slice == 1  # the default follows a 1-chunk eval set


# ------------------------------------------------------------------ the slice of a base-logits file


def _logits_file(path, n_ctx=16, n_vocab=5, n_chunk=3, seed=0):
    """A base-logits file as perplexity.cpp lays it out: header, n_chunk * n_ctx int32 tokens, then the records (here
    random words: write_slice copies bytes, it never decodes them)."""
    rng = random.Random(seed)
    nv = 2 * ((n_vocab + 1) // 2) + 4
    scored = n_ctx - 1 - n_ctx // 2
    tokens = [rng.randrange(n_vocab) for _ in range(n_chunk * n_ctx)]
    records = [rng.randrange(65536) for _ in range(n_chunk * scored * nv)]
    path.write_bytes(struct.pack("=8siii", b"_logits_", n_ctx, n_vocab, n_chunk)
                     + struct.pack(f"={len(tokens)}i", *tokens) + struct.pack(f"={len(records)}H", *records))
    return tokens, records, nv, scored


def test_the_slice_is_the_first_chunks_tokens_and_records(tmp_path):
    src, dst = tmp_path / "base.logits", tmp_path / "slice.logits"
    tokens, records, nv, scored = _logits_file(src)
    assert write_slice(src, dst, 2) == {"n_ctx": 16, "n_vocab": 5, "chunks": 2}
    want = (struct.pack("=8siii", b"_logits_", 16, 5, 2) + struct.pack("=32i", *tokens[:32])
            + struct.pack(f"={2 * scored * nv}H", *records[:2 * scored * nv]))
    assert dst.read_bytes() == want
    f = read_logits_file(dst)
    assert (f.n_ctx, f.n_vocab, f.n_chunk) == (16, 5, 2)
    write_slice(src, dst, 3)
    assert dst.read_bytes() == src.read_bytes()  # all the chunks: the file itself


def test_a_slice_is_refused_from_a_short_or_foreign_file(tmp_path):
    src, dst = tmp_path / "base.logits", tmp_path / "slice.logits"
    _logits_file(src)
    with pytest.raises(PipelineError, match="holds 3 chunks, the slice asks for 4"):
        write_slice(src, dst, 4)
    src.write_bytes(src.read_bytes()[:-2])
    with pytest.raises(PipelineError, match="truncated base logits: "):
        write_slice(src, dst, 1)
    src.write_bytes(b"GGUF" + bytes(40))
    with pytest.raises(PipelineError, match="not a llama-perplexity --kl-divergence-base file"):
        write_slice(src, dst, 1)
    assert not dst.exists()  # nothing half-written


# ------------------------------------------------------------------ llama-perplexity's chunk rows

ROWS = """\
chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p
   1      33.9224 ±    6.2189       0.08729 ±    0.02588       0.08526 ±    0.00529     6.608 ±  0.695 %    81.176 ±  2.452 %
   2      34.1347 ±    4.6045       0.10930 ±    0.01986       0.08251 ±    0.00335     5.734 ±  0.465 %    80.980 ±  1.740 %

====== Perplexity statistics ======
"""


def test_chunk_rows_are_the_running_statistics_in_order():
    rows = parse_chunk_rows(ROWS)
    assert rows == [{"ppl_q": 33.9224, "ln_ppl_ratio": 0.08729, "kld_mean": 0.08526, "rms_dp": 0.06608,
                     "same_top_p": 0.81176},
                    {"ppl_q": 34.1347, "ln_ppl_ratio": 0.1093, "kld_mean": 0.08251, "rms_dp": 0.05734,
                     "same_top_p": 0.8098}]
    assert parse_chunk_rows("no rows here") == []
    with pytest.raises(PipelineError, match="out of order at chunk 2"):
        parse_chunk_rows(ROWS.split("\n", 2)[0] + "\n" + ROWS.split("\n")[2] + "\n")


# ------------------------------------------------------------------ the verdict


@pytest.mark.parametrize("exp_kld,meas_kld,exp_top,meas_top,n,passed", [
    (0.0785, 0.0785, 0.8333, 0.8333, 510, True),       # the same numbers
    (0.0785, 0.0863, 0.8333, 0.8333, 510, True),       # +0.0078: inside 10 % of 0.0785 (0.00785)
    (0.0785, 0.0865, 0.8333, 0.8333, 510, False),      # +0.0080: outside
    (0.0030, 0.0049, 0.9642, 0.9642, 510, True),       # +0.0019: inside the absolute 0.002
    (0.0030, 0.0051, 0.9642, 0.9642, 510, False),      # +0.0021: outside
    (0.0785, 0.0785, 0.8333, 0.8233, 10**6, True),     # -1.00 point of same top p on a long slice: the 1-point floor
    (0.0785, 0.0785, 0.8333, 0.8220, 10**6, False),    # -1.13 points there
    (0.0785, 0.0785, 0.8098, 0.8275, 510, True),       # +1.77 points on 510 tokens (an AVX-512 build, measured)
    (0.0785, 0.0785, 0.8098, 0.8500, 510, False),      # +4.02: more than 3 sigma of 8 % flips (3.76 points)
])
def test_judge_kld_and_same_top_p_limits(exp_kld, meas_kld, exp_top, meas_top, n, passed):
    v = judge({"kld_mean": exp_kld, "same_top_p": exp_top}, {"kld_mean": meas_kld, "same_top_p": meas_top}, TOLERANCE, n)
    assert v["passed"] is passed
    assert v["limit"]["kld_mean"] == pytest.approx(max(0.002, 0.1 * exp_kld))
    assert v["delta"]["kld_mean"] == pytest.approx(meas_kld - exp_kld)


def test_the_same_top_p_limit_is_the_floor_or_the_flip_spread():
    assert same_top_p_limit(TOLERANCE, 510) == pytest.approx(3 * 100 * (0.08 / 510) ** 0.5, abs=1e-4) == 3.7573
    assert same_top_p_limit(TOLERANCE, 4080) == 1.3284  # the demo's whole eval set
    assert same_top_p_limit(TOLERANCE, 10**6) == 1.0  # the floor
    assert same_top_p_limit({"same_top_p_points": 1.0}, 510) == 1.0  # a tolerance without the flip terms


# ------------------------------------------------------------------ the slice against the manifest


def _folder(tmp_path, payload=b"slice bytes"):
    folder = tmp_path / "artifacts" / "m"
    folder.mkdir(parents=True)
    (folder / SLICE_FILE).write_bytes(payload)
    entry = {"file": "m-Q8_0.gguf", "sha256": "a" * 64, "quant_type": "Q8_0", "size_bytes": 1,
             "slice": {"kld_mean": 0.003, "same_top_p": 0.96, "ppl_q": 27.0}}
    manifest = {"name": "m", "build_id": "m-0123456789ab", "artifacts": [entry],
                "draft": {"pairs": [{"main": "m-Q8_0.gguf", "draft": "m-draft-Q4_0.gguf", "compatible": True,
                                     "acceptance": {"best_n_max": 4}}]},
                "device_check": {"file": SLICE_FILE, "sha256": hashlib.sha256(payload).hexdigest(),
                                 "size_bytes": len(payload), "eval_set": "g", "ctx": 512, "chunks": 2,
                                 "scored_tokens": 510, "tolerance": dict(TOLERANCE)}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder, manifest, entry


def test_a_tampered_slice_fails_naming_the_file_and_field(tmp_path):
    folder, manifest, entry = _folder(tmp_path)
    mpath = folder / "manifest.json"
    assert check_slice(mpath, manifest, entry) == folder / SLICE_FILE
    assert verify(folder / SLICE_FILE).startswith(f"OK  {folder / SLICE_FILE} (device slice: 2 chunk(s) of g, sha256 ")
    (folder / SLICE_FILE).write_bytes(b"slice bytez")  # same size, one byte changed
    for check in (lambda: check_slice(mpath, manifest, entry), lambda: verify(folder / SLICE_FILE)):
        with pytest.raises(ArtifactError) as exc:
            check()
        assert exc.value.path == folder / SLICE_FILE and "device_check.sha256" in str(exc.value)
    (folder / SLICE_FILE).write_bytes(b"slice")
    with pytest.raises(ArtifactError, match="device_check.size_bytes says 11: truncated") as exc:
        check_slice(mpath, manifest, entry)
    assert exc.value.path == folder / SLICE_FILE
    (folder / SLICE_FILE).unlink()
    with pytest.raises(ArtifactError, match="missing: pull it with `dvc pull") as exc:
        check_slice(mpath, manifest, entry)
    assert exc.value.path == folder / SLICE_FILE
    with pytest.raises(PipelineError, match="no device_check section"):
        check_slice(mpath, {**manifest, "device_check": None}, entry)
    with pytest.raises(PipelineError, match="has no slice values"):
        check_slice(mpath, manifest, {"file": "m-mtp-F16_MTP.gguf"})


# ------------------------------------------------------------------ collect


def _result(folder, entry, label="pi5", kld=0.0031, passed=True, out=None, **over):
    """A device-check result file (``out``, else ``result-<label>-<kld>.json`` beside artifacts/), as device-check
    writes one, with ``over`` replacing fields."""
    r = {"kind": RESULT_KIND, "version": RESULT_VERSION, "name": "m", "build_id": "m-0123456789ab",
         "file": entry["file"], "sha256": entry["sha256"], "quant_type": "Q8_0", "timestamp": "2024-01-01T00:00:00Z",
         "checked": True, "passed": passed,
         "device": {"label": label, "machine": "aarch64"}, "tools": {"llama_cpp_build": 11312},
         "slice": {"expected": entry["slice"], "measured": {"kld_mean": kld, "same_top_p": 0.96, "ppl_q": 27.0},
                   "delta": {"kld_mean": kld - 0.003, "same_top_p_points": 0.0}}, "bench": {"tg_tokens_per_s": 9.5},
         **over}
    path = out or folder.parent.parent / f"result-{label}-{kld}.json"
    path.write_text(json.dumps(r))
    return path


def test_collect_adds_replaces_and_is_read_back_by_publish(tmp_path):
    folder, manifest, entry = _folder(tmp_path)
    root = folder.parent
    out, notes = collect([_result(folder, entry), _result(folder, entry, label="laptop")], root)
    assert out == folder / "devices.json" and notes[0].startswith("added pi5's result for m-Q8_0.gguf")
    first = out.read_bytes()
    collect([_result(folder, entry), _result(folder, entry, label="laptop")], root)
    assert out.read_bytes() == first  # the same results again: the same file
    _, notes = collect([_result(folder, entry, kld=0.0032, timestamp="2024-01-02T00:00:00Z")], root)
    assert notes == [f"replaced pi5's result for m-Q8_0.gguf of 2024-01-01T00:00:00Z (pass) from "
                     f"{root.parent / 'result-pi5-0.0032.json'}: pass (2024-01-02T00:00:00Z)"]
    data = json.loads(out.read_text())
    assert data["kind"] == RESULTS_KIND == "ggufpipe-device-check-results"  # what publish reads
    assert [(r["device"]["label"], r["slice"]["measured"]["kld_mean"]) for r in data["results"]] == [
        ("laptop", 0.0031), ("pi5", 0.0032)]
    layout = Layout(root, tmp_path / "work")
    assert [r["device"]["label"] for r in device_results(layout, "m", manifest)] == ["laptop", "pi5"]
    moved = {**manifest, "artifacts": [{**entry, "sha256": "b" * 64}]}  # a rebuild changed the file
    assert device_results(layout, "m", moved) == []
    text = device_check_text({**manifest, "artifacts": [entry]}, device_results(layout, "m", manifest))
    assert "| laptop (aarch64) | `m-Q8_0.gguf` | b11312 | 0.00310 (+0.00010) |" in text
    collect([_result(folder, entry, label="phone", checked=False, slice=None, bench=None, tools=None)], root)
    text = device_check_text({**manifest, "artifacts": [entry]}, device_results(layout, "m", manifest), short=True)
    assert "| phone (aarch64) | `m-Q8_0.gguf` | – | – | – | – | – | verified only |" in text
    # a Jetson's power mode is kept beside its result and shown with it
    jetson = {"label": "orin-nano", "machine": "aarch64", "power_mode": "15W"}
    collect([_result(folder, entry, label="orin-nano", device=jetson)], root)
    text = device_check_text({**manifest, "artifacts": [entry]}, device_results(layout, "m", manifest))
    assert "| orin-nano (aarch64, 15W) | `m-Q8_0.gguf` | b11312 |" in text


@pytest.mark.parametrize("over,what", [
    ({"build_id": "m-ffffffffffff"}, "build_id m-ffffffffffff is not the published build m-0123456789ab"),
    ({"sha256": "c" * 64}, "is not a file the manifest publishes"),
    ({"file": "m-Q2_K.gguf"}, "file m-Q2_K.gguf"),
    ({"kind": "something"}, "not a `ggufpipe device-check --out` result"),
    ({"name": "other"}, "results of several recipes"),
    ({"name": "../m"}, "not a plain recipe name"),
])
def test_collect_refuses_a_result_of_another_build_or_file(tmp_path, over, what):
    folder, _manifest, entry = _folder(tmp_path)
    good, bad = _result(folder, entry), _result(folder, entry, label="x", **over)
    with pytest.raises(PipelineError, match=what.replace("(", r"\(").replace("`", ".")):
        collect([good, bad] if over.get("name") == "other" else [bad], folder.parent)
    assert not (folder / "devices.json").exists()  # nothing written


def test_collect_judges_every_verdict_again(tmp_path):
    """A result edited to a mean KLD of 0.9 (the build box measured 0.003 on the slice) but still saying "pass" is
    stored as FAIL, with the delta and limit the manifest's tolerance gives; an honest FAIL stays FAIL; what a result
    says it expected is replaced by the manifest's slice values."""
    folder, _manifest, entry = _folder(tmp_path)
    edited = _result(folder, entry, kld=0.9, passed=True)
    out, notes = collect([edited], folder.parent)
    assert notes == [f"added pi5's result for m-Q8_0.gguf from {edited}: FAIL (judged again: FAIL, not the result's "
                     "pass (mean KLD 0.90000, Δ +0.89700, limit ±0.00200))"]
    (r,) = json.loads(out.read_text())["results"]
    assert r["passed"] is False and r["slice"]["delta"]["kld_mean"] == 0.897 and r["slice"]["limit"]["kld_mean"] == 0.002
    lying = _result(folder, entry, label="laptop", kld=0.0031, passed=False,
                    slice={"expected": {"kld_mean": 0.5, "same_top_p": 0.5, "ppl_q": 1.0},
                           "measured": {"kld_mean": 0.0031, "same_top_p": 0.96, "ppl_q": 27.0}})
    _, notes = collect([lying], folder.parent)
    assert notes[-1].endswith("pass (judged again: pass, not the result's FAIL (mean KLD 0.00310, Δ +0.00010, "
                              "limit ±0.00200))"), notes
    by_label = {r["device"]["label"]: r for r in json.loads(out.read_text())["results"]}
    assert by_label["laptop"]["passed"] and by_label["laptop"]["slice"]["expected"] == entry["slice"]
    assert by_label["pi5"]["passed"] is False  # the stored FAIL, judged again on the next collect


@pytest.mark.parametrize("over,what", [
    ({"device": "pi5"}, "field device: must be a mapping (label, machine, ...), got str"),
    ({"device": {"label": "evil|pipe <img src=x onerror=alert(1)>\n## injected", "machine": "aarch64"}},
     "field device.label: 'evil|pipe <img src=x onerror=alert(1)>\\n## injected' is not a plain label"),
    ({"device": {"label": "Pi5", "machine": "aarch64"}}, "field device.label: 'Pi5' is not a plain label"),
    ({"device": {"label": "pi5", "machine": "arm|64"}}, "field device.machine: 'arm|64' is not a machine name"),
    ({"device": {"label": "pi5", "machine": "aarch64", "power_mode": "MAXN | <b>"}}, "field device.power_mode"),
    ({"passed": "yes"}, "field passed: must be true or false, got 'yes'"),
    ({"tools": {"llama_cpp_build": "11312 | <b>"}}, "field tools.llama_cpp_build: must be an integer 0..2147483647"),
    ({"bench": {"tg_tokens_per_s": "fast"}}, "field bench.tg_tokens_per_s: must be a number > 0 and <= 10000000 "
                                             "(tokens per second), got 'fast'"),
])
def test_collect_refuses_fields_the_card_would_show_wrong(tmp_path, over, what):
    folder, _manifest, entry = _folder(tmp_path)
    bad = _result(folder, entry, **over)
    with pytest.raises(PipelineError) as exc:
        collect([bad], folder.parent)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{bad}: ") and what in msg, msg
    assert not (folder / "devices.json").exists()


def _speedup(**over):
    return {"pair": "m-Q8_0.gguf + m-draft-Q4_0.gguf", "n_max": 4, "tokens_per_s": [10.0, 11.0, 9.0],
            "baseline_tokens_per_s": [20.0, 20.0, 20.0], "acceptance_rate": 0.4, "speedup": 2.0,
            "interval": [1.8, 2.2], "helps": True, "verdict": "speed-up 2.00x", **over}


def test_collect_computes_the_draft_speed_up_again_from_its_rates(tmp_path):
    """``device-check --draft``'s figures (issue #30 item 3): an edited median and decision ("2.00x, helps") over
    rates that say 0.5x are replaced by what the rates give; the card's cell shows the recomputed figures."""
    folder, manifest, entry = _folder(tmp_path)
    edited = _result(folder, entry, speedup=_speedup())
    out, notes = collect([edited], folder.parent)
    assert notes[0].endswith("pass (draft speed-up judged again from its rates: no speed-up on pi5: measured 0.50x "
                             "(0.45-0.55) at n_max 4)"), notes
    (r,) = json.loads(out.read_text())["results"]
    sp = r["speedup"]
    assert (sp["speedup"], sp["interval"], sp["helps"]) == (0.5, [0.45, 0.55], False)
    text = device_check_text(manifest, [r], short=True)
    assert "| 0.50x (0.45-0.55) with `m-draft-Q4_0.gguf`, n_max 4: no speed-up | pass |" in text


@pytest.mark.parametrize("speedup,what", [
    ({"pair": "m-Q4_K_M.gguf + m-draft-Q4_0.gguf"}, "field speedup.pair: 'm-Q4_K_M.gguf + m-draft-Q4_0.gguf' is not "
                                                     "a pair of m-Q8_0.gguf"),
    ({"pair": "m-Q8_0.gguf + x|<b>.gguf"}, "field speedup.pair: 'm-Q8_0.gguf + x|<b>.gguf' is not a pair of"),
    ({"pair": "m-Q8_0.gguf + m-draft-Q2_K.gguf"}, "field speedup.pair: 'm-Q8_0.gguf + m-draft-Q2_K.gguf' is not a "
                                                   "pair the manifest declares"),
    ({"tokens_per_s": [10.0, "fast", 9.0]}, "field speedup.tokens_per_s[1]: must be a number > 0 and <= 10000000"),
    ({"tokens_per_s": [10.0, 11.0]}, "field speedup.tokens_per_s: must be a list of at least 3 rates"),
    ({"baseline_tokens_per_s": [20.0, 0.0, 20.0]}, "field speedup.baseline_tokens_per_s[1]: must be a number > 0"),
    ({"n_max": "4"}, "field speedup.n_max: must be an integer 1..64 (a draft length), got '4'"),
])
def test_collect_refuses_a_speed_up_the_card_would_show_wrong(tmp_path, speedup, what):
    folder, _manifest, entry = _folder(tmp_path)
    bad = _result(folder, entry, speedup=_speedup(**speedup))
    with pytest.raises(PipelineError) as exc:
        collect([bad], folder.parent)
    assert str(exc.value).startswith(f"{bad}: ") and what in str(exc.value), exc.value
    assert not (folder / "devices.json").exists()


def test_the_device_prompts_are_the_slice_tokens_and_the_pair_must_be_declared(tmp_path):
    from pipeline.devices.check_draft import find_pair, slice_prompts

    tokens, *_ = _logits_file(tmp_path / "slice.logits", n_ctx=16, n_chunk=3)
    assert slice_prompts(tmp_path / "slice.logits", 2, 10) == [tokens[:10], tokens[16:26]]
    assert slice_prompts(tmp_path / "slice.logits", 5, 40) == [tokens[:16], tokens[16:32], tokens[32:48]]
    (tmp_path / "x.logits").write_bytes(b"not logits" * 4)
    with pytest.raises(PipelineError, match="not a llama-perplexity --kl-divergence-base file"):
        slice_prompts(tmp_path / "x.logits", 1, 10)
    _, manifest, _ = _folder(tmp_path)
    assert find_pair(tmp_path, manifest, "m-Q8_0.gguf", "m-draft-Q4_0.gguf")["acceptance"]["best_n_max"] == 4
    with pytest.raises(PipelineError, match=r"m-Q8_0.gguf \+ m-draft-Q8_0.gguf is not a pair the build declares "
                                            r"\(draft.pairs: m-Q8_0.gguf \+ m-draft-Q4_0.gguf\)"):
        find_pair(tmp_path, manifest, "m-Q8_0.gguf", "m-draft-Q8_0.gguf")
    with pytest.raises(PipelineError, match="no draft section"):
        find_pair(tmp_path, {**manifest, "draft": None}, "m-Q8_0.gguf", None)
    # --mtp: the heads inside the file draft for it, a pair whose draft is the main file
    mtp = {"pairs": [{"main": "m-Q8_0.gguf", "draft": "m-Q8_0.gguf", "compatible": True,
                      "acceptance": {"best_n_max": 2, "spec_type": "draft-mtp"}}], "mtp": True, "spec_type": "draft-mtp"}
    assert find_pair(tmp_path, {**manifest, "draft": mtp}, "m-Q8_0.gguf", None)["acceptance"]["best_n_max"] == 2
    with pytest.raises(PipelineError, match=r"m-Q8_0.gguf \+ m-Q8_0.gguf is not a pair the build declares"):
        find_pair(tmp_path, manifest, "m-Q8_0.gguf", None)  # --mtp on a build whose draft is another file


def test_device_labels_are_plain():
    from pipeline.devices.check import LABEL_RE, device_label
    from pipeline.recipe.devices import DEVICE_NAME_RE

    assert LABEL_RE.pattern == DEVICE_NAME_RE.pattern  # the device install's copy of the recipe rule
    assert device_label("pi5-8g") == "pi5-8g" and LABEL_RE.match(device_label(None))
    with pytest.raises(PipelineError, match=r"^--device 'evil\|pipe': a device label is a-z 0-9"):
        device_label("evil|pipe")


def test_summary_names_the_verdict_and_the_limits():
    r = {"checked": True, "passed": False, "file": "m-Q4_K_M.gguf", "device": {"label": "pi5"}, "threads": 4,
         "tools": {"llama_cpp_build": 11312}, "bench": None,
         "slice": {"expected": {"kld_mean": 0.0785}, "measured": {"kld_mean": 0.09, "same_top_p": 0.83},
                   "delta": {"kld_mean": 0.0115, "same_top_p_points": -0.3},
                   "limit": {"kld_mean": 0.00785, "same_top_p_points": 1.0}}}
    line = summary(r)
    assert line.startswith("FAIL  m-Q4_K_M.gguf on pi5 (llama.cpp b11312, 4 threads): mean KLD 0.090000")
    assert "Δ +0.011500, limit ±0.007850" in line and "\n" not in line


def test_kld_statistics_and_chunk_rows_agree_on_the_last_chunk():
    """The last row of a run is its final statistics (the same accumulators): shown on llama-perplexity's real output
    format, statistics written as perplexity.cpp prints them."""
    stats = ROWS + """\
Mean PPL(Q)                   :  34.134700 ±   4.604500
Mean PPL(base)                :  30.610000 ±   4.100000
Cor(ln(PPL(Q)), ln(PPL(base))):  98.00%
Mean ln(PPL(Q)/PPL(base))     :   0.109300 ±   0.019860
Mean PPL(Q)/PPL(base)         :   1.115500 ±   0.022150
Mean PPL(Q)-PPL(base)         :   3.524700 ±   0.700000
====== KL divergence statistics ======
Mean    KLD:   0.082510 ±   0.003350
Maximum KLD:   3.000000
99.9%   KLD:   2.000000
99.0%   KLD:   1.000000
95.0%   KLD:   0.300000
Median  KLD:   0.040000
Minimum KLD:   0.000010
====== Token probability statistics ======
RMS Δp    :  5.734 ± 0.465 %
Same top p: 80.980 ± 1.740 %
"""
    last, final = parse_chunk_rows(stats)[-1], parse_kld_statistics(stats)
    assert all(last[k] == pytest.approx(final[k], abs=1e-5) for k in ("kld_mean", "same_top_p", "ppl_q", "rms_dp"))


def test_the_dvc_matrix_tracks_the_slice_of_a_recipe_that_publishes_one(tmp_path):
    from pipeline.distribution.dvc import matrix

    with_slice, without = load_recipe(_recipe(tmp_path)), load_recipe(_recipe(tmp_path, device_slice=0))
    assert matrix([with_slice], tmp_path)["ggufs"]["m-device-slice"] == {"name": "m", "file": SLICE_FILE}
    assert "m-device-slice" not in matrix([without], tmp_path)["ggufs"]
