"""ggufpipe plan's predictions (pipeline/devices/plan.py) from generated config.json + safetensors headers, the
paper configs of data/paper/, the rules' resources and the pre-flight's memory refusal through a fake meminfo.
No llama.cpp, no torch."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.devices import plan as P
from pipeline.devices import plan_jobs as J
from pipeline.devices import plan_source as S
from pipeline.devices.plan_tensors import config_tensors
from pipeline.layout import Layout
from pipeline.memory import pad
from pipeline.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
CFG = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 4,
       "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 4096,
       "tie_word_embeddings": True, "torch_dtype": "float16"}


def write_checkpoint(folder: Path, cfg: dict = CFG) -> Path:
    """config.json and one safetensors file whose header lists the tensors (data left sparse: never read)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    header, off = {}, 0
    for name, shape, b in config_tensors(cfg, 2):
        n = b * S._numel(shape)
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + off)
    return folder


def recipe(tmp_path: Path, src: Path, extra: str = "") -> object:
    p = tmp_path / "r.yaml"
    p.write_text(f"""name: planned
source: {{path: {src}}}
quants: [Q8_0, Q4_K_M]
bench: false
gates:
  - {{name: botchan, text: {ROOT / 'data' / 'botchan.txt'}, ctx: 512, chunks: 16}}
{extra}""")
    return load_recipe(p)


def test_facts_from_headers_equal_facts_from_config(tmp_path):
    f = S.source_facts(write_checkpoint(tmp_path / "hf"))
    assert f.origin == "safetensors headers"
    n_layer = 4 * (576 * 576 * 2 + 192 * 576 * 2 + 1536 * 576 * 3 + 576 * 2)
    assert f.n_params == 4096 * 576 + 576 + n_layer
    assert f.weight_bytes == 2 * f.n_params and f.tied and f.n_vocab == 4096
    only_config = tmp_path / "cfg"
    only_config.mkdir()
    (only_config / "config.json").write_text(json.dumps(CFG))
    g = S.source_facts(only_config / "config.json")
    assert g.origin.startswith("config.json") and g.n_params == f.n_params


def test_gguf_sizes_per_tensor_type():
    # the demo's shapes: ncols 576 is no multiple of 256, so K types fall back (Q4_K -> Q5_0, Q6_K -> Q8_0)
    assert P.quant_tensor_type("Q4_K_M", "attn_q", 5, 30, 576, True) == "Q5_0"
    assert P.quant_tensor_type("Q4_K_M", "ffn_down", 4, 30, 1536, True) == "Q4_K"
    assert P.quant_tensor_type("Q4_K_M", "ffn_down", 0, 30, 1536, True) == "Q6_K"  # use_more_bits: first eighth
    assert P.quant_tensor_type("Q4_K_M", "token_embd", 0, 30, 4096, True) == "Q6_K"  # tied: the output matrix
    assert P.quant_tensor_type("Q4_K_M", "token_embd", 0, 30, 4096, False) == "Q4_K"
    assert P.quant_tensor_type("Q8_0", "output", 0, 30, 4096, False) == "Q8_0"
    assert P.quant_tensor_type("Q3_K_M", "attn_v", 1, 30, 4096, False) == "Q5_K"
    assert P.quant_tensor_type("Q4_0", "attn_q", 0, 30, 100, False) == "F16"  # ncols % 32


def test_disk_and_ram_plan(tmp_path):
    src = write_checkpoint(tmp_path / "hf")
    r = recipe(tmp_path, src)
    f = S.source_facts(src)
    disk = {(d["stage"], d["key"]): d["bytes"] for d in P.disk_plan(r, f)}
    tensor_data = sum(pad((2 if len(s) == 2 else 4) * S._numel(s), 32) for _, s, _ in f.tensors)
    assert disk[("convert", "F16")] == P._header_bytes(f, len(f.tensors)) + tensor_data
    assert disk[("quantize", "Q4_K_M")] < disk[("quantize", "Q8_0")] < disk[("convert", "F16")]
    from pipeline.stagedef import logits_bytes

    assert disk[("eval_base", "botchan")] == logits_bytes(512, 16, 4096)
    ram = {(x["stage"], x["key"]): x["bytes"] for x in P.ram_plan(r, f)}
    assert ram[("eval_base", "botchan")] > disk[("convert", "F16")]  # the whole base mapped + buffers
    assert ram[("eval", "botchan/Q4_K_M")] < ram[("eval", "botchan/Q8_0")]
    assert ram[("conformance", "")] > 4 * f.n_params


