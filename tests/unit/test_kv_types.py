"""KV cache types (issue #33 item 2): ``gates[].kv_types`` parsed with one-line refusals, a head size the type's block
does not divide refused before anything runs, ``kv_type: auto`` resolved to the smallest type inside every published
quant's thresholds, and the report's table and plot. No llama.cpp tools (the runs themselves: tests/e2e)."""

from __future__ import annotations

import pytest
import yaml
from helpers import BOTCHAN, recipe_error

from pipeline.errors import PipelineError
from pipeline.recipe import load_recipe
from pipeline.stages.evaluate import check_kv_types, kv_args
from pipeline.stages.publish_sections import kv_choice, resolved_devices
from pipeline.stages.report import kv_points, kv_table, render_plot
from unit.test_memory_model import llama_like

SHA = "6b5982a638c6ed4e3da15711b6a5a1328c34a53e"


def _recipe(tmp_path, kv_types=None, devices=None):
    gate = {"name": "prose", "text": str(BOTCHAN), "ctx": 512, "chunks": 16, "max_kld_mean": 0.05}
    if kv_types is not None:
        gate["kv_types"] = kv_types
    d = {"name": "m", "source": {"repo": "org/model", "revision": SHA}, "quants": ["Q8_0", "Q4_0"], "gates": [gate]}
    if devices:
        d["devices"] = devices
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False), encoding="utf-8")
    return path


def test_kv_types_parsed_and_described(tmp_path):
    r = load_recipe(_recipe(tmp_path, ["f16", "Q8_0", "q4_0"]))
    es = r.eval_sets[0]
    assert es.kv_types == ("f16", "q8_0", "q4_0") and es.kv_extra == ("q8_0", "q4_0")
    assert es.describe()["kv_types"] == ["f16", "q8_0", "q4_0"]
    plain = load_recipe(_recipe(tmp_path)).eval_sets[0]
    assert plain.kv_types == () and "kv_types" not in plain.describe()  # older recipes keep their keys
    assert kv_args("q8_0") == ["-ctk", "q8_0", "-ctv", "q8_0"]


@pytest.mark.parametrize("kv, devices, field, what", [
    (["f16", "q3_k"], None, "gates[0].kv_types[1]", "'q3_k' is not a KV cache type llama.cpp accepts"),
    (["q8_0"], None, "gates[0].kv_types[0]", "must be f16"),
    (["f16", "q8_0", "q8_0"], None, "gates[0].kv_types[2]", "repeats"),
    ("q8_0", None, "gates[0].kv_types", "must be a list"),
    (None, [{"name": "pi", "memory": "4G", "kv_type": "auto"}], "devices[0].kv_type", "needs a gates eval set with kv_types"),
    (None, [{"name": "pi", "memory": "4G", "kv_type": "q2_k"}], "devices[0].kv_type", "or auto"),
])
def test_bad_kv_types_one_line(tmp_path, kv, devices, field, what):
    exc = recipe_error(_recipe(tmp_path, kv, devices))
    assert exc.field == field and what in exc.message, exc


def test_a_head_size_the_block_does_not_divide_is_refused_before_any_run(tmp_path):
    r = load_recipe(_recipe(tmp_path, ["f16", "q8_0"]))
    ok = llama_like(tmp_path, "ok.gguf", n_embd=256, n_head=4)  # head 64
    check_kv_types(r.eval_sets[0], ok, "m: eval set prose: Q8_0")
    odd = llama_like(tmp_path, "odd.gguf", n_embd=240, n_head=5, n_head_kv=5)  # head 48: not a multiple of 32
    with pytest.raises(PipelineError, match="gates prose.kv_types: q8_0 has blocks of 32, which do not divide the "
                                            "head size 48 of odd.gguf") as e:
        check_kv_types(r.eval_sets[0], odd, "m: eval set prose: Q8_0")
    assert "\n" not in str(e.value)
    check_kv_types(load_recipe(_recipe(tmp_path, ["f16"])).eval_sets[0], odd, "x")  # f16 only: any head size


def _artifact(file, inside: dict, size=100):
    kv = {t: {"ppl_ratio": 1.0, "kld_mean": 0.01 if ok else 0.2, "kld_p99": 0.1, "same_top_p": 0.9, "inside": ok}
          for t, ok in inside.items()}
    return {"file": file, "role": "quant", "size_bytes": size,
            "metrics": {"prose": {"kld_mean": 0.005, "same_top_p": 0.95, "kv": kv}}}


