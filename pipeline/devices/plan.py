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

import json
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.bounds import INT32_MAX, LLAMA_MAX_EXPERTS, LLAMA_MAX_LAYERS, SIZE_MAX, Range, integer
from pipeline.devices.plan_tensors import (
    config_recurrent,
    config_tensors,
    is_expert,
    merge_experts,
    moe_counts,
    never_quantized,
    tensor_role,
)
from pipeline.errors import PipelineError
from pipeline.fsutil import read_json
from pipeline.gguf.types import GGML_TYPE_CODES, GGML_TYPES, tensor_nbytes
from pipeline.memory import (
    FIT,
    TENSOR_ALIGNMENT,
    ModelShape,
    TensorShape,
    components,
    config_swa,
    experts,
    pad,
    recurrent_state_bytes,
)
from pipeline.stagedef import logits_bytes

MIB = 1 << 20
GIB = 1 << 30

_ST_DTYPE = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2,
             "I8": 1, "U8": 1, "BOOL": 1}
_CFG_DTYPE = {"float32": 4, "float16": 2, "bfloat16": 2}


# ------------------------------------------------------------------ source facts
@dataclass
class Facts:
    """The source checkpoint as the plan sees it. ``tensors``: (HF name, shape as stored, bytes per element)."""

    origin: str  # where the numbers came from: "safetensors headers" or "config.json (+ index)"
    model_type: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    tied: bool
    tensors: list[tuple[str, tuple[int, ...], int]]
    snapshot_bytes: int  # every file of the snapshot (weights, tokenizer, configs)
    vocab_bytes: int  # GGUF bytes of the vocabulary arrays (tokens, types, scores, merges)
    other_bytes: int = 0  # the snapshot's files besides the weights (tokenizer, configs, README)
    notes: list[str] = field(default_factory=list)
    n_merges: int = 0  # BPE merges of tokenizer.json
    swa: list[bool] = field(default_factory=list)  # per layer: sliding-window attention as llama.cpp runs it
    n_swa: int = 0  # the window
    n_expert: int = 0  # mixture of experts: routed experts per MoE layer (0: dense)
    n_expert_used: int = 0  # experts each token is routed to
    recurrent: list[bool] = field(default_factory=list)  # per layer: a recurrent state (hybrid), no KV cache
    recurrent_bytes: int = 0  # one sequence's state of one such layer

    @property
    def n_params(self) -> int:
        return sum(_numel(s) for _, s, _ in self.tensors)

    @property
    def n_active(self) -> int:
        """Parameters a token multiplies: a mixture of experts routes it through ``n_expert_used`` of ``n_expert``."""
        if self.n_expert < 2:
            return self.n_params
        experts = sum(_numel(s) for n, s, _ in self.tensors if is_expert(n))
        return self.n_params - experts + experts * self.n_expert_used // self.n_expert

    @property
    def weight_bytes(self) -> int:
        return sum(_numel(s) * b for _, s, b in self.tensors)

    @property
    def largest_tensor(self) -> int:
        return max((_numel(s) for _, s, _ in self.tensors), default=0)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


# config.json numbers the plan reads (an int or null each): the layer count sizes per-layer lists, the expert count
# one tensor list per layer; llama.cpp refuses more than LLAMA_MAX_LAYERS / LLAMA_MAX_EXPERTS
_DIM = integer(0, INT32_MAX, "a model dimension")
CONFIG_INTS = {
    **dict.fromkeys(("num_hidden_layers", "n_layer"), integer(0, LLAMA_MAX_LAYERS, "llama.cpp's LLAMA_MAX_LAYERS")),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok"),
                    integer(0, LLAMA_MAX_EXPERTS, "llama.cpp's LLAMA_MAX_EXPERTS")),
    **dict.fromkeys(("hidden_size", "n_embd", "num_attention_heads", "n_head", "num_key_value_heads", "head_dim",
                     "vocab_size", "intermediate_size", "n_inner", "moe_intermediate_size",
                     "shared_expert_intermediate_size", "decoder_sparse_step", "sliding_window",
                     "max_position_embeddings", "linear_conv_kernel_dim", "linear_value_head_dim",
                     "linear_num_value_heads", "linear_num_key_heads", "linear_key_head_dim",
                     "num_nextn_predict_layers"), _DIM),
}
_SHAPE_DIM = Range(0, SIZE_MAX, integer=True)


