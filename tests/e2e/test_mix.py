"""Measured mixes end to end with the real tools (issue #19 part 2, docs/mixes.md), on the tiny generated Llama of
tests/conftest.py (2 layers, widths 256 and 512: no shape fallback): the Snakemake build measures the sensitivity
(the screened search of issue #32; the exhaustive one's rule for duplicates: tests/unit/test_mix_screen.py), solves
the map and writes the mix as planned; a budget-only change re-solves and re-quantizes without measuring
again (the job list); the stages run again in another folder give the same sensitivity, map and GGUF, byte for byte.
The shape fallback of a mix's candidates on the demo's widths is read from llama-quantize's dry run."""

from __future__ import annotations

import json
import re

import pytest
from helpers import BOTCHAN, CALIB, TINY_COMMIT, TINY_REPO, snakemake

from pipeline.fsutil import sha256_file
from pipeline.gguf.reader import read_header
from pipeline.recipe import load_recipe
from pipeline.recipe.tensor_map import read_map

NAME = "tiny-mix"
KEY = "Q4_K_M_MIX"


def _recipe(folder, budget: str):
    p = folder / f"{NAME}.yaml"
    p.write_text(f"""\
name: {NAME}
source: {{repo: {TINY_REPO}, revision: "{TINY_COMMIT}"}}
bench: false
conformance: false
quants:
  - Q4_K_M
  - {{type: mix, label: {KEY}, budget: {budget}, candidates: [Q4_K, Q6_K]}}
sensitivity: {{text: {CALIB}, ctx: 128, chunks: 2, bands: 2, search: screened}}
gates:
  - {{name: botchan, text: {BOTCHAN}, ctx: 256, chunks: 17, max_ppl_ratio: 100,
     max_kld_mean: 100, max_kld_p99: 100, min_same_top_p: 0}}
""")
    return p


@pytest.fixture(scope="module")
def mix_build(tmp_path_factory, tiny_hub):
    hub, _ = tiny_hub
    folder = tmp_path_factory.mktemp("mix-build")
    recipe = _recipe(folder, "{size_of: Q4_K_M}")
    res = snakemake(folder, recipe, hub=hub)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return folder, recipe


def test_mix_is_written_as_solved(mix_build):
    folder, _ = mix_build
    work = folder / "work" / NAME
    layout = json.loads((work / "mix" / f"{KEY}.layout.json").read_text())
    sens = json.loads((work / "mix" / "sensitivity-plain.json").read_text())
    gguf = work / "quants" / f"{NAME}-{KEY}.gguf"
    written = {t.name: t.type_name for t in read_header(gguf).tensors}
    entries = read_map(work / "mix" / f"{NAME}-{KEY}.tensor-types.txt")
    assert len(entries) == len(sens["tensors"]) == sum(len(g["tensors"]) for g in sens["groups"])
    for pattern, qtype, _ in entries:
        name = pattern[1:-1].replace("\\.", ".")
        assert written[name] == qtype  # widths 256 / 512: every candidate is written as asked
    stock = work / "quants" / f"{NAME}-Q4_K_M.gguf"
    assert gguf.stat().st_size == layout["predicted"]["bytes"] <= layout["bytes"] == stock.stat().st_size
    rec = json.loads((work / "records" / f"quant-{KEY}.json").read_text())
    assert rec["tensor_types"]["bytes"]["written"] == layout["predicted"]["bytes"]
    # published: the map beside the GGUF (SHA256 in the manifest), the heat map, the report's section
    art = folder / "artifacts" / NAME
    manifest = json.loads((art / "manifest.json").read_text())
    entry = next(e for e in manifest["artifacts"] if e["file"] == f"{NAME}-{KEY}.gguf")
    assert entry["mix"]["map"]["sha256"] == sha256_file(art / entry["mix"]["map"]["file"])
    assert entry["mix"]["predicted"]["bytes"] == entry["size_bytes"] and entry["mix"]["choice"] == layout["choice"]
    assert set(manifest["sensitivity"]) == {"plain"} and (art / "sensitivity-plain.svg").is_file()
    assert "Measured mixes" in (art / "report.md").read_text()
    cost = json.loads((work / "records" / "sensitivity-plain.json").read_text())
    # 7 roles x 2 bands + token_embd, 2 candidates, and the floor; no fallback at these widths: no duplicate
    assert (cost["groups"], cost["candidates"], cost["measurements"], cost["exhaustive_runs"]) == (15, 2, 31, 31)
    # screened: the floor and each role whole (its two bands), token_embd alone, each at its anchor; a fifth of 31
    # leaves no cut; the rest predicted from the screen (one llama-imatrix pass, one quantize per type)
    assert (cost["search"], cost["runs"], cost["imatrix_passes"], cost["screens"]) == ("screened", 9, 1, 3)
    assert [len(s["groups"]) for s in sens["segments"]] == [2] * 7 + [1]
    assert sens["probes"] == []  # no evaluation left for a type probe either
    sources = [k["source"] for g in sens["groups"] for k in g["kld"].values()]
    assert sources.count("measured") == 1 and sources.count("screened") == 29
    assert manifest["sensitivity"]["plain"]["search"] == "screened" and manifest["sensitivity"]["plain"]["segments"]


