"""Check 2, logit fidelity (HF float32 against the base logits of eval-base). (see pipeline/stages/conformance/__init__.py)."""

from __future__ import annotations

import gc
import inspect
import json
import math
import os
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.bounds import above, below
from pipeline.errors import PipelineError
from pipeline.stages.conformance.common import DEFAULT_CHUNKS, GIB, THRESHOLDS, fail_line

# --------------------------------------------------------------------------- 2. logit fidelity


def mem_available() -> int:
    """MemAvailable of /proc/meminfo in bytes (0 when it cannot be read)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def hf_parameter_count(hf_dir: str | os.PathLike) -> int:
    """Parameters of an HF folder, from its safetensors headers (no tensor is read); pickled weights are
    counted as 2 bytes a parameter."""
    hf_dir = Path(hf_dir)
    total = 0
    files = sorted(hf_dir.glob("*.safetensors"))
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for key, info in header.items():
            if key != "__metadata__":
                total += math.prod(info["shape"])
    if not files:
        total = sum(f.stat().st_size for f in hf_dir.glob("*.bin")) // 2
    return total


def _load_hf_model(hf_dir: Path, trust_remote_code: bool, what: str):
    # torch, transformers: only the conformance run loads them (stage modules load at every start-up)
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32,
                                                     trust_remote_code=trust_remote_code, low_cpu_mem_usage=True)
    except Exception as exc:  # one line for whatever the loader raises
        raise PipelineError(f"{what}: the HF model in {hf_dir} cannot be loaded in float32: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    model.eval()
    return model


def _scored_logits(model, ids, first: int, n_ctx: int, what: str):
    """float32 logits (n_ctx - 1 - first, vocab) of positions first .. n_ctx-2 for one chunk."""
    # torch: only the conformance run loads it
    import torch

    x = torch.as_tensor(ids, dtype=torch.long)[None]
    kwargs: dict[str, Any] = {"use_cache": False}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = n_ctx - first  # positions first .. n_ctx-1
    try:
        with torch.inference_mode():
            logits = model(input_ids=x, **kwargs).logits[0]
    except (RuntimeError, ValueError, IndexError) as exc:  # e.g. a context longer than the model's positions
        raise PipelineError(f"{what}: the HF model failed on a chunk of {n_ctx} tokens: {type(exc).__name__}: "
                            f"{' '.join(str(exc).split())[:200]}") from None
    return logits[-(n_ctx - first):-1].float()  # with or without logits_to_keep: the last n_ctx - first rows


def percentile(values, fraction: float) -> float:
    """llama-perplexity's percentile (linear interpolation between order statistics, perplexity.cpp:1931-1937)."""
    # numpy: every Snakefile and CLI start loads this module; only measuring needs it
    import numpy as np

    v = np.sort(np.asarray(values, dtype=np.float64))
    if not len(v):
        return float("nan")
    p = fraction * (len(v) - 1)
    i = int(p)
    return float((1 - (p - i)) * v[i] + (p - i) * v[min(i + 1, len(v) - 1)])


def compare_distributions(base_lp, other_logits, targets, floor: float | None = -16.0, block: int = 32) -> dict:
    """Per position: KLD(base || other) over the base tokens with log-prob > ``floor`` (llama.cpp's rule; None:
    all), same top (first argmax of each), and both sides' nll of the target. ``base_lp`` float32/64 log-probs
    (rows, n_vocab); ``other_logits`` a torch tensor of raw logits (rows, >= n_vocab)."""
    # numpy, torch: only the conformance run loads them
    import numpy as np
    import torch

    n_rows, n_vocab = base_lp.shape
    kld, nll_other = np.empty(n_rows), np.empty(n_rows)
    for lo in range(0, n_rows, block):  # float64 temporaries of a few rows at a time (a 256k vocabulary...)
        hi = min(lo + block, n_rows)
        other_lp = torch.log_softmax(other_logits[lo:hi].double(), dim=-1)[:, :n_vocab].numpy()
        b = np.asarray(base_lp[lo:hi])
        b64 = b.astype(np.float64)
        terms = np.exp(b64) * (b64 - other_lp)
        if floor is not None:
            terms[b <= np.float32(floor)] = 0.0
        kld[lo:hi] = terms.sum(axis=1)
        nll_other[lo:hi] = -other_lp[np.arange(hi - lo), targets[lo:hi]]
    rows = np.arange(n_rows)
    return {
        "kld": kld,
        "same_top": np.argmax(base_lp, axis=1) == other_logits[:, :n_vocab].argmax(dim=-1).numpy(),
        "nll_base": -np.asarray(base_lp)[rows, targets].astype(np.float64),
        "nll_other": nll_other,
    }


