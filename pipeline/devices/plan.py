"""What a recipe's build will need, before it runs: disk per output, RAM per stage, the Slurm resources of each rule
(``ggufpipe plan``, the Snakefile's pre-flight; docs/planning.md).

Everything is predicted from the source checkpoint's ``config.json`` and its safetensors headers (each tensor's
dtype and shape; the 8-byte length and JSON at the start of every ``*.safetensors`` file), or, where only the
index is at hand (``model.safetensors.index.json``: tensor names and ``metadata.total_size``), from shapes derived
from ``config.json`` (a Llama-style decoder: :func:`config_tensors`).

- **disk** (:func:`disk_plan`): the snapshot, the base GGUF (2-D weights at the outtype, 1-D in F32, each padded to
  32 bytes, plus the metadata: the vocabulary's strings from ``tokenizer.json``), each quant (per tensor the type
  llama-quantize picks, :func:`quant_tensor_type`, a condensed ``llama_tensor_get_type`` of src/llama-quant.cpp with
  its shape fallbacks), the base logits (:func:`pipeline.stagedef.logits_bytes`), shards, the AWQ copy and its GGUF.
- **RAM** (:func:`ram_plan`): the peak RSS (VmHWM) of the largest process of each stage: the converter (Python,
  the safetensors mapped), llama-quantize, llama-perplexity / llama-imatrix (llama.cpp's buffers, the components of
  :func:`pipeline.memory.components` of the :func:`model_shape` the GGUF will have: :func:`llama_run_bytes`), AutoAWQ
  and the conformance stage's float32 HF forward. Constants measured on this machine: :data:`RAM_FIT`.
- **Slurm**, jobs and the pre-flight: :mod:`pipeline.devices.plan_jobs` (the ``resources:`` each stage declares, so
  ``ggufpipe plan`` evaluates the very expressions Snakemake does).
- **free memory** (:func:`free_memory`): MemAvailable from /proc/meminfo, or from the file ``GGUFPIPE_MEMINFO``
  names (the tests' fake meminfo).
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.devices.plan_source import Facts, _numel
from pipeline.devices.plan_tensors import (
    is_expert,
    merge_experts,
    never_quantized,
    tensor_role,
)
from pipeline.errors import PipelineError
from pipeline.gguf.types import GGML_TYPE_CODES, GGML_TYPES, tensor_nbytes
from pipeline.memory import (
    FIT,
    TENSOR_ALIGNMENT,
    ModelShape,
    TensorShape,
    components,
    experts,
    pad,
)
from pipeline.stagedef import logits_bytes

MIB = 1 << 20
GIB = 1 << 30

# the source checkpoint's facts: pipeline/devices/plan_source.py


# ------------------------------------------------------------------ GGUF sizes
def _type_bytes(type_name: str, n: int) -> int:
    if type_name not in GGML_TYPE_CODES:
        raise PipelineError(f"unknown ggml type {type_name}")
    return tensor_nbytes(GGML_TYPE_CODES[type_name], (n,))


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


# default tensor type of each llama-quantize ftype (src/llama-quant.cpp: llama_model_quantize_impl)
FTYPE_BASE = {"Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0", "Q5_1": "Q5_1", "Q8_0": "Q8_0", "F16": "F16",
              "BF16": "BF16", "Q2_K": "Q2_K", "Q2_K_S": "Q2_K", "Q3_K_S": "Q3_K", "Q3_K_M": "Q3_K", "Q3_K_L": "Q3_K",
              "Q4_K_S": "Q4_K", "Q4_K_M": "Q4_K", "Q5_K_S": "Q5_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K",
              "IQ4_NL": "IQ4_NL", "IQ4_XS": "IQ4_XS", "TQ1_0": "TQ1_0", "TQ2_0": "TQ2_0"}
# src/llama-quant.cpp:400-440 (tensor_type_fallback): a row length the type's block does not divide
_FALLBACK = {**dict.fromkeys(("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS"), "IQ4_NL"),
             **dict.fromkeys(("Q2_0", "Q2_K", "Q3_K", "TQ1_0", "TQ2_0"), "Q4_0"), "Q4_K": "Q5_0", "Q5_K": "Q5_1",
             "Q6_K": "Q8_0"}


def _block(type_name: str) -> int:
    return GGML_TYPES[GGML_TYPE_CODES[type_name]][1]


def quant_tensor_type(ftype: str, role: str, layer: int, n_layer: int, ncols: int, tied: bool, n_gqa: int = 1,
                      n_expert: int = 0) -> str:
    """The type llama-quantize gives a 2-D weight (condensed ``llama_tensor_get_type_impl``, src/llama-quant.cpp:
    475-700 of b11312, no importance matrix): the output matrix (or the tied embedding) at Q6_K, ``attn_v`` /
    ``ffn_down`` / ``attn_output`` / ``attn_qkv`` raised per ftype and layer (``use_more_bits``), ``attn_k`` /
    ``attn_v`` at Q8_0 in a model of exactly 8 experts, then the shape fallback (src/llama-quant.cpp:400-440). The one copy of that rule here: ``ggufpipe plan`` and
    ``ggufpipe init`` use it; the real plan of a quant is llama-quantize's own dry run (pipeline/stages/quant_plan.py)."""
    t = FTYPE_BASE.get(ftype, "Q8_0")
    if t in ("F16", "BF16"):
        return t
    if role == "output" or (tied and role == "token_embd"):
        t = "Q8_0" if (ncols % 256 or t == "Q8_0") else "Q6_K"
    elif role == "attn_v":
        t = {"Q2_K": "Q4_K" if n_gqa >= 4 else "Q3_K", "Q3_K_M": "Q5_K" if layer < 2 else "Q4_K", "Q3_K_L": "Q5_K",
             "Q4_K_S": "Q5_K" if layer < 4 else t}.get(ftype, t)
        if ftype in ("Q4_K_M", "Q5_K_M") and _use_more_bits(layer, n_layer):
            t = "Q6_K"
    elif role == "ffn_down":
        if ftype == "Q2_K":
            t = "Q3_K"
        elif ftype == "Q3_K_M":
            t = "Q5_K" if layer < n_layer // 16 else "Q4_K"
        elif ftype == "Q3_K_L":
            t = "Q5_K"
        elif ftype in ("Q4_K_M", "Q5_K_M") and _use_more_bits(layer, n_layer):
            t = "Q6_K"
        elif ftype == "Q4_K_S" and layer < n_layer // 8:
            t = "Q5_K"
    elif role == "attn_output":
        t = {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K"}.get(ftype, t)
    elif role == "attn_qkv":
        t = {"Q3_K_M": "Q4_K", "Q4_K_M": "Q5_K", "Q5_K_M": "Q6_K"}.get(ftype, t)
    if n_expert == 8 and role in ("attn_v", "attn_k"):  # exactly 8 experts: src/llama-quant.cpp:599-610
        t = "Q8_0"
    if ncols % _block(t):
        t = _FALLBACK.get(t, t)
        if ncols % _block(t):
            t = "F16"
    return t


def _header_bytes(facts: Facts, n_tensors: int) -> int:
    """GGUF metadata + tensor infos, padded: the vocabulary arrays, ~8 KiB of other keys (chat template, ids,
    hyperparameters) and per tensor its info (name ~24 B, dims, type, offset)."""
    return pad(24 + facts.vocab_bytes + 8192 + n_tensors * (8 + 28 + 4 + 4 * 8 + 4 + 8), TENSOR_ALIGNMENT)


def model_shape(facts: Facts, ftype: str):
    """The :class:`pipeline.memory.ModelShape` of the GGUF the build will write from ``facts`` (config.json
    + safetensors headers) at ``ftype`` (the base's F16/BF16 or a llama-quantize ftype): per tensor the type
    :func:`quant_tensor_type` picks (1-D tensors, biases and norms in F32), each padded in the data section."""
    n_gqa = facts.n_head // max(facts.n_head_kv, 1)
    tensors, offset, n_vocab = [], 0, facts.n_vocab
    for name, shape, _ in merge_experts(facts.tensors):
        role, layer = tensor_role(name)
        if len(shape) < 2 or name.endswith((".bias", "norm.weight")) or never_quantized(name):
            t, matmul = "F32", len(shape) > 1
        else:
            t = quant_tensor_type(ftype, role, layer, facts.n_layer, int(shape[-1]), facts.tied, n_gqa,
                                  facts.n_expert)
            matmul = role != "token_embd" and "position" not in name
            if role == "token_embd":
                n_vocab = int(shape[0])
        n = _type_bytes(t, _numel(shape))
        tensors.append(TensorShape(name, tuple(int(d) for d in reversed(shape)), t, n, offset, role, matmul))
        offset += pad(n)
    return ModelShape(
        architecture=facts.model_type, n_layer=facts.n_layer, n_embd=facts.n_embd, n_ff=facts.n_ff,
        n_head_kv=[facts.n_head_kv] * facts.n_layer, head_k=facts.head_dim, head_v=facts.head_dim, n_vocab=n_vocab,
        tensors=tensors, metadata_bytes=_header_bytes(facts, len(tensors)), weights=offset, n_merges=facts.n_merges,
        swa=list(facts.swa), n_swa=facts.n_swa, source=f"{facts.origin}, {ftype}", n_expert=facts.n_expert,
        n_expert_used=facts.n_expert_used, recurrent=list(facts.recurrent), recurrent_bytes=facts.recurrent_bytes)


def moe_plan(facts: Facts, keys: list[str]) -> dict | None:
    """A mixture of experts' parameters (total, active per token) and, per model file, its routed-expert bytes (all
    mapped, ``n_expert_used / n_expert`` of them read per token) and the rest, with the largest layer's experts: what
    ``-cmoe`` / ``-ncmoe N`` keep on the CPU of a GPU box (the experts regex ``\\.ffn_(up|down|gate|gate_up)_(ch|)exps``,
    common/common.h:1198; shared experts stay with the other weights). None for a dense model."""
    if facts.n_expert < 2:
        return None
    files = {}
    for key in keys:
        s = model_shape(facts, key)
        moe = experts(s)
        per_layer: dict[int, int] = {}
        for t in s.tensors:
            if is_expert(t.name):
                layer = tensor_role(t.name)[1]
                per_layer[layer] = per_layer.get(layer, 0) + t.n_bytes
        files[key] = {"expert_bytes": moe["expert_bytes"], "read_per_token": moe["expert_bytes_read_per_token"],
                      "other_bytes": s.metadata_bytes + s.weights - moe["expert_bytes"],
                      "layer_expert_bytes": max(per_layer.values(), default=0), "moe_layers": len(per_layer)}
    return {"n_expert": facts.n_expert, "n_expert_used": facts.n_expert_used, "params_total": facts.n_params,
            "params_active": facts.n_active, "files": files}


def gguf_bytes(facts: Facts, ftype: str) -> int:
    """Predicted size of the base GGUF (ftype F16/BF16) or of a quant of it (llama-quantize ftype name)."""
    s = model_shape(facts, ftype)
    return s.metadata_bytes + s.weights


def imatrix_bytes(facts: Facts) -> int:
    """llama-imatrix's GGUF: per matmul weight its in_sum2 (ncols floats) and counts, with their tensor infos."""
    mats = [s for n, s, _ in facts.tensors if len(s) == 2 and "embed_tokens" not in n]
    return 64 * 1024 + sum(int(s[-1]) * 4 + 4 + 2 * 96 for s in mats)


# ------------------------------------------------------------------ disk
def disk_plan(recipe, facts: Facts, hub_on_work_fs: bool = True) -> list[dict]:
    """One row per output the build writes: ``{"stage", "key", "what", "bytes"}``, in build order. The snapshot
    counts once (the fetched folder is hard links of the hub cache's files; ``hub_on_work_fs=False``: a copy)."""
    out = [{"stage": "fetch", "key": "", "what": "snapshot (hub cache)", "bytes": facts.snapshot_bytes}]
    if not hub_on_work_fs:
        out.append({"stage": "fetch", "key": "", "what": "work/<name>/hf (copy)", "bytes": facts.snapshot_bytes})
    base = gguf_bytes(facts, recipe.base_key)
    out.append({"stage": "convert", "key": recipe.base_key, "what": "base GGUF", "bytes": base})
    if recipe.awq is not None and any(q.awq for q in recipe.quants):
        n16 = sum(_numel(s) for _, s, _ in facts.tensors)
        out.append({"stage": "awq", "key": "", "what": "AWQ-scaled copy (FP16)", "bytes": 2 * n16 + facts.other_bytes})
        out.append({"stage": "convert_awq", "key": recipe.base_key, "what": "AWQ base GGUF", "bytes": base})
    for b in recipe.imatrix_bases if recipe.imatrix is not None else []:
        out.append({"stage": "imatrix", "key": b, "what": "importance matrix", "bytes": imatrix_bytes(facts)})
    for q in recipe.quants:
        out.append({"stage": "quantize", "key": q.key, "what": f"{q.type} GGUF", "bytes": gguf_bytes(facts, q.type)})
    for key in recipe.model_keys:
        if recipe.split_for(key):
            size = base if key in ("F16", "BF16") else next(
                (r["bytes"] for r in out if r["stage"] == "quantize" and r["key"] == key), base)
            out.append({"stage": "split", "key": key, "what": "shards", "bytes": size})
    for es in recipe.eval_sets:
        out.append({"stage": "eval_base", "key": es.name, "what": f"base logits (ctx {es.ctx} x {es.chunks})",
                    "bytes": logits_bytes(es.ctx, es.chunks, facts.n_vocab)})
    if recipe.device_slice:
        es = recipe.first_eval_set
        out.append({"stage": "device_slice", "key": "", "what": f"device slice (ctx {es.ctx} x {recipe.device_slice})",
                    "bytes": logits_bytes(es.ctx, recipe.device_slice, facts.n_vocab)})
    return out


# ------------------------------------------------------------------ RAM
# Measured on this machine (docs/planning.md: bench/plan_check.py, VmHWM of each stage on the tiny model and the demo).
RAM_FIT = {
    # the converter's Python (torch, transformers, gguf imported, the tokenizer loaded): the tiny model's convert
    # VmHWM (292.7 MiB) less its largest tensor's share; the demo's (451.5 MiB) is this + 6 B x its largest tensor
    "python_convert": 291 * MIB,
    "python_eval_stage": 37 * MIB,  # the eval-base stage's own Python (numpy, the token count): the tiny model's peak
    "python_awq": 520 * MIB,  # AutoAWQ's process before the model
    "python_conformance": 358 * MIB,  # torch, transformers, the stage: the tiny model's peak less its model
}


def llama_run_bytes(facts: Facts, ftype: str, ctx: int, n_outputs: int, kl: str | None = None,
                    kv_type: str = "f16") -> dict:
    """A llama.cpp CPU run's peak RSS on the ``ftype`` GGUF of ``facts``: :func:`pipeline.memory.components`
    of its :func:`model_shape` with ``n_outputs`` logits rows (llama-perplexity / llama-imatrix keep every token of a
    chunk), plus, in ``compute``, the tool's own buffers ``kl``: the ``--kl-divergence-base`` log-probabilities of
    llama-perplexity (``"base"``: a whole chunk as uint16, ``"quant"``: the scored half read back; ``"imatrix"``:
    llama-imatrix's copy of the chunk's logits for its perplexity, one more ``n_outputs x n_vocab`` floats: the
    demo's imatrix VmHWM is 91.6 MiB above the other components, its logits 96 MiB)."""
    p = components(model_shape(facts, ftype), ctx, kv_type, n_outputs=n_outputs)
    nv = 2 * ((facts.n_vocab + 1) // 2) + 4
    klbuf = {"base": ctx * nv * 2, "quant": (ctx - 1 - ctx // 2) * nv * 2,
             "imatrix": n_outputs * facts.n_vocab * 4}.get(kl or "", 0)
    p["compute"] += klbuf
    p["total"] += klbuf
    return p


def ram_plan(recipe, facts: Facts) -> list[dict]:
    """One row per stage kind: ``{"stage", "key", "bytes", "how"}`` (peak RSS of its largest process)."""
    rows = []
    rows.append({"stage": "convert", "key": recipe.base_key, "bytes": int(
        RAM_FIT["python_convert"] + 6 * facts.largest_tensor),
        "how": "Python + the largest tensor as read (F16) and in F32"})
    if recipe.awq is not None:
        a = recipe.awq
        n = facts.n_params
        acts = a.n_samples * a.seq_len * (facts.n_embd * 4 + facts.n_ff) * 4 * 2
        rows.append({"stage": "awq", "key": "", "bytes": int(RAM_FIT["python_awq"] + 4 * n + 2 * n + acts),
                     "how": "AutoAWQ: the model in float32 + the FP16 copy written + calibration activations"})
    if recipe.imatrix is not None:
        im = recipe.imatrix
        p = llama_run_bytes(facts, recipe.base_key, im.ctx, im.ctx, kl="imatrix")
        rows.append({"stage": "imatrix", "key": "plain", "bytes": p["total"], "how": _how(p)})
    for q in recipe.quants:
        rows.append({"stage": "quantize", "key": q.key, "bytes": int(
            FIT["process_base"] + facts.largest_tensor * (4 + 2) + _type_bytes("Q8_0", facts.largest_tensor)),
            "how": "llama-quantize: the largest tensor as read, in F32 and quantized"})
    for es in recipe.eval_sets:
        p = llama_run_bytes(facts, recipe.base_key, es.ctx, es.ctx, kl="base")
        rows.append({"stage": "eval_base", "key": es.name, "bytes": max(p["total"], RAM_FIT["python_eval_stage"]),
                     "how": _how(p)})
        for q in recipe.quants:
            p = llama_run_bytes(facts, q.type, es.ctx, es.ctx, kl="quant")
            rows.append({"stage": "eval", "key": f"{es.name}/{q.key}", "bytes": p["total"], "how": _how(p)})
    if recipe.device_slice:
        es = recipe.first_eval_set
        p = llama_run_bytes(facts, recipe.base_key, es.ctx, es.ctx, kl="quant")  # the base file on the slice
        rows.append({"stage": "device_slice", "key": "", "bytes": p["total"], "how": _how(p)})
    if recipe.conformance.enabled:
        ctx = recipe.first_eval_set.ctx if recipe.eval_sets else 512
        fwd = facts.n_vocab * ctx * 4 * 3 + ctx * (facts.n_embd * 16 + facts.n_ff * 3) * 4
        rows.append({"stage": "conformance", "key": "", "bytes": int(
            RAM_FIT["python_conformance"] + 4 * facts.n_params + fwd),
            "how": "the HF model in float32 (4 B/parameter) + one chunk's forward"})
    return rows


def _how(p: dict) -> str:
    keys = ("weights", "repack", "kv", "output", "compute", "overhead") if p["repack"] else (
        "weights", "kv", "output", "compute", "overhead")
    return ", ".join(f"{k} {p[k] / MIB:.0f}" for k in keys) + " MiB"


# ------------------------------------------------------------------ free memory and disk
def free_memory(meminfo_path: str | os.PathLike | None = None) -> int:
    """MemAvailable (bytes) of /proc/meminfo, or of the file ``meminfo_path`` / ``$GGUFPIPE_MEMINFO`` names."""
    path = meminfo_path or os.environ.get("GGUFPIPE_MEMINFO") or "/proc/meminfo"
    fields = {}
    for line in Path(path).read_text().splitlines():
        k, _, v = line.partition(":")
        parts = v.split()
        if parts and parts[0].isdigit():
            fields[k.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    if "MemAvailable" in fields:
        return fields["MemAvailable"]
    return fields.get("MemFree", 0) + fields.get("Cached", 0)


def free_disk(path: str | os.PathLike) -> tuple[int, int]:
    """(device, bytes free to an unprivileged writer) of the filesystem holding ``path`` (its nearest existing
    ancestor)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    return os.stat(p).st_dev, st.f_bavail * st.f_frsize


def fmt(n: float) -> str:
    for unit, size in (("EiB", 1 << 60), ("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", GIB), ("MiB", MIB),
                       ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
