"""Measured mixes in what the publish stage produces (issue #19 part 2), on synthetic records shaped like a real
smoke run's: the manifest's ``mix`` entry and ``sensitivity`` section, the volatile cost, the published map, the
Pareto front and mix markers of report.svg, the sensitivity heat map, the report section, the card's two lines per
mix, ``verify`` of a map, the Hub's list of mix files and rebuild-check's rows. No llama.cpp, no torch."""

from __future__ import annotations

import copy
import hashlib
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.errors import ArtifactError, PipelineError
from pipeline.layout import Layout
from pipeline.stages.card import card_text
from pipeline.stages.publish import SCHEMA_VERSION, publish_maps, strip_volatile
from pipeline.stages.publish_sections import mix_entry, sensitivity_section, strip_sensitivity_cost
from pipeline.stages.report import render_plot, write_report
from pipeline.stages.report_mix import (
    added_kld,
    card_mix_lines,
    goal_text,
    mixes_markdown,
    pareto_front,
    render_heatmap,
)

NS = "{http://www.w3.org/2000/svg}"
NAME = "tiny"
MAP_TEXT = "^token_embd\\.weight$=q8_0\n^blk\\.0\\.attn_k\\.weight$=q8_0\n^blk\\.0\\.attn_v\\.weight$=q4_k\n"
MAP_SHA = hashlib.sha256(MAP_TEXT.encode()).hexdigest()
SENS_SHA = "5" * 64
KEY = "Q4_K_M_MIX"
MAP_FILE = f"{NAME}-{KEY}.tensor-types.txt"


def _group(group, role, band, added):
    """A sensitivity group as the stage writes it: bytes and per-candidate figures, ``added`` over the floor at Q4_0."""
    kld = {c: {"kld_mean": round(0.0037 + a, 6), "kld_p99": 0.02, "same_top_p": 0.97, "ppl_ratio": 1.0}
           for c, a in (("Q4_0", added), ("Q4_K", added / 3), ("Q6_K", 0.0))}
    return {"group": group, "role": role, "band": band, "tensors": [f"{group}.weight"],
            "bytes": {"Q8_0": 3525120, "Q4_0": 1866240, "Q4_K": 2280960, "Q6_K": 3525120}, "kld": kld}


def sensitivity_file() -> dict:
    groups = [_group(f"attn_k.{lo}-{hi}", "attn_k", [lo, hi], a) for (lo, hi), a in (((0, 14), 0.01), ((15, 29), 0.002))]
    groups += [_group(f"attn_v.{lo}-{hi}", "attn_v", [lo, hi], a) for (lo, hi), a in (((0, 14), 0.08), ((15, 29), 0.03))]
    groups += [_group("output", "output", None, 0.05), _group("token_embd", "token_embd", None, 0.1)]
    return {"version": 1, "flavour": "plain", "base": {"file": "tiny-F16.gguf", "sha256": "b" * 64},
            "reference": {"file": "tiny-F16.gguf", "sha256": "b" * 64}, "imatrix_sha256": None,
            "text": "botchan-calib.txt", "text_sha256": "c" * 64, "ctx": 512, "chunks": 4, "threads": 2, "floor": "Q8_0",
            "candidates": ["Q4_0", "Q4_K", "Q6_K"], "bands": [[0, 14], [15, 29]], "tensors": {}, "kept_bytes": 140544,
            "n_weights": 134515008, "floor_kld": {"kld_mean": 0.0037, "kld_p99": 0.0165, "same_top_p": 0.976,
                                                  "ppl_ratio": 0.995},
            "groups": groups}


def sensitivity_record(**over) -> dict:
    rec = {"flavour": "plain", "search": "exhaustive", "groups": 6, "candidates": 3, "n_layers": 30,
           "measurements": 19, "exhaustive_runs": 12, "runs": 12, "reused": 0, "skipped": 7, "duplicates": 0,
           "screens": 0, "imatrix_passes": 0, "quantize_seconds": 33.0, "eval_seconds": 68.0, "screen_seconds": 0.0, "cpu_seconds": 101.5,
           "seconds": 106.0, "sensitivity_sha256": SENS_SHA}
    rec.update(over)
    return rec