def check_config(cfg, where: str) -> dict:
    """``cfg`` (a config.json, or its ``text_config``) when every value the plan reads has its type and range: one
    line ``<where>: <key>: ...`` otherwise."""
    if not isinstance(cfg, dict):
        raise PipelineError(f"{where}: must be a JSON object, got {type(cfg).__name__}")
    for key, rng in CONFIG_INTS.items():
        if cfg.get(key) is not None:
            rng.check(cfg[key], f"{where}: {key}")
    for key in ("model_type", "torch_dtype", "dtype"):
        if cfg.get(key) is not None and not isinstance(cfg[key], str):
            raise PipelineError(f"{where}: {key}: must be a string, got {cfg[key]!r:.60}")
    for key in ("layer_types", "mlp_only_layers"):
        v = cfg.get(key)
        if v is not None and not (isinstance(v, list) and all(
                isinstance(x, str) if key == "layer_types" else _DIM.contains(x) for x in v)):
            raise PipelineError(f"{where}: {key}: must be a list of {'strings' if key == 'layer_types' else 'layer numbers'}")
    pat = cfg.get("sliding_window_pattern")
    if pat is not None and not (_DIM.contains(pat) or (isinstance(pat, list) and all(
            isinstance(x, (bool, int)) for x in pat))):
        raise PipelineError(f"{where}: sliding_window_pattern: must be a period or a list of flags, got {pat!r:.60}")
    if cfg.get("text_config") is not None and not isinstance(cfg["text_config"], dict):
        raise PipelineError(f"{where}: text_config: must be a JSON object")
    return cfg