def _summarise(parts: list[dict], clamped) -> dict:
    # numpy: only the conformance run loads it
    import numpy as np

    kld = np.concatenate([p["kld"] for p in parts])
    same = np.concatenate([p["same_top"] for p in parts])
    nb = np.concatenate([p["nll_base"] for p in parts])
    no = np.concatenate([p["nll_other"] for p in parts])
    ok = ~clamped if clamped is not None else np.ones_like(nb, dtype=bool)
    out = {
        "positions": int(len(kld)),
        "top1": float(same.mean()),
        "kld_mean": float(kld.mean()),
        "kld_p99": percentile(kld, 0.99),
        "kld_max": float(kld.max()),
        "ppl_base": float(np.exp(nb[ok].mean())),
        "ppl_other": float(np.exp(no[ok].mean())),
        "ln_ppl_ratio": float(no[ok].mean() - nb[ok].mean()),
    }
    if clamped is not None:
        out["clamped_targets"] = int(clamped.sum())
    return out


def hf_class_name(model) -> str:
    """The dotted name of the class transformers loaded (what the logit check ran)."""
    return f"{type(model).__module__}.{type(model).__qualname__}"


def check_logits(recipe_name: str, hf_dir: str | os.PathLike, logits_file: str | os.PathLike, add_bos: bool,
                 bos_id: int | None, chunks: int = DEFAULT_CHUNKS, trust_remote_code: bool = False,
                 awq_dir: str | os.PathLike | None = None, base_ppl: float | None = None,
                 available: int | None = None, n_tokens: int | None = None, outside: list[str] | None = None,
                 check: str = "logit fidelity") -> dict:
    """HF float32 against the GGUF's base logits (and, with ``awq_dir``, the AWQ-folded folder against the HF
    model: recorded, not gated). ``outside``: what the GGUF holds that neither side's logits run (recorded as is).
    See the module doc."""
    # numpy (and logitsfile's): only the conformance run loads it
    import numpy as np

    from pipeline.stages.logitsfile import read_logits_file

    t0 = time.monotonic()
    hf_dir = Path(hf_dir)
    what = f"conformance: recipe {recipe_name}: {check}"
    lf = read_logits_file(logits_file)
    # not this GGUF's logits (a stale eval-base): nothing can be measured
    if n_tokens is not None and lf.n_vocab != n_tokens:
        raise PipelineError(f"{what}: the base logits {logits_file} hold distributions over {lf.n_vocab} tokens, the "
                            f"GGUF's vocabulary has {n_tokens}: run eval-base again")
    if add_bos and bos_id is not None and lf.tokens[0] != bos_id:
        raise PipelineError(f"{what}: the base logits {logits_file} start with token {int(lf.tokens[0])}, the GGUF "
                            f"adds BOS {bos_id}: they were made with another vocabulary; run eval-base again")
    n = min(chunks, lf.n_chunk)
    params = hf_parameter_count(hf_dir)
    need = 4 * params + 2 * GIB
    available = mem_available() if available is None else available
    out: dict[str, Any] = {"chunks": n, "chunks_asked": chunks, "n_ctx": lf.n_ctx, "n_vocab": lf.n_vocab, "parameters": params,
                           "needs_bytes": need, "available_bytes": available, "thresholds": dict(THRESHOLDS),
                           "bos_substituted": bool(add_bos and bos_id is not None), "failures": [], "warnings": []}
    if outside:
        out["outside"] = list(outside)
    if need > available:
        note = (f"not run: needs {need / GIB:.1f} GiB (4 x {params / 1e9:.2f}B parameters + 2 GiB), "
                f"{available / GIB:.1f} GiB available")
        out.update(passed=True, run=False, note=note, seconds=round(time.monotonic() - t0, 3))
        out["warnings"].append(fail_line(recipe_name, check, note))
        return out
    bos = bos_id if add_bos else None
    model = _load_hf_model(hf_dir, trust_remote_code, what)
    out["hf_class"] = hf_class_name(model)
    out["load_seconds"] = round(time.monotonic() - t0, 3)
    keep_dir = tempfile.TemporaryDirectory(prefix="ggufpipe-conformance-") if awq_dir else None
    try:
        parts, clamped = [], []
        for c in range(n):
            logits = _scored_logits(model, lf.model_input(c, bos), lf.first, lf.n_ctx, what)
            if logits.shape[1] < lf.n_vocab:
                out.update(passed=False, run=False, note=f"the HF model has {logits.shape[1]} logits",
                           seconds=round(time.monotonic() - t0, 3))
                out["failures"].append(fail_line(recipe_name, check, f"the HF model has {logits.shape[1]} logits, "
                                                 f"the GGUF's vocabulary {lf.n_vocab} tokens"))
                return out
            if keep_dir is not None:
                np.save(Path(keep_dir.name) / f"{c}.npy", logits.numpy())
            parts.append(compare_distributions(lf.log_probs(c), logits, lf.targets(c)))
            clamped.append(lf.target_clamped(c))
        out["hf_seconds"] = round(time.monotonic() - t0 - out["load_seconds"], 3)
        del model
        gc.collect()
        m = _summarise(parts, np.concatenate(clamped))
        out.update(run=True, positions=m["positions"], top1=m["top1"], kld_mean=m["kld_mean"], kld_p99=m["kld_p99"],
                   kld_max=m["kld_max"], ppl_llama=m["ppl_base"], ppl_hf=m["ppl_other"],
                   ln_ppl_ratio=m["ln_ppl_ratio"], clamped_targets=m["clamped_targets"],
                   ppl_llama_mean_base=lf.mean_ppl_base(n))
        if base_ppl is not None:
            out["ppl_eval_base_record"] = base_ppl  # llama-perplexity's exact PPL over all the eval set's chunks
        out["failures"] += _logit_failures(recipe_name, check, m, n)
        if awq_dir is not None:
            out["awq"] = _awq_against_hf(Path(awq_dir), Path(keep_dir.name), lf, n, bos, trust_remote_code, what)
    finally:
        if keep_dir is not None:
            keep_dir.cleanup()
    out["passed"] = not out["failures"]
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