def layout_record(**goal) -> dict:
    goal = goal or {"budget": {"size_of": "Q4_K_M"}, "bytes": 105454272}
    return {"solver": "mckp-dp 1", "label": KEY, "type": "Q4_K_M", "flavour": "plain", **goal,
            "candidates": ["Q4_0", "Q4_K", "Q6_K"], "floor": "Q8_0",
            "grouping": {"bands": [[0, 14], [15, 29]], "roles": ["attn_k", "attn_v", "output", "token_embd"], "groups": 6},
            "sensitivity": {"sha256": SENS_SHA, "text": "botchan-calib.txt", "text_sha256": "c" * 64, "ctx": 512,
                            "chunks": 4, "floor_kld_mean": 0.0037},
            "choice": {"attn_k.0-14": "Q8_0", "attn_v.0-14": "Q4_K", "token_embd": "Q8_0"},
            "predicted": {"bytes": 104168640, "bpw": 6.089, "kld_mean": 0.030099},
            "histogram": {"F32": 61, "Q4_K": 30, "Q8_0": 61}, "map_sha256": MAP_SHA}


def quant_record(**goal) -> dict:
    return {"quant": {"type": "Q4_K_M", "variant": "MIX", "mix": {"budget": {"size_of": "Q4_K_M"}}},
            "tensor_types_file": {"file": MAP_FILE, "sha256": MAP_SHA}, "mix": layout_record(**goal)}


def entry(file, qtype, size_mib, kld, **extra) -> dict:
    e = {"file": f"{NAME}-{file}.gguf", "quant_type": qtype, "sha256": "0" * 64, "size_bytes": int(size_mib * 2**20),
         "bits_per_weight": 4.5, "role": "quant", "requested": {"type": qtype},
         "metrics": {"botchan": {"kld_mean": kld, "ppl_q": 10.5, "ppl_ratio": 1.02, "kld_p99": 0.1, "same_top_p": 0.9}}}
    e.update(extra)
    return e


def manifest() -> dict:
    """A published manifest with stock quants, a mix, a dominated stock quant and a failed one."""
    sens = {"plain": {"sha256": SENS_SHA, "text": "botchan-calib.txt", "text_sha256": "c" * 64, "ctx": 512, "chunks": 4,
                      "floor": "Q8_0", "candidates": ["Q4_0", "Q4_K", "Q6_K"], "bands": [[0, 14], [15, 29]],
                      "floor_kld_mean": 0.0037,
                      "groups": [{"group": g["group"], "role": g["role"], "band": g["band"], "bytes": g["bytes"],
                                  "kld_mean": {c: v["kld_mean"] for c, v in g["kld"].items()}}
                                 for g in sensitivity_file()["groups"]],
                      "cost": {k: v for k, v in sensitivity_record().items() if k not in ("flavour", "groups",
                                                                                       "candidates", "n_layers",
                                                                                       "sensitivity_sha256")}}}
    mix = entry(KEY, "Q4_K_M", 99.3, 0.021, mix=mix_entry(quant_record()), label=KEY)
    mix["size_bytes"] = 104168640
    return {"schema_version": SCHEMA_VERSION, "name": NAME, "build_id": f"{NAME}-0123456789ab",
            "source": {"repo": "org/Tiny", "commit": "c" * 40},
            "tools": {"llama_cpp_build": 11312, "llama_cpp_commit": "0c1e570"}, "gguf_metadata": {},
            "base_quant_type": "F16",
            "eval_sets": [{"name": "botchan", "text": "botchan.txt", "text_sha256": "d" * 64, "ctx": 512, "chunks": 16,
                           "scored_tokens": 8000}], "eval_base": {"botchan": {"ppl": 10.2}},
            "artifacts": [entry("F16", "F16", 258, 0.0, role="base", metrics=None),
                          entry("Q8_0", "Q8_0", 138, 0.002), entry("Q4_K_M", "Q4_K_M", 101, 0.03),
                          entry("Q4_0", "Q4_0", 102, 0.05), mix],
            "rejected": [entry("Q2_K", "Q2_K", 60, 0.9, failures=[])], "sensitivity": sens,
            "build": {"timestamp": "2026-01-01T00:00:00Z"}}


# ----------------------------------------------------------------------------------------------- manifest


