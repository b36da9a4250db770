"""The residual-stream rotation (pipeline/rotate.py, issue #19) on a tiny generated Llama: transformers gives the same
logits before and after, while every matrix changed and the embeddings are untied; the same seed gives the same
bytes; what the rotation does not handle is refused in one line naming the file and the field or tensor. Integration
tier: the forward pass uses torch and transformers (out of the unit tier's reach)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers.hf_factory import save_with_trained_norms

from pipeline.errors import PipelineError
from pipeline.rotate import grid_fraction, random_orthogonal, rotate_llama

# Fixed from the error analysis before the test was kept (measured values in the comments of the asserts):
EXACT = 1e-4  # max |logit difference| of the float64 rotation, transformers forward (its RMSNorm computes in float32)
STORED = 0.05  # the same for the float16 file: the one error is float16 rounding of weights (2^-11 relative)
MIN_TOP1, MAX_KLD = 0.98, 1e-4  # the bench's "function preserved" thresholds on the stored file (KLD ten times tighter)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A 2-layer Llama, hidden 64, 4 heads / 2 KV heads, tied embeddings, float16 safetensors; norms drawn in
    0.5..1.5 (trained-looking, so a missed fold shows) and weights large enough for logits of order 1."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dest = tmp_path_factory.mktemp("rotate") / "tiny"
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=64, tie_word_embeddings=True,
                      initializer_range=0.15, torch_dtype="float16")
    torch.manual_seed(0)
    save_with_trained_norms(LlamaForCausalLM(cfg), dest, suffix="norm.weight")
    (dest / "tokenizer_config.json").write_text('{"model_max_length": 64}\n')  # stands for the files copied as they are
    return dest


def forward(model, ids):
    import torch

    with torch.no_grad():
        return model.eval()(ids).logits.double().numpy()


def logits(folder: Path, ids):
    import torch
    from transformers import AutoModelForCausalLM

    return forward(AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32), ids)


def state_dict_model(folder: Path, tensors: dict):
    """The Llama of ``folder``'s config, untied, in float64, holding ``tensors``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig.from_pretrained(str(folder), tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).double()
    model.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float64)) for k, v in tensors.items()})
    return model


def kld_top1(p_logits, q_logits) -> tuple[float, float]:
    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    kld = float((np.exp(lp) * (lp - lq)).sum(-1).mean())
    return kld, float((p_logits.argmax(-1) == q_logits.argmax(-1)).mean())


def test_rotation_is_exact_in_float64(tiny):
    """The mapping itself: the float64 rotated state dict gives the same logits as the source to float32 error,
    and a missed fold (norm scales applied twice) is far outside that tolerance."""
    import torch
    from safetensors.numpy import load_file

    from pipeline.rotate import rotate_tensors

    src = {k: v.astype(np.float64) for k, v in load_file(str(tiny / "model.safetensors")).items()}
    ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(1))
    before = forward(state_dict_model(tiny, {**src, "lm_head.weight": src["model.embed_tokens.weight"]}), ids)
    rotated = rotate_tensors(src, random_orthogonal(64, 3), 2)
    diff = float(np.abs(before - forward(state_dict_model(tiny, rotated), ids)).max())
    assert diff < EXACT, diff  # measured 3.3e-6
    broken = {**rotated, "model.layers.0.input_layernorm.weight": src["model.layers.0.input_layernorm.weight"]}
    assert float(np.abs(before - forward(state_dict_model(tiny, broken), ids)).max()) > 100 * EXACT