def test_auto_takes_the_smallest_type_inside_for_every_quant(tmp_path):
    r = load_recipe(_recipe(tmp_path, ["f16", "q8_0", "q4_0"], [{"name": "pi", "memory": "4G", "kv_type": "auto"},
                                                                  {"name": "pc", "memory": "8G", "kv_type": "q8_0"}]))
    both = [_artifact("m-Q8_0.gguf", {"q8_0": True, "q4_0": True}), _artifact("m-Q4_0.gguf", {"q8_0": True, "q4_0": True})]
    assert kv_choice(r, both)[0] == "q4_0"
    one = [both[0], _artifact("m-Q4_0.gguf", {"q8_0": True, "q4_0": False})]
    assert kv_choice(r, one)[0] == "q8_0"  # q4_0 is outside Q4_0's thresholds: the next smallest
    none = [_artifact("m-Q8_0.gguf", {"q8_0": False, "q4_0": False})]
    choice, why = kv_choice(r, none)
    assert choice == "f16" and "no quantized cache" in why
    pi, pc = resolved_devices(r, one)
    assert (pi.kv_type, pc.kv_type) == ("q8_0", "q8_0") and pi.kv_auto and pc.kv_auto is None
    assert pi.describe()["kv_auto"].startswith("the smallest of f16, q8_0, q4_0") and "kv_auto" not in pc.describe()


def test_report_table_and_plot():
    rows = [{"file": "m-Q4_0.gguf", "kv_type": t, "file_bytes": 80 << 20, "kv_bytes": kv << 20, "kld_mean": kld,
             "same_top_p": 0.9, "inside": inside} for t, kv, kld, inside in
            (("f16", 16, 0.01, True), ("q8_0", 8, 0.011, True), ("q4_0", 4, 0.2, False))]
    manifest = {"name": "m", "kv_costs": {"eval_set": "prose", "ctx": 4096, "device": "pi", "rows": rows}}
    text = kv_table(manifest)
    assert "device `pi`'s ctx 4096" in text and "| `m-Q4_0.gguf` | q4_0 | 84.0 | 0.20000 | 90.00 % | ✗ |" in text
    pts = kv_points(manifest)
    assert [(p[1], p[3], p[5]) for p in pts] == [("KV f16", 96.0, True), ("KV q8_0", 88.0, True),
                                                 ("KV q4_0", 84.0, False)]
    svg = render_plot(manifest, points=pts, title="size + KV", xlabel="file + KV", legend="KV cache")
    assert "KV q4_0" in svg and ">KV cache<" in svg and "size + KV" in svg
    assert kv_table({"name": "m"}) == "" and kv_points({"name": "m"}) == []


def test_card_table():
    rows = [{"file": f, "kv_type": t, "file_bytes": 1, "kv_bytes": 1, "kld_mean": k, "same_top_p": 0.9, "inside": i}
            for f in ("m-Q8_0.gguf", "m-Q4_0.gguf") for t, k, i in (("f16", 0.01, True), ("q4_0", 0.3, False))]
    text = kv_table({"name": "m", "kv_costs": {"eval_set": "prose", "ctx": 512, "device": None, "rows": rows}}, short=True)
    assert "| file | f16 | q4_0 |" in text and "| `m-Q4_0.gguf` | 0.0100 | 0.3000 ✗ |" in text


def test_the_committed_demo_measures_what_a_quantized_cache_costs():
    """`make demo`'s own numbers (artifacts/smollm2-135m, regenerated by `make dvc-repro`; 16 chunks of Botchan on the
    real model): a q4_0 cache costs every quant more than its own quantization to q8_0 does, a q8_0 cache next to
    nothing, and the phone's `kv_type: auto` launches with the smallest type inside every quant's thresholds."""
    import json

    from helpers import ROOT

    m = json.loads((ROOT / "artifacts" / "smollm2-135m" / "manifest.json").read_text())
    rows = {(r["file"], r["kv_type"]): r for r in m["kv_costs"]["rows"]}
    files = sorted({f for f, _ in rows})
    assert len(files) == 3 and len(rows) == 9
    for f in files:
        f16, q8, q4 = (rows[f, t]["kld_mean"] for t in ("f16", "q8_0", "q4_0"))
        assert q4 > 1.5 * f16 and abs(q8 - f16) < 0.1 * f16 + 0.001, (f, f16, q8, q4)
    inside = [t for t in ("q4_0", "q8_0") if all(rows[f, t]["inside"] for f in files)]
    phone = m["devices"]["phone-4g"]
    assert phone["kv_type"] == inside[0] == "q8_0" and phone["kv_auto"].startswith("the smallest")
    assert " -ctk q8_0 -ctv q8_0 " in m["build"]["launch"]["phone-4g"]["line"]