def test_mix_entry_from_quant_record():
    m = mix_entry(quant_record())
    assert m == {"solver": "mckp-dp 1", "flavour": "plain", "goal": {"budget": {"size_of": "Q4_K_M"}, "bytes": 105454272},
                 "candidates": ["Q4_0", "Q4_K", "Q6_K"], "floor": "Q8_0",
                 "choice": {"attn_k.0-14": "Q8_0", "attn_v.0-14": "Q4_K", "token_embd": "Q8_0"},
                 "predicted": {"bytes": 104168640, "bpw": 6.089, "kld_mean": 0.030099},
                 "sensitivity": {"sha256": SENS_SHA, "text": "botchan-calib.txt", "text_sha256": "c" * 64, "ctx": 512,
                                 "chunks": 4},
                 "map": {"file": MAP_FILE, "sha256": MAP_SHA}}
    t = mix_entry(quant_record(target={"max_kld_mean": 0.02}))
    assert t["goal"] == {"target": {"max_kld_mean": 0.02}}
    bad = quant_record()
    bad["tensor_types_file"]["sha256"] = "f" * 64
    with pytest.raises(PipelineError, match="re-run the quantize stage"):
        mix_entry(bad)


def _work(tmp_path) -> tuple[Layout, SimpleNamespace]:
    L = Layout(tmp_path / "artifacts", tmp_path / "work")
    sens = L.sensitivity(NAME, "plain")
    sens.parent.mkdir(parents=True)
    sens.write_text(json.dumps(sensitivity_file()))
    digest = hashlib.sha256(sens.read_bytes()).hexdigest()
    L.sensitivity_record(NAME, "plain").parent.mkdir(parents=True)
    L.sensitivity_record(NAME, "plain").write_text(json.dumps(sensitivity_record(sensitivity_sha256=digest)))
    L.mix_map(NAME, KEY).write_text(MAP_TEXT)
    return L, SimpleNamespace(name=NAME, mix_flavours=["plain"])


def test_sensitivity_section_and_volatile_cost(tmp_path):
    L, recipe = _work(tmp_path)
    s = sensitivity_section(recipe, L)["plain"]
    assert s["sha256"] == hashlib.sha256(L.sensitivity(NAME, "plain").read_bytes()).hexdigest()
    assert {k: s[k] for k in ("text", "ctx", "chunks", "floor", "candidates", "bands", "floor_kld_mean")} == {
        "text": "botchan-calib.txt", "ctx": 512, "chunks": 4, "floor": "Q8_0", "candidates": ["Q4_0", "Q4_K", "Q6_K"],
        "bands": [[0, 14], [15, 29]], "floor_kld_mean": 0.0037}
    assert s["groups"][0] == {"group": "attn_k.0-14", "role": "attn_k", "band": [0, 14],
                              "bytes": {"Q8_0": 3525120, "Q4_0": 1866240, "Q4_K": 2280960, "Q6_K": 3525120},
                              "kld_mean": {"Q4_0": 0.0137, "Q4_K": 0.007033, "Q6_K": 0.0037}}
    assert s["cost"] == {"search": "exhaustive", "measurements": 19, "exhaustive_runs": 12, "runs": 12, "reused": 0,
                         "skipped": 7, "duplicates": 0, "screens": 0, "imatrix_passes": 0, "seconds": 106.0,
                         "quantize_seconds": 33.0, "eval_seconds": 68.0, "screen_seconds": 0.0,
                         "cpu_seconds": 101.5}
    assert sensitivity_section(SimpleNamespace(name=NAME, mix_flavours=[]), L) == {}  # no mixes: no section
    # a warm cache (reused measurements) and other seconds: the same manifest once the volatile figures are stripped
    m = manifest()
    warm = copy.deepcopy(m)
    warm["sensitivity"]["plain"]["cost"].update(runs=0, reused=12, seconds=3.2, quantize_seconds=0.0, eval_seconds=1.0)
    warm["build"]["timestamp"] = "2027-01-01T00:00:00Z"
    assert strip_volatile(warm) == strip_volatile(m) and "build" not in strip_volatile(m)
    assert strip_volatile(m)["sensitivity"]["plain"]["cost"] == {"search": "exhaustive", "measurements": 19,
                                                                "exhaustive_runs": 12, "skipped": 7, "duplicates": 0}
    other = copy.deepcopy(m)
    other["sensitivity"]["plain"]["cost"]["measurements"] = 20  # not volatile
    assert strip_volatile(other) != strip_volatile(m)
    assert strip_sensitivity_cost({}) == {}
    # the record of another measurement is refused
    L.sensitivity_record(NAME, "plain").write_text(json.dumps(sensitivity_record()))
    with pytest.raises(PipelineError, match="re-run the sensitivity stage"):
        sensitivity_section(recipe, L)


