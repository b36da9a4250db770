"""A function-preserving random rotation of a llama-like checkpoint's residual stream (issue #19).

The demo weights are dequantized from a Q4_1 GGUF, so every 32-weight block of a linear layer sits exactly on
a 16-level grid; re-quantizing such weights says little about a quant type's quality per byte. This module
moves them off every grid without changing the function, by the computational invariance of RMSNorm decoders
that QuaRot (Ashkboos et al., 2024, arXiv:2404.00456) and SpinQuant (Liu et al., 2024, arXiv:2405.16406) use,
following SliceGPT (Ashkboos et al., 2024, arXiv:2401.15024):

1. every RMSNorm scale ``w`` is folded into the linear layers that read the normalised stream (``W -> W diag(w)``:
   input_layernorm into q/k/v_proj, post_attention_layernorm into gate/up_proj, model.norm into lm_head) and
   set to 1;
2. with a random orthogonal ``Q`` (d x d, Haar-distributed, :func:`random_orthogonal`) the residual stream
   ``x`` becomes ``x Q``: ``embed_tokens -> E Q``; the layers reading it (HF ``Linear`` weights are out x in,
   ``y = x W^T``) ``W -> W Q``; the layers writing it (o_proj, down_proj) ``W -> Q^T W``; the (untied) head
   ``lm_head -> (lm_head diag(w_final)) Q``. An RMSNorm with unit scale commutes with ``Q`` (``||x Q|| = ||x||``),
   so every output is unchanged up to float error.

The work is done in float64 and saved as float16 safetensors (what the demo's source holds); only numpy and
``safetensors.numpy`` are used. Refused, in one line naming the file and the field or tensor: another
architecture than llama / mistral, biases (attention_bias, mlp_bias, any ``.bias`` tensor), a norm other than
RMSNorm, a quantized checkpoint, tensors this mapping does not know.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from pipeline.errors import PipelineError
from pipeline.fsutil import atomic_output

ROTATION_VERSION = 1  # part of the rotated demo's commit id: bump it when the output of the same input changes
MODEL_TYPES = ("llama", "mistral")
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
FLOAT16_MAX = float(np.finfo(np.float16).max)

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
READS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",  # x W^T from the stream
         "mlp.gate_proj.weight", "mlp.up_proj.weight")
WRITES = ("self_attn.o_proj.weight", "mlp.down_proj.weight")  # added to the stream
NORM_OF = {"self_attn.q_proj.weight": "input_layernorm.weight", "self_attn.k_proj.weight": "input_layernorm.weight",
           "self_attn.v_proj.weight": "input_layernorm.weight", "mlp.gate_proj.weight": "post_attention_layernorm.weight",
           "mlp.up_proj.weight": "post_attention_layernorm.weight"}
NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")
PASSED = ("self_attn.rotary_emb.inv_freq",)  # buffers some older checkpoints hold: copied as they are


def random_orthogonal(d: int, seed: int) -> np.ndarray:
    """A Haar-distributed random orthogonal d x d matrix (float64), fixed by ``seed``: the Q of the QR
    decomposition of a standard Gaussian matrix (numpy ``default_rng(seed)``), its columns' signs fixed so that
    R has a positive diagonal (Mezzadri 2007, "How to generate random matrices from the classical compact
    groups"; without the fix the distribution is not Haar)."""
    z = np.random.default_rng(seed).standard_normal((d, d))
    q, r = np.linalg.qr(z)
    return q * np.sign(np.diag(r))


def _refuse(path: Path, what: str) -> PipelineError:
    return PipelineError(f"{path}: {what}; the rotation handles llama/mistral-like RMSNorm decoders without biases")


def check_config(src_dir: str | Path) -> dict:
    """The config of ``src_dir`` when the rotation applies to it; PipelineError (one line) otherwise."""
    path = Path(src_dir) / "config.json"
    if not path.is_file():
        raise PipelineError(f"{path}: missing: the rotation needs an HF checkpoint folder")
    cfg = json.loads(path.read_text())
    if cfg.get("model_type") not in MODEL_TYPES:
        raise _refuse(path, f"model_type: {cfg.get('model_type')!r} is not one of {', '.join(MODEL_TYPES)}")
    archs = cfg.get("architectures") or []
    if not archs or any(a not in ARCHITECTURES for a in archs):
        raise _refuse(path, f"architectures: {archs!r} is not one of {', '.join(ARCHITECTURES)}")
    for field in ("attention_bias", "mlp_bias"):
        if cfg.get(field):
            raise _refuse(path, f"{field}: true (biases)")
    if "quantization_config" in cfg:
        raise _refuse(path, "quantization_config: a quantized checkpoint")
    if "rms_norm_eps" not in cfg or any(k in cfg for k in ("layer_norm_eps", "layer_norm_epsilon", "norm_type")):
        raise _refuse(path, "rms_norm_eps: absent or beside another norm's field (not an RMSNorm model)")
    for field in ("hidden_size", "num_hidden_layers"):
        if not isinstance(cfg.get(field), int) or cfg[field] <= 0:
            raise _refuse(path, f"{field}: {cfg.get(field)!r} is not a positive integer")
    return cfg


def _load(src_dir: Path) -> dict[str, np.ndarray]:
    files = sorted(src_dir.glob("*.safetensors"))
    if not files:
        raise PipelineError(f"{src_dir}: no *.safetensors file (the rotation reads safetensors checkpoints only)")
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        for name, t in load_file(f).items():
            if name in tensors:
                raise PipelineError(f"{f}: {name}: tensor in two files")
            tensors[name] = t
    return tensors


def _expected_names(n_layers: int) -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    for i in range(n_layers):
        names |= {f"model.layers.{i}.{s}" for s in (*READS, *WRITES, *NORMS)}
    return names


def rotate_tensors(tensors: dict[str, np.ndarray], q: np.ndarray, n_layers: int, where: str = "weights") -> dict:
    """Fold the RMSNorm scales and rotate (module doc) a llama state dict; returns the new one (float64, with an
    ``lm_head.weight`` of its own). ``where`` names the source in errors."""
    d = q.shape[0]
    for name in tensors:
        if name.endswith(".bias"):
            raise PipelineError(f"{where}: {name}: a bias tensor; the rotation handles models without biases")
    known = _expected_names(n_layers) | {"lm_head.weight"}
    passed = {n for n in tensors if (m := _LAYER.match(n)) and m.group(2) in PASSED}
    unknown = sorted(set(tensors) - known - passed)
    if unknown:
        raise PipelineError(f"{where}: {unknown[0]}: a tensor the llama rotation does not know"
                            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    missing = sorted(_expected_names(n_layers) - set(tensors))
    if missing:
        raise PipelineError(f"{where}: {missing[0]}: missing" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))

    def f64(name: str) -> np.ndarray:
        return np.asarray(tensors[name], dtype=np.float64)

    out: dict[str, np.ndarray] = {n: np.asarray(tensors[n]) for n in passed}
    embed = f64("model.embed_tokens.weight")
    if embed.ndim != 2 or embed.shape[1] != d:
        raise PipelineError(f"{where}: model.embed_tokens.weight: shape {embed.shape}, expected (vocab, {d})")
    out["model.embed_tokens.weight"] = embed @ q
    head = f64("lm_head.weight") if "lm_head.weight" in tensors else embed  # tied: untied here
    out["lm_head.weight"] = (head * f64("model.norm.weight")) @ q
    out["model.norm.weight"] = np.ones(d)
    for i in range(n_layers):
        p = f"model.layers.{i}."
        for s in READS:
            w = f64(p + s)
            if w.ndim != 2 or w.shape[1] != d:
                raise PipelineError(f"{where}: {p + s}: shape {w.shape}, expected (out, {d})")
            out[p + s] = (w * f64(p + NORM_OF[s])) @ q  # W diag(w_norm) Q
        for s in WRITES:
            w = f64(p + s)
            if w.ndim != 2 or w.shape[0] != d:
                raise PipelineError(f"{where}: {p + s}: shape {w.shape}, expected ({d}, in)")
            out[p + s] = q.T @ w
        for s in NORMS:
            out[p + s] = np.ones(d)
    return out


def _card(src_dir: Path, seed: int, source: str) -> str:
    """The source's model card front matter (license, languages) and a body saying how the folder was made."""
    front = ""
    card = src_dir / "README.md"
    if card.is_file():
        text = card.read_text(encoding="utf-8", errors="replace")
        if text.startswith("---\n") and "\n---\n" in text[3:]:
            front = text[: text.index("\n---\n", 3) + 5]
    return front + (
        f"# {source} rotated (seed {seed}, ggufpipe rotation v{ROTATION_VERSION})\n\n"
        "The same function as the source, with weights on no quantization grid: every RMSNorm scale folded into\n"
        "the linear layers after it (norms set to 1), then the residual stream rotated by a Haar-random orthogonal\n"
        f"matrix (numpy `default_rng({seed})`, QR of a Gaussian, float64), as in QuaRot / SpinQuant; the embeddings\n"
        "untied (lm_head written). Saved as float16. Made by `pipeline/rotate.py` (`rotate_llama`); see\n"
        "docs/rotation.md.\n"
    )


def rotate_llama(src_dir: str | Path, out_dir: str | Path, seed: int = 0, source: str | None = None) -> dict:
    """Write a rotated copy of the llama-like HF checkpoint ``src_dir`` into ``out_dir`` (atomically; module doc):
    ``model.safetensors`` (float16), ``config.json`` (``tie_word_embeddings: false``), a model card naming
    ``source`` (default: the folder name), every other file copied unchanged. Returns a summary (seed, hidden
    size, layers, what was folded, the largest weight written)."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    cfg = check_config(src_dir)
    d, n_layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    tensors = _load(src_dir)
    tied = "lm_head.weight" not in tensors
    rotated = rotate_tensors(tensors, random_orthogonal(d, seed), n_layers, str(src_dir))
    del tensors
    peak = max(float(np.abs(t).max()) for t in rotated.values() if t.dtype.kind == "f")
    if peak > FLOAT16_MAX:
        raise PipelineError(f"{src_dir}: a rotated weight reaches {peak:.4g}, beyond float16")

    with atomic_output(out_dir) as tmp:
        tmp.mkdir()
        skip = {"config.json", "README.md", "model.safetensors.index.json"}
        for f in sorted(src_dir.iterdir()):
            if f.is_file() and f.name not in skip and f.suffix != ".safetensors":
                shutil.copyfile(f, tmp / f.name)
        save_file({n: (t.astype(np.float16) if t.dtype.kind == "f" else t) for n, t in sorted(rotated.items())},
                  str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "model.safetensors").chmod(0o644)
        cfg = {**cfg, "tie_word_embeddings": False, "torch_dtype": "float16"}
        if "dtype" in cfg:
            cfg["dtype"] = "float16"
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        (tmp / "README.md").write_text(_card(src_dir, seed, source or src_dir.name), encoding="utf-8")
    return {
        "seed": seed,
        "rotation_version": ROTATION_VERSION,
        "hidden_size": d,
        "layers": n_layers,
        "folded": [f"{n_layers} x input_layernorm -> q/k/v_proj", f"{n_layers} x post_attention_layernorm -> gate/up_proj",
                   "model.norm -> lm_head"],
        "untied": tied,
        "max_abs_weight": round(peak, 4),
    }


# --------------------------------------------------------------------------- grid measure


def grid_fraction(w: np.ndarray, kind: str = "q4_1", block: int = 32) -> float:
    """Fraction of the ``block``-weight blocks along the rows of ``w`` (float16 values) that a llama.cpp block
    format represents exactly, within float16 rounding: ``q4_1`` (x = d q + m, q in 0..15: min and max of the
    block fix d and m) or ``q8_0`` (x = d q, q in -127..127: the absolute maximum fixes d). A block is
    representable when every weight lies within 2.5 float16 ulps (at the block's largest magnitude) of the
    grid those values imply. Weights dequantized from that format give 1.0; generic float weights about 0."""
    x = np.asarray(w, dtype=np.float64)
    if x.shape[-1] % block:
        raise ValueError(f"rows of {x.shape[-1]} weights do not split into blocks of {block}")
    x = x.reshape(-1, block)
    amax = np.abs(x).max(axis=1, keepdims=True)
    if kind == "q4_1":
        lo = x.min(axis=1, keepdims=True)
        d = (x.max(axis=1, keepdims=True) - lo) / 15.0
    elif kind == "q8_0":
        lo = np.zeros_like(amax)
        d = amax / 127.0
    else:
        raise ValueError(f"unknown grid {kind!r} (q4_1, q8_0)")
    safe = np.where(d > 0, d, 1.0)
    resid = np.abs(x - (lo + np.rint((x - lo) / safe) * safe))
    ulp = np.exp2(np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 10)
    ok = (resid <= 2.5 * ulp).all(axis=1) | (d[:, 0] == 0)
    return float(ok.mean())