def test_rules_resources_come_from_the_plan():
    """Every rule's resources are `**rule_resources(st.rule, W)` (the Snakefile's one rule per stage), the stage's
    declared functions that `ggufpipe plan` evaluates, and the formulas are those of docs/cluster.md."""
    from pipeline.stages import registry

    assert "**rule_resources(st.rule, W)," in (ROOT / "Snakefile").read_text()
    for rule in registry():
        assert set(J.resources(rule)) == {"mem_mb", "disk_mb", "runtime"}, rule
    s = SimpleNamespace(total=1000.0, mb=lambda k: 1000.0)
    assert J.evaluate_resources("convert", s) == {"mem_mb": 2012, "disk_mb": 3012, "runtime": 40}
    assert J.evaluate_resources("quantize", s) == {"mem_mb": 1712, "disk_mb": 1512, "runtime": 25}
    assert J.evaluate_resources("gate", s) == {"mem_mb": 512, "disk_mb": 512, "runtime": 10}


@pytest.mark.parametrize("name,params,total", [("llama-2-7b", 6_738_415_616, 13_476_839_424),
                                               ("qwen2.5-32b", 32_763_876_352, 65_527_752_704),
                                               ("llama-3.1-70b", 70_553_706_496, 141_107_412_992),
                                               ("qwen3-30b-a3b", 30_532_122_624, 61_064_245_248)])
def test_paper_configs(name, params, total):
    f = S.source_facts(ROOT / "data" / "paper" / name)
    assert f.n_params == params and not f.notes  # every index name derived, total_size matched
    idx = json.loads((ROOT / "data" / "paper" / name / "model.safetensors.index.json").read_text())
    assert idx["metadata"]["total_size"] == total
    assert abs(f.weight_bytes - total) <= 8192  # Llama-2's index also lists 32 rotary inv_freq buffers


def test_moe_paper_config_plans_experts():
    """Qwen3-30B-A3B (issue #31): 30.5 B parameters, 3.3 B active as Qwen publishes them; per file the routed experts
    (all mapped, 8/128 read per token) and the rest; routers F32; the 18,432 per-expert tensors merged per layer
    and weight as the converter writes them (144 ``*_exps``)."""
    f = S.source_facts(ROOT / "data" / "paper" / "qwen3-30b-a3b")
    assert (f.n_expert, f.n_expert_used) == (128, 8)
    moe = P.moe_plan(f, ["F16", "Q4_K_M"])
    assert moe["params_total"] == 30_532_122_624 and round(moe["params_active"] / 1e9, 2) == 3.35
    assert f.n_active == moe["params_active"]  # the hours count the active parameters' FLOPs per token
    from pipeline.memory import experts  # fit's count, from the merged shape: the same parameters

    assert experts(P.model_shape(f, "F16"))["params_active"] == f.n_active
    shape = P.model_shape(f, "Q4_K_M")
    exps = [t for t in shape.tensors if ".experts." in t.name]
    assert len(exps) == 144 and exps[0].ne[2] == 128
    assert {t.type_name for t in shape.tensors if t.name.endswith("mlp.gate.weight")} == {"F32"}
    f16, q4 = moe["files"]["F16"], moe["files"]["Q4_K_M"]
    assert f16["expert_bytes"] == 48 * 3 * 128 * 768 * 2048 * 2 and f16["read_per_token"] == f16["expert_bytes"] // 16
    assert q4["moe_layers"] == 48 and q4["expert_bytes"] + q4["other_bytes"] == P.gguf_bytes(f, "Q4_K_M")
    assert 17.0 < P.gguf_bytes(f, "Q4_K_M") / 2**30 < 17.6  # uploaders' Q4_K_M: about 18.6 GB (recalled, not fetched)