def test_stock_manifest_unchanged():
    """Without mixes nothing new: strip_volatile only drops build; the schema is 13 (#33: KV cache types)."""
    m = {k: v for k, v in manifest().items() if k != "sensitivity"}
    m["artifacts"] = [e for e in m["artifacts"] if "mix" not in e]
    assert SCHEMA_VERSION == 13
    assert strip_volatile(m) == {k: v for k, v in m.items() if k != "build"}


def test_publish_maps(tmp_path):
    L, _ = _work(tmp_path)
    m = manifest()
    assert publish_maps(L, NAME, m) == {MAP_FILE}
    assert (L.art_dir(NAME) / MAP_FILE).read_text() == MAP_TEXT
    assert publish_maps(L, NAME, m) == {MAP_FILE}  # again: unchanged
    L.mix_map(NAME, KEY).unlink()
    L.mix_map(NAME, KEY).write_text(MAP_TEXT + "^output\\.weight$=q8_0\n")  # re-solved since the quantize
    with pytest.raises(ArtifactError, match="re-run the solve and quantize stages") as exc:
        publish_maps(L, NAME, m)
    assert exc.value.path == L.mix_map(NAME, KEY)


# ----------------------------------------------------------------------------------------------- report


def test_pareto_front():
    pts = [(100, 0.03), (101, 0.05), (138, 0.002), (99, 0.021), (60, 0.9), (99, 0.021), (120, 0.002)]
    front = pareto_front(pts)
    assert front == [4, 3, 5, 6]  # size order; (101, .05), (100, .03) and (138, .002) dominated; equal points both kept
    assert pareto_front([]) == [] and pareto_front([(1, 1)]) == [0]
    assert pareto_front([(1, 2), (1, 1)]) == [1]  # same size, closer: the farther one is dominated


def test_plot_mixes_and_front():
    m = manifest()
    text = render_plot(m)
    assert text == render_plot(m)
    svg = ET.fromstring(text)
    diamonds = [p for p in svg.iter(NS + "path") if p.get("d", "").endswith("Z") and p.get("fill") != "#fff"]
    assert len(diamonds) == 1  # the mix (the legend's diamond is white)
    texts = ["".join(t.itertext()) for t in svg.iter(NS + "text")]
    assert {KEY, "Q4_K_M", "Q4_0", "Pareto front", "measured mix"} <= set(texts)
    (front,) = list(svg.iter(NS + "polyline"))
    assert len(front.get("points").split()) == 2  # the mix and Q8_0; Q4_K_M, Q4_0 dominated; Q2_K failed
    stock = copy.deepcopy(m)
    stock["artifacts"] = [e for e in stock["artifacts"] if "mix" not in e]
    assert "measured mix" not in render_plot(stock)


def test_heatmap_svg():
    sec = manifest()["sensitivity"]["plain"]
    text = render_heatmap(NAME, "plain", sec)
    assert text == render_heatmap(NAME, "plain", copy.deepcopy(sec))
    svg = ET.fromstring(text)
    cells = [r for r in svg.iter(NS + "rect") if r.find(NS + "title") is not None]
    assert len(cells) == len(sec["groups"]) == 6  # one cell per group
    titles = sorted("".join(r.find(NS + "title").itertext()) for r in cells)
    assert titles[0].startswith("attn_k.0-14 at Q4_0: +0.01")
    texts = ["".join(t.itertext()) for t in svg.iter(NS + "text")]
    assert {"attn_k", "attn_v", "output", "token_embd", "layers 0-14", "layers 15-29", "added KLD (log)"} <= set(texts)
    # a non-block group spans every band; block rows one band each
    widths = {"".join(r.find(NS + "title").itertext()).split()[0]: float(r.get("width")) for r in cells}
    assert widths["token_embd"] == 2 * widths["attn_k.0-14"]
    # the colour follows the added KLD: the most sensitive group is the lightest
    fills = {"".join(r.find(NS + "title").itertext()).split()[0]: r.get("fill") for r in cells}
    assert fills["token_embd"] != fills["attn_k.15-29"]
    assert added_kld(sec["groups"][0], sec) == ("Q4_0", pytest.approx(0.01))