def test_budget_change_resolves_without_measuring(mix_build, tiny_hub):
    folder, recipe = mix_build
    hub, _ = tiny_hub
    _recipe(folder, "{bpw: 5.5}")  # the same recipe file, another budget
    try:
        res = snakemake(folder, recipe, hub=hub, extra=["--dry-run", "--quiet", "rules"])
    finally:
        _recipe(folder, "{size_of: Q4_K_M}")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-2000:]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)\s*$", out, re.M))
    assert {"solve", "quantize", "eval", "publish", "gate"} <= set(counts), out
    assert counts["quantize"] == "1" and counts["eval"] == "1", out
    assert not {"sensitivity", "eval_base", "convert", "fetch"} & set(counts), out


def test_rebuild_gives_the_same_sensitivity_map_and_gguf(mix_build, tmp_path, toolchain, quantize_exe):
    from pipeline.stages.mix.sensitivity import sensitivity
    from pipeline.stages.mix.solve import solve
    from pipeline.stages.quantize import quantize

    folder, recipe_path = mix_build
    work = folder / "work" / NAME
    r = load_recipe(recipe_path, quantize_exe)
    base = work / "quants" / f"{NAME}-F16.gguf"
    sens = tmp_path / "sens.json"
    sensitivity(r, "plain", base, base, sens, tmp_path / "rec.json", tmp_path / "scratch", threads=2,
                log=tmp_path / "log", tc=toolchain)
    assert sha256_file(sens) == sha256_file(work / "mix" / "sensitivity-plain.json")
    mp, lay = tmp_path / "map.txt", tmp_path / "layout.json"
    solve(r, KEY, sens, base, mp, lay, log=tmp_path / "log", tc=toolchain)
    assert mp.read_bytes() == (work / "mix" / f"{NAME}-{KEY}.tensor-types.txt").read_bytes()
    out = tmp_path / "mix.gguf"
    quantize(r, KEY, base, out, tmp_path / "q.json", log=tmp_path / "log", threads=2, tc=toolchain, mix=(mp, lay))
    assert sha256_file(out) == sha256_file(work / "quants" / f"{NAME}-{KEY}.gguf")


