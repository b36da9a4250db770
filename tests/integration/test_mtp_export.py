"""Recipe ``mtp: keep | strip | separate``: what the pinned converter does with multi-token-prediction
heads, on a tiny generated GLM-4.5-style checkpoint (``Glm4MoeForCausalLM``: the canonical MTP model,
one of the architectures whose converter class supports ``--mtp`` / ``--no-mtp``).

The checkpoint has 2 decoder layers and 1 NextN/MTP layer (HF ``model.layers.2.{eh_proj, enorm, hnorm,
shared_head.norm}`` plus an ordinary decoder block, as GLM-4.5 ships it). Its tokenizer is the demo's
SmolLM2 one plus the four special tokens the GLM converter looks up: a freshly trained BPE vocabulary
would be refused, because the converter identifies BPE pre-tokenizers by a hash of the token ids of a
test string and knows only published tokenizers' hashes.
"""

from __future__ import annotations

import functools
import json
import re
import shutil

import pytest
import yaml
from helpers import snakemake

from pipeline.convert import convert, convert_mtp
from pipeline.errors import PipelineError
from pipeline.ggufinfo import field, open_reader
from pipeline.mtp import mtp_facts
from pipeline.recipe import load_recipe
from pipeline.tools import run_tool

GLM_SPECIAL = ["[gMASK]", "<|user|>", "<|observation|>"]  # <|endoftext|> is in the SmolLM2 vocab already
MTP_NAMES = [f"blk.2.nextn.{k}.weight" for k in ("eh_proj", "enorm", "hnorm", "shared_head_norm")]