def test_report_section_and_heatmap_files(tmp_path):
    m = manifest()
    md = mixes_markdown(m)
    row = next(ln for ln in md.splitlines() if KEY in ln)
    assert "the size of Q4_K_M (105454272 bytes)" in row and "104168640" in row and "0.03010" in row and "0.02100" in row
    assert "measured mean KLD (botchan)" in md and "`botchan-calib.txt` (ctx 512 × 4 chunks)" in md
    assert "19 measurements" in md and "106.0 s" in md and "[sensitivity-plain.svg](sensitivity-plain.svg)" in md
    (tmp_path / "sensitivity-awq.svg").write_text("<svg/>")  # a flavour no longer measured
    write_report(m, tmp_path / "report.md", tmp_path / "report.svg")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md", "report.svg", "sensitivity-plain.svg"]
    assert "## Measured mixes" in (tmp_path / "report.md").read_text()
    assert mixes_markdown({"name": NAME, "artifacts": [], "rejected": []}) == ""
    assert goal_text({"goal": {"target": {"max_kld_mean": 0.02}}}) == "mean KLD ≤ 0.02"
    assert goal_text({"goal": {"budget": {"bpw": 4.0}, "bytes": 7}}) == "4 bits per weight (7 bytes)"


# ----------------------------------------------------------------------------------------------- card, files out


def test_card_two_lines_per_mix():
    m = manifest()
    lines = card_mix_lines(m)
    assert len(lines) == 2
    assert lines[0].startswith(f"- `{NAME}-{KEY}.gguf`: per-tensor types solved from measured sensitivity for the size "
                               "of Q4_K_M (105454272 bytes)")
    assert lines[1] == f"  Reproduce: `llama-quantize --tensor-type-file {MAP_FILE} {NAME}-F16.gguf out.gguf Q4_K_M`"
    text = card_text({**m, "hub": {}})
    assert "## Measured mixes" in text and lines[1] in text
    stock = copy.deepcopy(m)
    stock["artifacts"] = [e for e in stock["artifacts"] if "mix" not in e]
    assert "Measured mixes" not in card_text(stock)


def test_verify_map_and_hub_files(tmp_path):
    from pipeline.distribution.verify import verify
    from pipeline.stages.hubfiles import mix_files

    m = manifest()
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    (tmp_path / MAP_FILE).write_text(MAP_TEXT)
    assert verify(tmp_path / MAP_FILE).startswith(f"OK  {tmp_path / MAP_FILE} (tensor-type map of {NAME}-{KEY}.gguf")
    (tmp_path / MAP_FILE).write_text(MAP_TEXT + "\n")
    with pytest.raises(ArtifactError, match="file altered") as exc:
        verify(tmp_path / MAP_FILE)
    assert exc.value.path == tmp_path / MAP_FILE
    assert mix_files(m) == [(MAP_FILE, "tensor-types", MAP_SHA), ("sensitivity-plain.svg", "heatmap", None)]
    assert mix_files({"artifacts": [], "name": NAME}) == []


def test_rebuild_rows(tmp_path):
    from pipeline.distribution.rebuild import _mix_rows

    L, _ = _work(tmp_path)
    m = manifest()
    m["sensitivity"]["plain"]["sha256"] = hashlib.sha256(L.sensitivity(NAME, "plain").read_bytes()).hexdigest()
    rows = _mix_rows(m["artifacts"] + m["rejected"], m, NAME, L)
    assert [(r.artifact, r.match) for r in rows] == [(MAP_FILE, True), ("sensitivity-plain.json", True)]
    assert _mix_rows(m["artifacts"][:2], m, NAME, L) == []  # --only stock files: no mix rows
    L.mix_map(NAME, KEY).unlink()
    assert not _mix_rows(m["artifacts"], m, NAME, L)[0].match


def test_docs_name_the_fields():
    docs = Path(__file__).resolve().parents[2] / "docs"
    text = (docs / "publishing.md").read_text() + (docs / "reproducibility.md").read_text()
    for field in ("tensor-types.txt", "sensitivity-<flavour>.svg", "`mix`", "`sensitivity`", "| `schema_version` | 13 "):
        assert field in text, field