def _open_regular(path: Path):
    """``path`` opened for reading when it is a regular file: a FIFO would block, a device never end."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PipelineError(f"{path}: not a regular file (a FIFO, socket or device)")
    return os.fdopen(fd, "rb")


def safetensors_header(path: str | os.PathLike) -> dict:
    """The JSON header of a safetensors file (name -> {dtype, shape, data_offsets}; ``__metadata__``), each tensor's
    entry checked: a mapping with a dtype and a shape of dimensions."""
    with _open_regular(Path(path)) as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise PipelineError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > min(100 * MIB, os.fstat(f.fileno()).st_size - 8):
            raise PipelineError(f"{path}: not a safetensors file (header length {n}, past the end or over 100 MiB)")
        try:
            header = json.loads(f.read(n))
        except RecursionError:
            raise PipelineError(f"{path}: unreadable safetensors header: nested too deeply") from None
        except ValueError as exc:  # UnicodeDecodeError too
            raise PipelineError(f"{path}: unreadable safetensors header: {exc}") from None
    if not isinstance(header, dict):
        raise PipelineError(f"{path}: unreadable safetensors header: not a JSON object")
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not (isinstance(info, dict) and isinstance(info.get("dtype"), str) and isinstance(info.get("shape"), list)
                and all(_SHAPE_DIM.contains(d) for d in info["shape"])):
            raise PipelineError(f"{path}: tensor {name[:80]!r}: not a safetensors entry (dtype and a shape of "
                                "non-negative integers)")
    return header


def _vocab_bytes(folder: Path, n_vocab: int) -> tuple[int, int]:
    """(GGUF bytes of the vocabulary arrays, merges count) from tokenizer.json: each token string (8-byte length +
    UTF-8), its type (int32), and each merge string; a SentencePiece model without tokenizer.json: 8 bytes per
    token string and a float32 score. Vocabulary padded to n_vocab as the converter does ([PAD<i>])."""
    tj = folder / "tokenizer.json"
    if tj.is_file():
        try:
            data = json.loads(tj.read_text(encoding="utf-8"))
            model = data.get("model") or {}
            vocab = model.get("vocab") or {}
            toks = list(vocab) if isinstance(vocab, dict) else [t[0] for t in vocab]
            toks += [t.get("content", "") for t in data.get("added_tokens") or [] if t.get("content") not in vocab]
            merges = model.get("merges") or []
            mb = sum(8 + len((" ".join(m) if isinstance(m, list) else m).encode()) for m in merges)
            tb = sum(8 + len(t.encode()) for t in toks) + max(0, n_vocab - len(toks)) * 14
            scores = 4 * n_vocab if model.get("type") in ("Unigram",) else 0
            return tb + 4 * n_vocab + scores + mb, len(merges)
        except (OSError, ValueError, AttributeError, TypeError, IndexError):
            pass
    return n_vocab * (8 + 8 + 4 + 4), 0


def source_facts(source: str | os.PathLike) -> Facts:
    """Facts of a checkpoint folder (config.json + ``*.safetensors`` or ``model.safetensors.index.json``), or of a
    config.json file with the index beside it."""
    p = Path(source)
    folder = p.parent if p.is_file() else p
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        raise PipelineError(f"{folder}: no config.json")
    cfg = check_config(read_json(cfg_path, "the checkpoint's config"), str(cfg_path))
    if "text_config" in cfg and "hidden_size" not in cfg:  # multimodal wrappers: the language model's config
        cfg = {**cfg, **check_config(cfg["text_config"], f"{cfg_path}: text_config")}
    files = sorted(folder.glob("*.safetensors"))
    tensors: list[tuple[str, tuple[int, ...], int]] = []
    notes: list[str] = []
    if files:
        origin = "safetensors headers"
        for f in files:
            for name, info in safetensors_header(f).items():
                if name != "__metadata__":
                    tensors.append((name, tuple(info["shape"]), _ST_DTYPE.get(info["dtype"], 2)))
    else:
        origin = "config.json (+ index)"
        for key in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "num_attention_heads"):
            if not cfg.get(key):  # the shapes come from these alone
                raise PipelineError(f"{cfg_path}: {key}: missing or 0, and no *.safetensors headers to read the "
                                    "shapes from")
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        tensors = config_tensors(cfg, _CFG_DTYPE.get(dtype, 2))
        index = folder / "model.safetensors.index.json"
        if index.exists():
            idx = read_json(index, "the safetensors index")
            meta = idx.get("metadata") if isinstance(idx, dict) else None
            if not isinstance(idx, dict) or not isinstance(idx.get("weight_map", {}), dict) or not isinstance(
                    meta or {}, dict) or not _SHAPE_DIM.contains((meta or {}).get("total_size") or 0):
                raise PipelineError(f"{index}: not a safetensors index (weight_map: names -> files, metadata."
                                    "total_size: bytes)")
            total = (meta or {}).get("total_size") or 0
            derived = sum(_numel(s) * b for _, s, b in tensors)
            names = set(idx.get("weight_map") or {})
            missing = {n for n in names - {n for n, _, _ in tensors} if not n.endswith("rotary_emb.inv_freq")}
            if missing:
                notes.append(f"{len(missing)} tensors of the index not derived from config.json (e.g. {min(missing)})")
            if total and abs(derived - total) > 0.001 * total:
                notes.append(f"derived {derived} bytes vs index total_size {total}")
    n_layer = int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or 0)  # GPT-2 style names second
    h = int(cfg.get("hidden_size") or cfg.get("n_embd") or 0)
    nh = int(cfg.get("num_attention_heads") or cfg.get("n_head") or 1)
    n_vocab = int(cfg.get("vocab_size") or 0)
    on_disk = [f for f in folder.rglob("*") if f.is_file()]
    weights_on_disk = sum(f.stat().st_size for f in files)
    other = sum(f.stat().st_size for f in on_disk if f not in files and f.suffix != ".safetensors")
    if not files:
        other = max(other, 20 * MIB)  # tokenizer and configs of a snapshot described only by its index
    weight_bytes = sum(_numel(s) * b for _, s, b in tensors)
    vocab_bytes, n_merges = _vocab_bytes(folder, n_vocab)
    swa, n_swa = config_swa(cfg, n_layer)
    n_expert, n_expert_used = moe_counts(cfg)
    recurrent, ssm = config_recurrent(cfg, n_layer)
    recurrent_bytes = recurrent_state_bytes(*ssm) if any(recurrent) else 0
    return Facts(
        origin=origin, model_type=str(cfg.get("model_type", "")), n_layer=n_layer, n_embd=h,
        n_ff=int(cfg.get("intermediate_size") or cfg.get("n_inner") or 4 * h), n_head=nh, n_head_kv=int(cfg.get("num_key_value_heads") or nh),
        head_dim=int(cfg.get("head_dim") or h // nh), n_vocab=n_vocab,
        tied=bool(cfg.get("tie_word_embeddings", False)) or not any("lm_head" in n for n, _, _ in tensors),
        tensors=tensors, snapshot_bytes=(weights_on_disk or weight_bytes) + other, vocab_bytes=vocab_bytes,
        other_bytes=other, notes=notes, n_merges=n_merges, swa=swa, n_swa=n_swa, n_expert=n_expert,
        n_expert_used=n_expert_used, recurrent=recurrent, recurrent_bytes=recurrent_bytes)


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