def test_rotation_keeps_logits_and_moves_weights(tmp_path, tiny):
    import torch
    from safetensors.numpy import load_file

    out = tmp_path / "rot"
    summary = rotate_llama(tiny, out, seed=3)
    assert summary["seed"] == 3 and summary["hidden_size"] == 64 and summary["layers"] == 2 and summary["untied"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False and cfg["torch_dtype"] == "float16"
    assert (out / "tokenizer_config.json").read_bytes() == (tiny / "tokenizer_config.json").read_bytes()
    assert "rotated (seed 3" in (out / "README.md").read_text()

    ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(1))
    before, after = logits(tiny, ids), logits(out, ids)
    assert before.std() > 0.5, before.std()  # logits of order 1 (std 1.3, max 5): the tolerances are under their spread
    diff = float(np.abs(before - after).max())
    kld, top1 = kld_top1(before, after)
    assert diff < STORED and kld < MAX_KLD and top1 >= MIN_TOP1, (diff, kld, top1)  # measured 8.2e-3, 1.1e-6, 1.0

    a, b = load_file(str(tiny / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert set(b) == set(a) | {"lm_head.weight"} and all(t.dtype == np.float16 for t in b.values())
    for name, t in a.items():
        if t.ndim == 2:
            old, new = t.astype(np.float64), b[name].astype(np.float64)
            assert np.linalg.norm(new - old) / np.linalg.norm(old) > 0.5, name
        else:  # every RMSNorm scale folded away
            assert name.endswith("norm.weight") and (b[name] == 1).all(), name


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path, tiny):
    rotate_llama(tiny, tmp_path / "a", seed=0)
    rotate_llama(tiny, tmp_path / "b", seed=0)
    rotate_llama(tiny, tmp_path / "c", seed=1)
    same = (tmp_path / "a" / "model.safetensors").read_bytes()
    assert (tmp_path / "b" / "model.safetensors").read_bytes() == same
    assert (tmp_path / "c" / "model.safetensors").read_bytes() != same
    q = random_orthogonal(64, 0)
    assert np.abs(q @ q.T - np.eye(64)).max() < 1e-12 and np.array_equal(q, random_orthogonal(64, 0))


def test_grid_measure():
    """Blocks dequantized from Q4_1 / Q8_0 (float16 like the demo) are on their grid; Gaussian weights are not."""
    rng = np.random.default_rng(0)
    d = rng.uniform(1e-3, 2e-2, (256, 1)).astype(np.float16).astype(np.float32)
    m = rng.uniform(-0.2, 0.0, (256, 1)).astype(np.float16).astype(np.float32)
    q4, q8 = rng.integers(0, 16, (256, 32)), rng.integers(-127, 128, (256, 32))
    q4[:, :2], q8[:, 0] = (0, 15), 127  # as llama.cpp quantizes: the block's min and max take the end levels
    q4, q8 = (q4 * d + m).astype(np.float16), (q8 * d).astype(np.float16)
    gauss = (rng.standard_normal((256, 32)) * 0.05).astype(np.float16)
    assert grid_fraction(q4) == 1.0 and grid_fraction(q8, "q8_0") == 1.0
    assert grid_fraction(gauss) == 0.0 and grid_fraction(gauss, "q8_0") == 0.0


@pytest.mark.parametrize("edit, message", [
    ({"attention_bias": True}, "config.json: attention_bias: true (biases)"),
    ({"mlp_bias": True}, "config.json: mlp_bias: true (biases)"),
    ({"model_type": "gpt2"}, "config.json: model_type: 'gpt2' is not one of llama, mistral"),
    ({"architectures": ["LlamaForSequenceClassification"]}, "config.json: architectures: "),
    ({"rms_norm_eps": None}, "config.json: rms_norm_eps: absent"),
])
def test_refusals_one_line(tmp_path, tiny, edit, message):
    src = tmp_path / "src"
    shutil.copytree(tiny, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(edit)
    if cfg.get("rms_norm_eps", 1) is None:
        del cfg["rms_norm_eps"]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PipelineError, match=re.escape(f"{src}/{message}")) as exc:
        rotate_llama(src, tmp_path / "out")
    assert "\n" not in str(exc.value) and not (tmp_path / "out").exists()


def test_bias_tensor_refused(tmp_path, tiny):
    from safetensors.numpy import load_file, save_file

    src = tmp_path / "src"
    shutil.copytree(tiny, src)
    t = load_file(str(src / "model.safetensors"))
    t["model.layers.0.self_attn.o_proj.bias"] = np.zeros(64, np.float16)
    save_file(t, str(src / "model.safetensors"))
    with pytest.raises(PipelineError, match=r"model\.layers\.0\.self_attn\.o_proj\.bias: a bias tensor"):
        rotate_llama(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()