def _logit_failures(recipe_name: str, check: str, m: dict, n: int) -> list[str]:
    t = THRESHOLDS
    where = f"HF float32 vs the GGUF on {m['positions']} positions of {n} chunks"
    out = []
    # NaN logits (a broken model or conversion) give NaN statistics: each fails (pipeline/bounds.py below/above)
    if below(m["top1"], t["min_top1"]):
        out.append(fail_line(recipe_name, check, f"top-1 agreement {m['top1']:.4f} < {t['min_top1']} ({where})"))
    if above(m["kld_mean"], t["max_kld_mean"]):
        out.append(fail_line(recipe_name, check, f"mean KLD {m['kld_mean']:.3g} > {t['max_kld_mean']:g} ({where})"))
    if above(m["kld_p99"], t["max_kld_p99"]):
        out.append(fail_line(recipe_name, check, f"p99 KLD {m['kld_p99']:.3g} > {t['max_kld_p99']:g} ({where})"))
    if above(abs(m["ln_ppl_ratio"]), t["max_abs_ln_ppl_ratio"]):
        out.append(fail_line(recipe_name, check, f"|ln(PPL HF / PPL llama.cpp)| = {abs(m['ln_ppl_ratio']):.4g} > "
                             f"{t['max_abs_ln_ppl_ratio']} (PPL HF {m['ppl_other']:.4f}, llama.cpp "
                             f"{m['ppl_base']:.4f}; {where})"))
    return out


def _awq_against_hf(awq_dir: Path, saved: Path, lf, n: int, bos, trust_remote_code: bool, what: str) -> dict:
    """The AWQ-folded folder against the original HF model's logits (saved per chunk): KLD(HF || AWQ) over
    every token, top-1, ln PPL ratio. Recorded, not gated."""
    # numpy, torch: only the conformance run loads them
    import numpy as np
    import torch

    t0 = time.monotonic()
    model = _load_hf_model(awq_dir, trust_remote_code, f"{what}: awq")
    parts = []
    for c in range(n):
        hf_logits = torch.from_numpy(np.load(saved / f"{c}.npy"))
        hf_lp = torch.log_softmax(hf_logits.double(), dim=-1)[:, :lf.n_vocab].numpy()
        awq_logits = _scored_logits(model, lf.model_input(c, bos), lf.first, lf.n_ctx, f"{what}: awq")
        parts.append(compare_distributions(hf_lp, awq_logits, lf.targets(c), floor=None))
    del model
    gc.collect()
    m = _summarise(parts, None)
    return {"reference": "the HF model (float32)", "compared": f"{awq_dir.name} (float32)", "gated": False,
            "positions": m["positions"], "top1": m["top1"], "kld_mean": m["kld_mean"], "kld_p99": m["kld_p99"],
            "kld_max": m["kld_max"], "ppl_hf": m["ppl_base"], "ppl_awq": m["ppl_other"],
            "ln_ppl_ratio": m["ln_ppl_ratio"], "seconds": round(time.monotonic() - t0, 3)}