@pytest.mark.parametrize("model,groups", [("llama-2-7b", 7 * 8 + 2), ("qwen3-30b-a3b", 7 * 8 + 2)])
def test_sensitivity_hours_on_paper_configs(tmp_path, model, groups):
    """A recipe with a mix (data/paper/plan-mix-recipe.yaml) plans its sensitivity: 8 bands x 7 roles (for the
    mixture, attention q/k/v/o and the three routed-expert roles; routers never quantized) and token_embd, output;
    the exhaustive search 1 + groups x 4 evaluations, the screened one a fifth of them (its imatrix pass counted)."""
    f = S.source_facts(ROOT / "data" / "paper" / model)
    text = (ROOT / "data" / "paper" / "plan-mix-recipe.yaml").read_text().replace("../", f"{ROOT / 'data'}/")
    rows = {}
    for search in ("exhaustive", "screened", "fisher"):
        path = tmp_path / f"{search}.yaml"
        path.write_text(text.replace("search: screened", f"search: {search}"))
        r = load_recipe(path)
        (job,) = [j for j in J.plan_jobs(r, f) if j["rule"] == "sensitivity"]
        rows[search] = (job["search"], J.hours(job, f, r))
    (ex, ex_h), (sc, sc_h), (fi, fi_h) = rows["exhaustive"], rows["screened"], rows["fisher"]
    assert ex["evaluations"] == ex["exhaustive"] == sc["exhaustive"] == 1 + groups * 4
    assert sc["evaluations"] + sc["imatrix_passes"] == ex["evaluations"] // 5 and sc["screened_types"] == 5
    assert 0 < sc_h < ex_h / 3
    # the Fisher pass counts as three evaluations in place of the imatrix pass
    assert (fi["evaluations"] + 3, fi["imatrix_passes"], fi["fisher_passes"]) == (ex["evaluations"] // 5, 0, 1)
    assert 0 < fi_h < ex_h / 2, (fi_h, sc_h, ex_h)


def test_eight_experts_raise_attn_k_and_v_to_q8_0():
    """src/llama-quant.cpp:599-610: a model of exactly 8 experts gets attn_k/attn_v at Q8_0; 16 do not."""
    assert P.quant_tensor_type("Q4_K_M", "attn_k", 3, 32, 4096, False, 4, n_expert=8) == "Q8_0"
    assert P.quant_tensor_type("Q4_K_M", "attn_v", 3, 32, 4096, False, 4, n_expert=8) == "Q8_0"
    assert P.quant_tensor_type("Q4_K_M", "attn_k", 3, 32, 4096, False, 4, n_expert=16) == "Q4_K"


def test_free_memory_reads_the_file_GGUFPIPE_MEMINFO_names(tmp_path, monkeypatch):
    fake = tmp_path / "meminfo"
    fake.write_text("MemTotal:       1000000 kB\nMemFree:          20000 kB\nMemAvailable:     51200 kB\n")
    monkeypatch.setenv("GGUFPIPE_MEMINFO", str(fake))
    assert P.free_memory() == 51200 * 1024
    fake.write_text("MemTotal: 1000 kB\nMemFree: 100 kB\nCached: 28 kB\n")  # an old kernel: no MemAvailable
    assert P.free_memory() == 128 * 1024


def test_preflight_refuses_memory_in_one_line(tmp_path, monkeypatch):
    src = write_checkpoint(tmp_path / "hf")
    r = recipe(tmp_path, src)
    W = SimpleNamespace(layout=Layout(tmp_path / "art", tmp_path / "work"), recipes={r.name: r}, hub_cache="")
    jobs = [("convert", {"name": r.name, "outtype": "F16"}), ("eval_base", {"name": r.name, "es": "botchan"})]
    fake = tmp_path / "meminfo"
    fake.write_text("MemAvailable:      8192 kB\n")  # 8 MiB
    monkeypatch.setenv("GGUFPIPE_MEMINFO", str(fake))
    msg = J.check_jobs(W, jobs)
    assert msg.startswith("not enough memory for convert F16 of planned: predicted peak ")
    assert "8.0 MiB available" in msg and "\n" not in msg
    assert J.check_jobs(W, jobs, local=False) is None  # a cluster: the host's memory is not judged
    assert "node_mem_mb 100 MiB" in J.check_jobs(W, jobs, local=False, node_mem_mb=100)
    fake.write_text("MemAvailable:  100000000 kB\n")
    assert J.check_jobs(W, jobs) is None
    # a checkpoint not on this machine: nothing to judge
    r2 = recipe(tmp_path, tmp_path / "absent")
    W.recipes = {r2.name: r2}
    fake.write_text("MemAvailable:      8192 kB\n")
    assert J.check_jobs(W, jobs) is None