def tiny_glm4_moe(dest, tokenizer_dir, n_layer: int = 2, nextn_layers: int = 1, seed: int = 0):
    """A random Glm4MoeForCausalLM checkpoint (safetensors): layer 0 dense, the others (MTP layers
    included) MoE with 4 routed experts and a shared one; hidden size 64."""
    import torch
    from safetensors.torch import save_file

    dest.mkdir(parents=True)
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    n_tok = len(tok["model"]["vocab"])
    assert all(t["id"] < n_tok for t in tok["added_tokens"])
    tok["added_tokens"] += [{"id": n_tok + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, t in enumerate(GLM_SPECIAL)]
    (dest / "tokenizer.json").write_text(json.dumps(tok))
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer_dir / name, dest / name)
    vocab = (n_tok + len(GLM_SPECIAL) + 7) // 8 * 8
    H, NH, KV, HD, FF, E, FFE = 64, 4, 2, 16, 128, 4, 32
    (dest / "config.json").write_text(json.dumps({
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "vocab_size": vocab, "hidden_size": H,
        "num_hidden_layers": n_layer, "num_nextn_predict_layers": nextn_layers, "num_attention_heads": NH,
        "num_key_value_heads": KV, "head_dim": HD, "intermediate_size": FF, "moe_intermediate_size": FFE,
        "n_routed_experts": E, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
        "routed_scaling_factor": 1.0, "norm_topk_prob": True, "partial_rotary_factor": 0.5, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "attention_bias": True, "use_qk_norm": False,
        "tie_word_embeddings": False, "n_group": 1, "topk_group": 1, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2}))
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * 0.05).contiguous()

    t = {"model.embed_tokens.weight": rnd(vocab, H), "model.norm.weight": torch.ones(H), "lm_head.weight": rnd(vocab, H)}
    for b in range(n_layer + nextn_layers):
        p = f"model.layers.{b}."
        t[p + "input_layernorm.weight"] = torch.ones(H)
        t[p + "post_attention_layernorm.weight"] = torch.ones(H)
        for proj, rows in (("q", NH * HD), ("k", KV * HD), ("v", KV * HD)):
            t[p + f"self_attn.{proj}_proj.weight"] = rnd(rows, H)
            t[p + f"self_attn.{proj}_proj.bias"] = rnd(rows)
        t[p + "self_attn.o_proj.weight"] = rnd(H, NH * HD)
        mlps = {"mlp.": FF} if b == 0 else {**{f"mlp.experts.{e}.": FFE for e in range(E)}, "mlp.shared_experts.": FFE}
        for q, ff in mlps.items():
            t[p + q + "gate_proj.weight"], t[p + q + "up_proj.weight"] = rnd(ff, H), rnd(ff, H)
            t[p + q + "down_proj.weight"] = rnd(H, ff)
        if b > 0:
            t[p + "mlp.gate.weight"] = rnd(E, H)
            t[p + "mlp.gate.e_score_correction_bias"] = torch.zeros(E)
        if b >= n_layer:  # the NextN/MTP layer's own tensors
            t[p + "eh_proj.weight"] = rnd(H, 2 * H)
            for norm in ("enorm", "hnorm", "shared_head.norm"):
                t[p + f"{norm}.weight"] = torch.ones(H)
    save_file(t, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


@pytest.fixture(scope="module")
def glm_hf(tmp_path_factory, demo_snapshot):
    return tiny_glm4_moe(tmp_path_factory.mktemp("glm") / "hf", demo_snapshot)


def recipe(folder, src, mtp: str | None, name: str = "glm", **extra):
    data = {"name": name, "source": {"path": str(src)}, "quants": ["Q8_0"], "bench": False, **extra}
    if mtp is not None:
        data["mtp"] = mtp
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@functools.cache
def gguf_info(path) -> tuple[set[str], dict, int]:
    """(tensor names, pipeline.mtp.mtp_facts, block count) of a GGUF, read once (a GGUFReader parses the
    49k-token vocabulary in seconds)."""
    r = open_reader(path)
    return {t.name for t in r.tensors}, mtp_facts(r), field(r, "glm4moe.block_count")


@pytest.fixture(scope="module")
def converted(tmp_path_factory, glm_hf, toolchain):
    """The tiny checkpoint converted once per mode: keep, strip, separate (model file + MTP draft)."""
    root = tmp_path_factory.mktemp("modes")
    out = {}
    for mode in ("keep", "strip", "separate"):
        r = load_recipe(recipe(root / mode, glm_hf, mode))
        d = root / mode
        out[mode] = {"gguf": d / r.base_file, "record": convert(r, glm_hf, d / r.base_file, d / "convert.json",
                                                                 log=d / "convert.log", tc=toolchain)}
        if mode == "separate":
            out["draft"] = {"gguf": d / r.mtp_file, "record": convert_mtp(r, glm_hf, d / r.mtp_file, d / "mtp.json",
                                                                          log=d / "mtp.log", tc=toolchain)}
    return out


# ------------------------------------------------------------------ recipe field


def test_recipe_mtp_field(tmp_path, glm_hf):
    assert load_recipe(recipe(tmp_path, glm_hf, None)).mtp == "keep"
    r = load_recipe(recipe(tmp_path, glm_hf, "separate"))
    assert r.mtp == "separate" and r.mtp_file == "glm-mtp-F16.gguf"
    for bad, shown in (("both", "'both'"), (True, "True")):
        path = recipe(tmp_path, glm_hf, bad)
        with pytest.raises(PipelineError) as exc:
            load_recipe(path)
        assert str(exc.value) == f"{path}: mtp: {shown} is not one of keep, strip, separate"


# ------------------------------------------------------------------ the convert stage per mode


def test_keep_converts_with_heads(converted):
    _, f, blocks = gguf_info(converted["keep"]["gguf"])
    assert (f["tensors"], f["layers"], f["nextn_predict_layers"], f["names"], blocks) == (4, [2], 1, MTP_NAMES, 3)
    assert "mtp" not in converted["keep"]["record"]


def test_strip_converts_without_heads(converted):
    names, f, blocks = gguf_info(converted["strip"]["gguf"])
    assert (f["tensors"], f["layers"], f["nextn_predict_layers"], blocks) == (0, [], None, 2)
    # exactly the MTP layer's block is gone, nothing of the model itself
    keep_names = gguf_info(converted["keep"]["gguf"])[0]
    assert names < keep_names and {n.split(".")[1] for n in keep_names - names if n.startswith("blk.")} == {"2"}
    assert all(n.startswith("blk.2.") for n in keep_names - names)
    assert converted["strip"]["record"]["mtp"] == {"mode": "strip", "converter_args": ["--no-mtp"]}


def test_separate_exports_heads_as_a_draft(converted):
    main, draft = converted["separate"]["gguf"], converted["draft"]["gguf"]
    assert main.read_bytes() == converted["strip"]["gguf"].read_bytes()  # the model file is the stripped one
    assert converted["separate"]["record"]["mtp"] == {"mode": "separate", "converter_args": ["--no-mtp"]}
    names, f, blocks = gguf_info(draft)
    assert (f["tensors"], f["layers"], f["nextn_predict_layers"], f["names"], blocks) == (4, [2], 1, MTP_NAMES, 3)
    # the MTP layer's block plus the embedding, output norm and output matrix it uses; no trunk layer
    keep_names = gguf_info(converted["keep"]["gguf"])[0]
    assert names == {n for n in keep_names if n.startswith("blk.2.")} | {
        "token_embd.weight", "output_norm.weight", "output.weight"}
    rec = converted["draft"]["record"]
    assert rec["converter_args"] == ["--mtp"] and rec["mtp"] == {"tensors": 4, "layers": [2], "nextn_predict_layers": 1}
    assert not list(draft.parent.glob(".*tmp*"))


def test_llama_cpp_runs_the_mtp_draft(converted, toolchain, tmp_path):
    """llama.cpp b11312 takes the exported pair for MTP speculative decoding and drafts with the head."""
    prompt = tmp_path / "p.txt"
    prompt.write_text("The quick brown fox jumps over the lazy dog. Once upon a time")
    res = run_tool(toolchain, "llama-speculative-simple", [
        "-m", converted["separate"]["gguf"], "-md", converted["draft"]["gguf"], "--spec-type", "draft-mtp",
        "-f", prompt, "-n", "8", "--spec-draft-n-max", "2", "--temp", "0", "--seed", "1", "-t", "2", "-c", "256"],
        tmp_path / "spec.log")
    assert "loading draft model" in res.output and "glm-mtp-F16.gguf" in res.output
    assert int(re.search(r"n_drafted\s*=\s*(\d+)", res.output).group(1)) > 0


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize("stage,mode", [(convert, "strip"), (convert_mtp, "separate")], ids=["strip", "separate"])
def test_unsupported_architecture_one_clear_line(tmp_path, demo_snapshot, toolchain, stage, mode):
    """The demo model (LlamaForCausalLM): its converter class cannot split MTP heads off."""
    path = recipe(tmp_path, demo_snapshot, mode)
    out = tmp_path / "art" / "out.gguf"
    with pytest.raises(PipelineError) as exc:
        stage(load_recipe(path), demo_snapshot, out, tmp_path / "rec.json", log=tmp_path / "c.log", tc=toolchain)
    assert str(exc.value) == (
        f"{path}: convert: mtp: {mode}: llama.cpp b11312's converter cannot split multi-token-prediction heads off "
        "LlamaForCausalLM models (--mtp / --no-mtp are refused for that architecture); set `mtp: keep` "
        f"[log: {tmp_path / 'c.log'}]")
    assert not out.exists() and not list(out.parent.glob(".*tmp*")) and not (tmp_path / "rec.json").exists()


def test_model_without_heads_gives_no_draft(tmp_path, demo_snapshot, toolchain):
    """A supported architecture whose checkpoint has no MTP layer: the converter would write an empty draft."""
    src = tiny_glm4_moe(tmp_path / "hf", demo_snapshot, nextn_layers=0)
    path = recipe(tmp_path, src, "separate")
    out = tmp_path / "art" / "glm-mtp-F16.gguf"
    with pytest.raises(PipelineError) as exc:
        convert_mtp(load_recipe(path), src, out, tmp_path / "rec.json", tc=toolchain)
    assert str(exc.value) == (f"{path}: convert: mtp: separate: the model has no multi-token-prediction heads (the "
                              "converter's --mtp export holds no nextn tensors); set `mtp: keep`")
    assert not out.exists() and not list(out.parent.glob(".*tmp*"))


def test_convert_mtp_only_for_separate(tmp_path, glm_hf):
    path = recipe(tmp_path, glm_hf, "strip")
    with pytest.raises(PipelineError, match=r"glm\.yaml: mtp: strip: the MTP draft is exported only with `mtp: separate`"):
        convert_mtp(load_recipe(path), glm_hf, tmp_path / "x.gguf", tmp_path / "x.json")


def test_heads_left_despite_no_mtp_are_caught(tmp_path, glm_hf, toolchain, monkeypatch):
    """A converter that ignores --no-mtp (an architecture class that opts in but does not filter) is caught."""
    import pipeline.convert as conv

    real = conv.run_converter
    monkeypatch.setattr(conv, "run_converter", lambda tc, args, log: real(tc, [a for a in args if a != "--no-mtp"], log))
    path = recipe(tmp_path, glm_hf, "strip")
    out = tmp_path / "art" / "glm-F16.gguf"
    with pytest.raises(PipelineError, match=r"mtp: strip: the converter left 4 nextn tensors in glm-F16\.gguf despite --no-mtp"):
        convert(load_recipe(path), glm_hf, out, tmp_path / "rec.json", tc=toolchain)
    assert not out.exists()


# ------------------------------------------------------------------ the workflow


def test_convert_trigger_holds_the_mode(tmp_path, glm_hf):
    from pipeline.workflow import Workflow

    files = [recipe(tmp_path, glm_hf, mode, name=f"m-{mode}") for mode in ("keep", "strip", "separate")]
    W = Workflow({"recipes": ",".join(map(str, files))})
    params = {mode: W.convert_params(f"m-{mode}") for mode in ("keep", "strip", "separate")}
    assert len(set(params.values())) == 3
    assert "keep" not in params["keep"]  # the default leaves the trigger of existing builds unchanged
    assert W.publish_inputs("m-separate")["mtp"] == [str(W.layout.mtp_gguf(W.recipe("m-separate"))),
                                                     str(W.layout.mtp_record(W.recipe("m-separate")))]
    assert "mtp" not in W.publish_inputs("m-strip")


def test_workflow_separate(tmp_path, glm_hf, demo_hub):
    """Real Snakemake, `mtp: separate`: the MTP draft is exported by its own rule, published beside the
    model files and recorded; switching the recipe to another mode re-converts (the mode is a rerun trigger)."""
    from pipeline.verify import verify

    rfile = recipe(tmp_path / "recipes", glm_hf, "separate")
    res = snakemake(tmp_path, rfile, hub=demo_hub)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    folder = tmp_path / "artifacts" / "glm"
    m = json.loads((folder / "manifest.json").read_text())
    assert [(e["file"], e["role"]) for e in m["artifacts"]] == [
        ("glm-F16.gguf", "base"), ("glm-mtp-F16.gguf", "mtp-draft"), ("glm-Q8_0.gguf", "quant")]
    base, draft, q8 = m["artifacts"]
    assert "mtp" not in base and "mtp" not in q8
    assert draft["mtp"] == {"tensors": 4, "layers": [2], "nextn_predict_layers": 1}
    assert draft["quant_type"] == "F16" and draft["converter_args"] == ["--mtp"] and len(draft["sha256"]) == 64
    assert m["mtp"]["mode"] == "separate" and m["mtp"]["converter_args"] == ["--no-mtp"]
    assert m["mtp"]["draft_file"] == "glm-mtp-F16.gguf"
    assert m["mtp"]["deploy"] == [f"llama-server -m {f} -md glm-mtp-F16.gguf --spec-type draft-mtp"
                                  for f in ("glm-F16.gguf", "glm-Q8_0.gguf")]
    assert verify(folder / "glm-mtp-F16.gguf").startswith("OK")
    assert (tmp_path / "work" / "glm" / "gate.ok").is_file()
    assert "## MTP heads" in (folder / "report.md").read_text()
    card = (folder / "README.md").read_text()
    assert "-md glm-mtp-F16.gguf --spec-type draft-mtp" in card and "llama-cli -m glm-mtp-F16.gguf" not in card

    for mode in ("strip", "keep"):
        recipe(tmp_path / "recipes", glm_hf, mode)
        res = snakemake(tmp_path, rfile, hub=demo_hub, extra=["--dry-run"])
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-3000:]
        assert re.search(r"^convert\s+1$", out, re.M) and "convert_mtp" not in out, out[-3000:]