def test_fisher_search_through_the_stage_and_a_swapped_checkpoint_refused(mix_build, tmp_path, toolchain,
                                                                         quantize_exe):
    """``search: fisher`` on the tiny build's F16 and the checkpoint it was converted from (the real converter's q/k
    rows): one Fisher pass, no llama-imatrix pass; the floor and each role whole measured (a fifth of 31 less the
    three the pass counts as leaves no probe); every group of a role that measured over the floor predicted worse
    at Q4_K than at Q6_K. The same checkpoint with two blocks' up_proj swapped is refused, naming a weight, before
    any evaluation."""
    from safetensors.numpy import load_file, save_file

    from pipeline.errors import PipelineError
    from pipeline.stages.mix.sensitivity import sensitivity

    folder, recipe_path = mix_build
    work = folder / "work" / NAME
    recipe = tmp_path / f"{NAME}.yaml"
    recipe.write_text(recipe_path.read_text().replace("search: screened", "search: fisher"))
    r = load_recipe(recipe, quantize_exe)
    base = work / "quants" / f"{NAME}-F16.gguf"
    sens = sensitivity(r, "plain", base, base, tmp_path / "sens.json", tmp_path / "rec.json", tmp_path / "scratch",
                       threads=2, log=tmp_path / "log", tc=toolchain, hf=work / "hf")
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert (rec["search"], rec["fisher_passes"], rec["imatrix_passes"], rec["runs"], rec["screens"]) == \
        ("fisher", 1, 0, 9, 3)
    assert rec["fisher_seconds"] > 0 and sens["probes"] == []
    assert [len(s["groups"]) for s in sens["segments"]] == [2] * 7 + [1]
    scale = {gr: s["scale"] for s in sens["segments"] for gr in s["groups"]}
    assert sum(v > 0 for v in scale.values()) >= 10  # random weights: a role may measure under the floor (scale 0)
    for g in sens["groups"]:
        q4, q6 = g["kld"]["Q4_K"]["kld_mean"], g["kld"]["Q6_K"]["kld_mean"]
        assert (q4 > q6 if scale[g["group"]] > 0 else q4 == q6) and q6 >= sens["floor_kld"]["kld_mean"], g["group"]

    swapped = tmp_path / "hf-swapped"
    swapped.mkdir()
    for f in (work / "hf").iterdir():
        (swapped / f.name).write_bytes(f.read_bytes())
    (st,) = swapped.glob("*.safetensors")
    w = load_file(st)
    a, b = "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight"
    w[a], w[b] = w[b], w[a]
    save_file(w, st, metadata={"format": "pt"})
    with pytest.raises(PipelineError, match=r"up_proj.weight does not equal the base GGUF's tensor of that name"):
        sensitivity(r, "plain", base, base, tmp_path / "s2.json", tmp_path / "r2.json", tmp_path / "scratch2",
                    threads=2, log=tmp_path / "log", tc=toolchain, hf=swapped)
    assert not any((tmp_path / "scratch2" / "runs").iterdir()) and not (tmp_path / "s2.json").exists()


def test_candidates_fall_back_on_the_demos_widths(tmp_path, toolchain):
    """576-wide rows: Q4_K is written Q5_0 and Q6_K as Q8_0 (the floor), which the sensitivity then does not
    measure twice; ffn_down (1536 wide) takes both as asked."""
    from helpers.gguf_factory import tiny_llama

    from pipeline.stages.mix.sensitivity import written_types

    base = tiny_llama(tmp_path / "tiny-F16.gguf", toolchain.root / "vocab" / "ggml-vocab-llama-spm.gguf", n_layer=1,
                      n_embd=576, n_head=9, n_head_kv=3, n_ff=1536, dtype="F16")
    names = ["blk.0.attn_q.weight", "blk.0.ffn_down.weight"]
    assert written_types(toolchain, base, names, "Q4_K", None, tmp_path, None, "t") == {
        "blk.0.attn_q.weight": "Q5_0", "blk.0.ffn_down.weight": "Q4_K"}
    assert written_types(toolchain, base, names, "Q6_K", None, tmp_path, None, "t") == {
        "blk.0.attn_q.weight": "Q8_0", "blk.0.ffn_down.weight": "Q6_K"}
