"""Check 5, hyperparameters: the GGUF's architecture keys that change the computation against the HF config they
were converted from. (see pipeline/stages/conformance/__init__.py).

The logit check sees a wrong hyperparameter only through its effect on 4 x 512 tokens: a rope base scaled by 1.1
moves the demo's top-1 agreement 1.1x past its threshold and leaves the mean KLD inside (bench/RESULTS.md,
"Conformance"), because the error grows with the position. This check compares the values themselves. The HF
side is transformers' config (``AutoConfig``, its canonical attribute names and defaults; the raw config.json
with its ``text_config`` when transformers does not know the architecture); the GGUF side is what llama.cpp
reads (``<arch>.<key>``, llama-arch.cpp's LLM_KV names). The converter writes these from the same file through
its own alias lists (conversion/base.py:1437-1516 of the pinned tree); a value it took from another alias, a
model class that overrides it, or a later edit of the GGUF shows here.

Compared only where both sides have a scalar value: a GGUF per-layer array (head counts of hybrid models) and a
key either side lacks are listed as not compared. Floats are stored as float32 in the GGUF: equal within a
relative 1e-6 (float32 rounding is 6e-8); integers exactly. ``context_length`` differing is a warning (it sets
llama.cpp's default context, not the logits)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pipeline.stages.conformance.common import fail_line

REL_TOL = 1e-6  # float32 storage of a float64 config value: relative error <= 2**-24

# (GGUF key after "<arch>.", HF config paths tried in order (dotted), kind); a path of "rope" reads the rope
# parameters (transformers 4.x ``rope_theta`` / ``rope_scaling``, 5.x ``rope_parameters``, per layer type or not)
KEYS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("rope.freq_base", ("rope:full.rope_theta", "rope_theta"), "float"),
    ("rope.freq_base_swa", ("rope:sliding.rope_theta", "rope_local_base_freq"), "float"),
    ("rope.scaling.factor", ("rope:full.factor",), "float"),
    ("attention.layer_norm_rms_epsilon", ("rms_norm_eps",), "float"),
    ("attention.layer_norm_epsilon", ("layer_norm_eps", "layer_norm_epsilon"), "float"),
    ("attention.head_count", ("num_attention_heads",), "int"),
    ("attention.head_count_kv", ("num_key_value_heads",), "int"),
    ("embedding_length", ("hidden_size",), "int"),
    ("context_length", ("max_position_embeddings",), "warn"),
    # MiniCPM's three scales (its modeling code: embeddings x scale_emb, each residual branch x scale_depth /
    # sqrt(layers), the last hidden state / (hidden_size / dim_model_base) before lm_head; conversion/minicpm.py:21-31)
    ("embedding_scale", ("scale_emb",), "float"),
    ("residual_scale", ("=scale_depth / sqrt(num_hidden_layers)",), "float"),
    ("logit_scale", ("=hidden_size / dim_model_base",), "float"),
)


def _num(cfg: dict, key: str) -> float | None:
    v = cfg.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _quotient(cfg: dict, num: str, den: str, root: bool = False) -> float | None:
    """cfg[num] / cfg[den] (or / sqrt(cfg[den])); None when either is missing or the divisor is zero."""
    a, b = _num(cfg, num), _num(cfg, den)
    return None if a is None or not b else a / (b ** 0.5 if root else b)


# values the model's code derives from config keys ("=" paths of KEYS)
DERIVED = {
    "scale_depth / sqrt(num_hidden_layers)": lambda c: _quotient(c, "scale_depth", "num_hidden_layers", root=True),
    "hidden_size / dim_model_base": lambda c: _quotient(c, "hidden_size", "dim_model_base"),
}


def hf_config(hf_dir: str | Path, trust_remote_code: bool = False) -> tuple[dict, str]:
    """The text model's config as a dict and where it came from ("transformers" or "config.json")."""
    hf_dir = Path(hf_dir)
    try:
        # transformers: only the conformance run; the except falls back to config.json
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(str(hf_dir), trust_remote_code=trust_remote_code)
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        return text.to_dict(), "transformers"
    except Exception:  # an architecture this transformers does not know: the file itself
        data = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
        text = data.get("text_config")
        return ({**data, **text} if isinstance(text, dict) else data), "config.json"


def _rope(cfg: dict, which: str) -> dict:
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(rp, dict):
        return {}
    if "full_attention" in rp or "sliding_attention" in rp:
        return rp.get("full_attention" if which == "full" else "sliding_attention") or {}
    return rp if which == "full" else {}


def hf_value(cfg: dict, paths: tuple[str, ...]) -> tuple[Any, str | None]:
    for path in paths:
        if path.startswith("="):
            v, where = DERIVED[path[1:]](cfg), path[1:]
        elif path.startswith("rope:"):
            which, key = path[5:].split(".", 1)
            v = _rope(cfg, which).get(key)
            where = f"{'rope_parameters' if 'rope_parameters' in cfg else 'rope_scaling'}.{key}"
        else:
            v, where = cfg.get(path), path
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            return v, where
    return None, None


def same(kind: str, gguf_v: float, hf_v: float) -> bool:
    if kind == "int":
        return int(gguf_v) == int(hf_v) and float(gguf_v) == float(hf_v)
    return abs(float(gguf_v) - float(hf_v)) <= REL_TOL * max(abs(float(hf_v)), 1e-30)


def check_hparams(recipe_name: str, metadata: dict, hf_dir: str | Path, trust_remote_code: bool = False) -> dict:
    """Compare the GGUF ``metadata`` (pipeline.gguf.read_header(...).metadata) with the HF config of ``hf_dir``."""
    t0 = time.monotonic()
    check = "hyperparameters"
    arch = metadata.get("general.architecture")
    cfg, source = hf_config(hf_dir, trust_remote_code)
    compared, not_compared, failures, warnings = [], [], [], []
    for key, paths, kind in KEYS:
        full = f"{arch}.{key}"
        g = metadata.get(full)
        h, where = hf_value(cfg, paths)
        if g is None or h is None:
            if g is not None or h is not None:
                not_compared.append({"key": full, "hf": where or paths[0].removeprefix("rope:").removeprefix("="),
                                     "why": "not in the GGUF" if g is None else "not in the HF config"})
            continue
        if isinstance(g, list) or not isinstance(g, (int, float)):
            not_compared.append({"key": full, "hf": where, "why": "per-layer array in the GGUF"})
            continue
        if key == "attention.head_count_kv" and f"{arch}.attention.kv_lora_rank" in metadata:
            # MLA is stored as MQA with wider heads: the converter writes one KV head (conversion/deepseek.py:324-326)
            not_compared.append({"key": full, "hf": where, "why": "MLA (kv_lora_rank): one KV head by design"})
            continue
        ok = same("int" if kind == "int" else "float", g, h)
        rel = abs(float(g) - float(h)) / max(abs(float(h)), 1e-30)
        compared.append({"key": full, "hf": where, "gguf_value": g, "hf_value": h, "equal": ok,
                         "relative_difference": rel})
        if not ok:
            line = fail_line(recipe_name, check, f"{full} = {g:g} in the GGUF, {where} = {h:g} in the HF config "
                                                 f"(relative difference {rel:.3g}, tolerance {REL_TOL:g})")
            (warnings if kind == "warn" else failures).append(line)
    return {"passed": not failures, "source": source, "architecture": arch, "compared": compared,
            "not_compared": not_compared, "tolerance": REL_TOL, "failures": failures, "warnings": warnings,
            "seconds": round(time.monotonic() - t0, 3)}
