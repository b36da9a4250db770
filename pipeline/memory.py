"""How much memory llama.cpp's CPU build takes to run a GGUF at a context size, predicted from the GGUF alone.

The quantity predicted is the peak resident set (VmHWM) of

    llama-bench -m FILE -p CTX -n 16 -r 1 -t 2

on the pinned build (b11312, CPU only, default mmap): one context of CTX tokens (padded) that processes a
CTX-token prompt in ubatches of 512 with one output row each, then a 16-token generation in a smaller context.
The components (bytes), with where in the pinned llama.cpp tree each comes from (docs/devices.md has more):

- ``weights``: the tensor data section of the file. The model is mmap'd with MAP_POPULATE over the whole file
  (src/llama-model.cpp:1812 ``init_mappings(true, ...)``, src/llama-model-loader.cpp:1429 prefetch = -1,
  src/llama-mmap.cpp:480 MAP_POPULATE), so every page is resident; only the pages before the first and after
  the last used tensor are unmapped after loading (src/llama-model-loader.cpp:1777-1787).
- ``repack``: the CPU backend copies tensors of some types into a second, interleaved buffer (CPU_REPACK):
  ggml/src/ggml-cpu/repack.cpp:4925-5138 ``ggml_repack_get_optimal_repack_type`` picks the layout by type, CPU
  features and rows (``ne[1]``); only weights used by MUL_MAT (2-D) / MUL_MAT_ID (3-D) qualify (repack.cpp:5188-
  5222 ``supports_op``; the loader asks per tensor and op, src/llama-model-loader.cpp:927 ``weight_buft_supported``),
  so ``token_embd`` (GET_ROWS) never does, while the output matrix (``output.weight`` or, tied, the duplicate of
  ``token_embd`` that src/models/*.cpp create with TENSOR_DUPLICATED) may. The repacked bytes equal the
  tensor's bytes (no ``get_alloc_size``, repack.cpp:5234); the source pages stay mapped as well.
- ``kv``: K and V per layer (src/llama-kv-cache.cpp:209-234: ``n_embd_k_gqa(il) x kv_size`` of the K type, same
  for V), kv_size = n_ctx padded to 256 (src/llama-context.cpp:290); layers with a sliding window get their own
  cache of ``GGML_PAD(min(kv_size, n_swa + n_ubatch), 256)`` cells (src/llama-kv-cache-iswa.cpp:73). The buffer is
  cleared at creation (src/llama-kv-cache.cpp:293), so it is all resident.
- ``output``: the logits buffer, n_vocab floats per output row (src/llama-context.cpp:2116-2141
  ``output_reserve``): one row (n_seq_max) here, llama-bench asks for the last token's logits only.
- ``compute``: what the run touches of the graph's compute buffer and the CPU work buffer. The reserved compute
  buffer (``reserved['compute']``, what llama.cpp prints) is sized for the worst case of n_ubatch output rows
  (src/llama-context.cpp:896-898): ``n_vocab x n_ubatch`` floats of logits that a one-output-row run never
  touches. Touched: the activations and the KQ mask (f16 with flash attention, n_kv x n_ubatch,
  src/llama-graph.cpp:29-46; one per cache), one logits row, and the matmul work buffer (activations converted
  to the weight's vec_dot type, ggml/src/ggml-cpu/ggml-cpu.c:2883-2891).
- ``overhead``: the process itself (binary, libraries, threads: a fitted constant) and the heap that holds the
  vocabulary and the GGUF metadata (derived per token and per merge from the structures of src/llama-vocab.cpp
  and ggml/src/gguf.cpp).

``arch`` names a CPU feature profile (:data:`ARCH_FEATURES`) that decides which tensors are repacked; the
constants were fitted on x86_64 (see :data:`FIT`). Standard library and :mod:`pipeline.gguf.reader` only.

One model for every caller: :func:`components` of a :class:`ModelShape`, read from a GGUF header
(:meth:`ModelShape.from_gguf`: ``ggufpipe fit``, :func:`predict_memory`, the publish stage's device fits) or
predicted from config.json and safetensors headers before any GGUF exists (:func:`pipeline.devices.plan.model_shape`:
``ggufpipe plan``'s llama.cpp stages, ``ggufpipe init``'s device suggestions).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from pipeline.bounds import LLAMA_MAX_LAYERS, UINT32_MAX, Range
from pipeline.errors import PipelineError
from pipeline.gguf.reader import ArrayValue, read_header
from pipeline.gguf.types import GGML_TYPE_CODES, GGML_TYPES
from pipeline.memory_profiles import ARCH_FEATURES, KV_TYPES

MIB = 1 << 20

# ------------------------------------------------------------------ llama.cpp / llama-bench defaults (b11312)
N_BATCH = 2048  # tools/llama-bench/llama-bench.cpp:391
N_UBATCH = 512  # the default micro-batch of llama-bench (llama-bench.cpp:392) and llama-perplexity (common.h)
CTX_PAD = 256  # llama.cpp pads n_ctx (src/llama-context.cpp:290) and the SWA cache (llama-kv-cache-iswa.cpp:73) to it
TENSOR_ALIGNMENT = 32  # ggml/src/ggml-impl.h:44 and GGUF's general.alignment: each tensor's data is padded to it

# ggml type -> [(features that must all be present, ne[1] must be a multiple of)], in the order repack.cpp tries
# them (ggml/src/ggml-cpu/repack.cpp:4974-5135); the first that applies repacks the tensor. RISC-V, SVE and s390x
# branches are left out (no profile here has them).
_AVX2, _AVX512 = frozenset({"avx2"}), frozenset({"avx512"})
_I8MM, _DOT = frozenset({"neon", "i8mm"}), frozenset({"neon", "dotprod"})
REPACK_RULES: dict[str, list[tuple[frozenset[str], int]]] = {
    "Q4_0": [(_AVX2, 8), (_I8MM, 4), (_DOT, 4)],  # repack.cpp:4974-4989
    "Q4_K": [(_AVX2, 8), (_I8MM, 8), (_DOT, 8)],  # repack.cpp:5006-5021
    "Q2_K": [(_AVX512, 8)],  # repack.cpp:5033-5038
    "Q5_K": [(_I8MM, 8), (_DOT, 8)],  # repack.cpp:5050-5060
    "Q6_K": [(_I8MM, 8), (_DOT, 8)],  # repack.cpp:5061-5071
    "IQ4_NL": [(_AVX2, 8), (_DOT, 4)],  # repack.cpp:5072-5082
    "MXFP4": [(_AVX2, 8), (_DOT, 4)],  # repack.cpp:5095-5105
    "Q8_0": [(_I8MM, 4), (_DOT, 4)],  # repack.cpp:5106-5116
    "Q1_0": [(_I8MM, 4), (_DOT, 4)],  # repack.cpp:5128-5137
}


# Architectures with sliding-window layers, and the period each passes to load_swa_pattern when the GGUF has no
# ``<arch>.attention.sliding_window_pattern`` (src/models/<arch>.cpp; "dense_first": the full-attention layer
# comes first in each period, src/llama-hparams.cpp:8-22).
SWA_PATTERNS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False), "gemma3": (6, False), "gemma-embedding": (6, False), "gemma3n": (5, False),
    "cohere2": (4, False), "cohere2moe": (4, True), "exaone4": (4, False), "exaone-moe": (4, False),
    "olmo2": (4, False), "openai-moe": (2, False), "afmoe": (4, False), "smallthinker": (4, True),
    "plamo3": (8, False), "llama4": (4, False),
}

# vec_dot_type bytes per activation element by weight block size (ggml/src/ggml-cpu/ggml-cpu.c:219-410 type_traits_cpu):
# F32 weights: none; F16/BF16: 2; 32-element quants: Q8_0/Q8_1 (34-36 / 32); 256-element quants: Q8_K (292 / 256)
_VEC_DOT_BYTES = {1: 2.0, 32: 36 / 32, 64: 36 / 32, 128: 36 / 32, 256: 292 / 256}

# ------------------------------------------------------------------ fitted / derived constants
# Derived (not fitted): heap per vocabulary entry and per BPE merge, from the structures that hold them.
# Per token: id_to_token (std::string + float + attr: 40 B), token_to_id (unordered_map<string,int> node 56 -> 64
# + bucket 8), cache_token_to_piece (std::string 32) (src/llama-vocab.cpp:1843-1847) + the GGUF context's copy of
# the token string (std::string 32, ggml/src/gguf.cpp) = 176 B. Per merge: bpe_ranks (unordered_map<pair<string,
# string>,int> node 88 -> 96 + bucket 8, src/llama-vocab.cpp:1854) + its GGUF string (32) = 136 B. The metadata
# bytes themselves (everything before the tensor data) are counted once more as heap (the GGUF context's copy).
VOCAB_BYTES_PER_TOKEN = 176
VOCAB_BYTES_PER_MERGE = 136

# Fitted on the FIT set only (SmolLM2-135M F16 and Q8_0, llama-bench -p 512 and -p 2048, this machine;
# bench/memory_bench.py, docs/devices.md): see FIT for the values and how.
FIT = {
    # reserved compute buffer apart from the worst-case logits and the mask, per ubatch token per (n_embd + n_ff)
    # float: least squares of (printed compute - n_vocab*n_ubatch*4) = a*n_ubatch*(n_embd+n_ff)*4 + m*n_ubatch*n_kv
    # over the 4 fit runs (printed 98.25 MiB at ctx 512, 102.51 at 2048, F16 and Q8_0 alike): a = 0.201
    "act_per_token_dim": 0.201,
    # m of the same fit: bytes per (KV cell x ubatch token) per cache. The mask itself is f16 (2 B,
    # src/llama-graph.cpp:39); the rest is where ggml-alloc places the buffers around it.
    "mask_bytes": 5.68,
    # the process without model, vocabulary or buffers (binary, libc/libstdc++/libgomp, 2 threads' stacks, the
    # model's tensor structs): mean of (VmHWM - everything else predicted) over the 4 fit runs (22.19, 21.19,
    # 22.17, 21.06 MiB)
    "process_base": 22_703_163,
}


def _kv_type(kv_type: str) -> tuple[int, int]:
    name = KV_TYPES.get(kv_type.lower())
    if name is None:
        raise PipelineError(f"unknown KV cache type {kv_type!r}: one of {', '.join(KV_TYPES)}")
    return GGML_TYPES[GGML_TYPE_CODES[name]][1:]


def _row_bytes(type_bs: tuple[int, int], n: int) -> int:
    blck, size = type_bs
    return n // blck * size


def pad(x: int, n: int = TENSOR_ALIGNMENT) -> int:
    """``x`` rounded up to a multiple of ``n`` (GGML_PAD): tensor data to :data:`TENSOR_ALIGNMENT`, cells to
    :data:`CTX_PAD`. The one padding rule of the memory and size predictions."""
    return (x + n - 1) // n * n


def repacked(type_name: str, shape: tuple[int, ...], features: frozenset[str]) -> bool:
    """Whether ggml-cpu repacks a matmul weight of this type and shape on a CPU with ``features``."""
    if len(shape) < 2:
        return False
    for need, mult in REPACK_RULES.get(type_name, ()):
        if need <= features and shape[1] % mult == 0:
            return True
    return False


def repack_types(arch: str) -> list[str]:
    """The tensor types ggml-cpu repacks on CPU profile ``arch`` (given rows a multiple of 4 or 8), in
    :data:`REPACK_RULES`' order."""
    features = ARCH_FEATURES[arch]
    return [t for t, rules in REPACK_RULES.items() if any(need <= features for need, _ in rules)]


def _matmul_weight(name: str, shape: tuple[int, ...]) -> bool:
    """A weight llama.cpp multiplies with (MUL_MAT: 2-D; MUL_MAT_ID: 3-D expert stacks). Embedding tables are
    read with GET_ROWS; 1-D tensors are norms and biases."""
    if len(shape) == 2:
        return not ("token_embd" in name or "per_layer_token_embd" in name or "position_embd" in name
                    or "token_types" in name or name.startswith("rope_") or ".rope_" in name)
    return len(shape) == 3 and "_exps" in name


def _layer_values(meta: dict, key: str, n_layer: int, default: int) -> list[int]:
    v = meta.get(key, default)
    if isinstance(v, list):
        return [int(x) for x in v][:n_layer] + [int(v[-1]) if v else default] * max(0, n_layer - len(v))
    return [int(v)] * n_layer


def swa_layers(arch: str, meta: dict, n_layer: int) -> list[bool]:
    """Per layer, whether it uses the sliding-window cache (llama_hparams::is_swa)."""
    n_swa = int(meta.get(f"{arch}.attention.sliding_window", 0) or 0)
    if arch not in SWA_PATTERNS or n_swa <= 0:
        return [False] * n_layer
    period, dense_first = SWA_PATTERNS[arch]
    pat = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pat, list):  # one flag per layer (src/llama-model.cpp:3435 get_arr)
        flags = [bool(x) for x in pat]
        return (flags + [False] * n_layer)[:n_layer]
    if isinstance(pat, int) and not isinstance(pat, bool):
        period = pat
    if dense_first:
        return [period == 0 or il % period != 0 for il in range(n_layer)]
    return [period == 0 or il % period < period - 1 for il in range(n_layer)]


# HF model_type -> the llama.cpp architecture whose sliding-window layers the converted file gets (the others run
# every layer at full context in llama.cpp, whatever their config says: Qwen2's or Mistral's sliding_window)
HF_SWA_ARCHS = {"gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3", "cohere2": "cohere2",
                "gpt_oss": "openai-moe", "exaone4": "exaone4", "llama4": "llama4"}


def config_swa(cfg: dict, n_layer: int) -> tuple[list[bool], int]:
    """(per layer: sliding window, the window) from config.json: ``layer_types`` or ``sliding_window_pattern``,
    else the architecture's period (:func:`swa_layers`)."""
    arch = HF_SWA_ARCHS.get(str(cfg.get("model_type", "")))
    n_swa = int(cfg.get("sliding_window") or 0)
    if arch is None or n_swa <= 0:
        return [], 0
    types = cfg.get("layer_types")
    pattern = ([t == "sliding_attention" for t in types] if isinstance(types, list)
               else cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern"))
    meta = {f"{arch}.attention.sliding_window": n_swa}
    if pattern is not None:
        meta[f"{arch}.attention.sliding_window_pattern"] = pattern
    return swa_layers(arch, meta, n_layer), n_swa


# the hyperparameters the model reads, as llama.cpp takes them (uint32, src/llama-model-loader.cpp get_key / get_arr);
# block_count also sizes the per-layer lists here: llama.cpp refuses more than LLAMA_MAX_LAYERS
_HPARAMS = ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
            "attention.key_length", "attention.value_length", "feed_forward_length", "attention.sliding_window",
            "attention.key_length_swa", "attention.value_length_swa", "context_length", "expert_count",
            "expert_used_count", "ssm.conv_kernel", "ssm.inner_size", "ssm.group_count", "ssm.state_size",
            "nextn_predict_layers", "full_attention_interval")
_HPARAM = Range(0, UINT32_MAX, integer=True, note="a uint32 hyperparameter")
_LAYERS = Range(0, LLAMA_MAX_LAYERS, integer=True, note="llama.cpp's LLAMA_MAX_LAYERS")


def _check_hparams(meta: dict, arch: str, path) -> None:
    """One line naming the file and key for a hyperparameter that is not an integer in range (a crafted or damaged
    header): every number below is read from these."""
    for suffix in _HPARAMS:
        key = f"{arch}.{suffix}"
        v = meta.get(key)
        for x in v if isinstance(v, list) else [] if v is None else [v]:
            msg = (_LAYERS if suffix == "block_count" else _HPARAM).problem(x)
            if msg is not None:
                raise PipelineError(f"{path}: {key}: {msg}")


def _metadata(header) -> dict[str, Any]:
    """Scalars as they are; the per-layer arrays this model reads decoded (small), other arrays as counts."""
    meta: dict[str, Any] = {}
    for k, v in header.metadata.items():
        if isinstance(v, ArrayValue):
            if k.endswith(("head_count_kv", "head_count", "sliding_window_pattern", "feed_forward_length",
                           "recurrent_layers")):
                meta[k] = header.array(k)
            else:
                meta[k] = v.count
        else:
            meta[k] = v
    return meta


def recurrent_layers(arch: str, meta: dict, n_layer: int) -> list[bool]:
    """Per layer, whether it keeps a recurrent state in the place of a KV cache: the hybrid linear-attention models
    (Qwen3-Next, Qwen3.5): ``{arch}.attention.recurrent_layers`` where written, else every layer but each
    ``full_attention_interval``-th, the multi-token-prediction layers excepted (src/models/qwen35moe.cpp:19-26).
    Pure recurrent architectures (Mamba, RWKV) are not modelled: no layer."""
    if not meta.get(f"{arch}.ssm.inner_size"):
        return [False] * n_layer
    flags = meta.get(f"{arch}.attention.recurrent_layers")
    if isinstance(flags, list):
        return ([bool(x) for x in flags] + [False] * n_layer)[:n_layer]
    interval = int(meta.get(f"{arch}.full_attention_interval", 0) or 0)
    n_main = n_layer - int(meta.get(f"{arch}.nextn_predict_layers", 0) or 0)
    return [bool(interval) and i < n_main and (i + 1) % interval != 0 for i in range(n_layer)]


def recurrent_state_bytes(d_conv: int, d_inner: int, n_group: int, d_state: int) -> int:
    """One sequence's recurrent state of one layer, F32 (src/llama-model.cpp:2483-2484): the convolution state,
    (d_conv - 1) x (d_inner + 2 x n_group x d_state), and the SSM state, d_state x d_inner
    (llama_hparams::n_embd_r / n_embd_s, src/llama-hparams.cpp:208-258)."""
    return 4 * (max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state) + d_state * d_inner)


# ------------------------------------------------------------------ the model as the memory model sees it
@dataclass(frozen=True)
class TensorShape:
    """One tensor of the GGUF: ``ne`` in ggml order (row length first), its type, bytes and offset in the data
    section; ``role``: ``"token_embd"`` and ``"output"`` matter here (the tied output is a repacked duplicate of
    token_embd), others may be ``""``; ``matmul``: a weight of MUL_MAT / MUL_MAT_ID (the only ones ggml-cpu repacks
    and converts activations for)."""

    name: str
    ne: tuple[int, ...]
    type_name: str
    n_bytes: int
    offset: int
    role: str
    matmul: bool


@dataclass
class ModelShape:
    """What the memory model needs of a model: hyperparameters, per-layer KV heads, sliding-window layers,
    vocabulary and the tensors of its GGUF. Built from a GGUF header (:meth:`from_gguf`) or, before any GGUF
    exists, from config.json and safetensors headers (:func:`pipeline.devices.plan.model_shape`)."""

    architecture: str  # the GGUF's general.architecture (llama.cpp's name)
    n_layer: int
    n_embd: int
    n_ff: int  # the largest layer's
    n_head_kv: list[int]  # per layer
    head_k: int
    head_v: int
    n_vocab: int
    tensors: list[TensorShape]
    metadata_bytes: int  # everything before the tensor data (header, vocabulary, tensor infos, padding)
    weights: int  # the tensor data section
    n_merges: int = 0
    swa: list[bool] = field(default_factory=list)  # per layer: sliding-window cache; empty: none
    n_swa: int = 0
    head_k_swa: int = 0  # 0: head_k
    head_v_swa: int = 0  # 0: head_v
    source: str = ""  # what it was built from
    n_ctx_train: int = 0  # the trained context ({arch}.context_length); 0: unknown
    n_expert: int = 0  # mixture of experts: experts per MoE layer ({arch}.expert_count); 0: dense
    n_expert_used: int = 0  # experts each token is routed to ({arch}.expert_used_count)
    recurrent: list[bool] = field(default_factory=list)  # per layer: a recurrent state, no KV cache
    recurrent_bytes: int = 0  # one sequence's recurrent state of one such layer
    n_nextn: int = 0  # multi-token-prediction layers, the last of n_layer: mapped, but no KV cache unless drafting

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> ModelShape:
        header = read_header(path)
        meta = _metadata(header)
        arch = str(meta.get("general.architecture", ""))
        _check_hparams(meta, arch, path)
        g = lambda key, default=None: meta.get(f"{arch}.{key}", default)  # noqa: E731
        n_layer = int(g("block_count", 0) or 0)
        n_embd = int(g("embedding_length", 0) or 0)
        n_head = _layer_values(meta, f"{arch}.attention.head_count", n_layer, 0)
        n_head_kv = _layer_values(meta, f"{arch}.attention.head_count_kv", n_layer, max(n_head, default=0))
        head_max = max(n_head, default=0) or 1
        head_k = int(g("attention.key_length", 0) or (n_embd // head_max))
        head_v = int(g("attention.value_length", 0) or (n_embd // head_max))
        by_name = {t.name: t for t in header.tensors}
        embd_t, out_t = by_name.get("token_embd.weight"), by_name.get("output.weight")
        n_vocab = (embd_t.shape[1] if embd_t and len(embd_t.shape) > 1 else
                   out_t.shape[1] if out_t and len(out_t.shape) > 1 else int(meta.get("tokenizer.ggml.tokens", 0) or 0))
        tensors = [TensorShape(t.name, tuple(t.shape), t.type_name, t.n_bytes, t.offset - header.data_offset,
                               {"token_embd.weight": "token_embd", "output.weight": "output"}.get(t.name, ""),
                               _matmul_weight(t.name, t.shape)) for t in header.tensors]
        return cls(
            architecture=arch, n_layer=n_layer, n_embd=n_embd,
            n_ff=max(_layer_values(meta, f"{arch}.feed_forward_length", n_layer, 0), default=0),
            n_head_kv=n_head_kv, head_k=head_k, head_v=head_v, n_vocab=n_vocab, tensors=tensors,
            metadata_bytes=header.data_offset, weights=header.data_end - header.data_offset,
            n_merges=int(meta.get("tokenizer.ggml.merges", 0) or 0), swa=swa_layers(arch, meta, n_layer),
            n_swa=int(g("attention.sliding_window", 0) or 0), head_k_swa=int(g("attention.key_length_swa", 0) or 0),
            head_v_swa=int(g("attention.value_length_swa", 0) or 0), source=str(path),
            n_ctx_train=int(g("context_length", 0) or 0), n_expert=int(g("expert_count", 0) or 0),
            n_expert_used=int(g("expert_used_count", 0) or 0), recurrent=recurrent_layers(arch, meta, n_layer),
            recurrent_bytes=recurrent_state_bytes(*(int(g(f"ssm.{k}", 0) or 0) for k in (
                "conv_kernel", "inner_size", "group_count", "state_size"))),
            n_nextn=int(g("nextn_predict_layers", 0) or 0))


def experts(shape: ModelShape) -> dict | None:
    """A mixture-of-experts model's parameters and bytes: total and active per token (each token reads
    ``n_expert_used`` of ``n_expert`` experts of every ``*_exps`` tensor), and the expert bytes, all mapped, of
    which a token reads that fraction. None for a dense model."""
    if shape.n_expert < 2:
        return None
    exps = [t for t in shape.tensors if "_exps." in t.name or ".experts." in t.name]  # GGUF or HF names (plan)
    total, expert_params = sum(math.prod(t.ne) for t in shape.tensors), sum(math.prod(t.ne) for t in exps)
    expert_bytes, used = sum(t.n_bytes for t in exps), shape.n_expert_used / shape.n_expert
    return {"n_expert": shape.n_expert, "n_expert_used": shape.n_expert_used, "params_total": total,
            "params_active": int(total - expert_params * (1 - used)), "expert_bytes": expert_bytes,
            "expert_bytes_read_per_token": int(expert_bytes * used)}


def _vec_dot_bytes(type_name: str) -> float:
    """Bytes per activation element a matmul with a weight of this type converts to (0: F32, no conversion)."""
    if type_name == "F32":
        return 0.0
    return _VEC_DOT_BYTES.get(GGML_TYPES[GGML_TYPE_CODES[type_name]][1], 2.0)


def _check(ctx: int, kv_type: str, arch: str) -> tuple[frozenset[str], tuple[int, int]]:
    """(CPU features, KV type's block and bytes), or the one-line error for a bad argument."""
    if ctx < 1:
        raise PipelineError(f"context size must be at least 1 (got {ctx})")
    if arch not in ARCH_FEATURES:
        raise PipelineError(f"unknown arch {arch!r}: one of {', '.join(ARCH_FEATURES)}")
    return ARCH_FEATURES[arch], _kv_type(kv_type)


def components(shape: ModelShape, ctx: int, kv_type: str = "f16", arch: str = "x86_64", threads: int = 2,
               n_outputs: int = 1, n_seq: int = 1) -> dict:
    """Predicted peak RSS (bytes) of a llama.cpp CPU run of ``shape`` at context ``ctx``, by component.

    ``n_outputs``: rows of logits the run keeps (1: llama-bench, the last token's; llama-perplexity and
    llama-imatrix keep every token of a chunk); ``n_seq``: sequences (server slots) a hybrid model keeps a recurrent
    state for. Returns ``{"weights", "repack", "kv", "compute", "output", "overhead", "total"}`` (bytes; ``kv`` with
    the recurrent state), ``"reserved"`` (the buffers as llama.cpp prints them: mapped model buffer, repack, kv,
    recurrent (RS), output, reserved compute) and ``"details"`` (the numbers the components were computed from)."""
    features, kv_bs = _check(ctx, kv_type, arch)
    s = shape
    n_layer, n_vocab = s.n_layer, s.n_vocab

    # -- weights and repack
    weights = s.weights
    repacked_t = [t for t in s.tensors if t.matmul and repacked(t.type_name, t.ne, features)]
    repack = sum(pad(t.n_bytes) for t in repacked_t)
    repack_names = [t.name for t in repacked_t]
    embd_t = next((t for t in s.tensors if t.role == "token_embd"), None)
    if (embd_t is not None and not any(t.role == "output" for t in s.tensors)
            and repacked(embd_t.type_name, embd_t.ne, features)):
        repack += pad(embd_t.n_bytes)  # the tied output: a repacked duplicate of token_embd
        repack_names.append(f"{embd_t.name} (as output)")
    kept = [t for t in s.tensors if t.name not in set(repack_names)]
    mapped = (max(t.offset + t.n_bytes for t in kept) - min(t.offset for t in kept)) if kept else 0

    # -- KV cache
    n_ctx = pad(ctx, CTX_PAD)
    n_batch = min(ctx, N_BATCH)  # src/llama-context.cpp:246-248 (n_ctx before padding)
    n_ubatch = min(n_batch, N_UBATCH)
    swa = (list(s.swa) + [False] * n_layer)[:n_layer]
    swa_cells = pad(min(n_ctx, s.n_swa + n_ubatch), CTX_PAD) if any(swa) else 0
    head_k_swa, head_v_swa = s.head_k_swa or s.head_k, s.head_v_swa or s.head_v
    recurrent = (list(s.recurrent) + [False] * n_layer)[:n_layer]
    kv = 0
    for il in range(n_layer - s.n_nextn):  # the caches hold llama_hparams::n_layer(), MTP layers not included
        if recurrent[il]:  # the hybrid's KV cache holds the attention layers only (llama_memory_hybrid's filters)
            continue
        cells = swa_cells if swa[il] else n_ctx
        hk, hv = (head_k_swa, head_v_swa) if swa[il] else (s.head_k, s.head_v)
        kv += cells * (_row_bytes(kv_bs, hk * s.n_head_kv[il]) + _row_bytes(kv_bs, hv * s.n_head_kv[il]))
    rs = sum(recurrent) * s.recurrent_bytes * n_seq  # one state per sequence, n_rs_seq 0 (llama-memory-recurrent.cpp:101)
    caches = [n_ctx] + ([swa_cells] if any(swa) else [])
    if all(swa) and n_layer:
        caches = [swa_cells]

    # -- output, compute, overhead
    output = n_vocab * 4 * max(n_outputs, 1)
    mask = FIT["mask_bytes"] * n_ubatch * sum(caches)
    act = FIT["act_per_token_dim"] * n_ubatch * (s.n_embd + s.n_ff) * 4
    vec_dot = max((_vec_dot_bytes(t.type_name) for t in s.tensors if t.matmul), default=0.0)
    work = vec_dot * n_ubatch * max(s.n_ff, s.n_embd)
    fa_scratch = 4 * (64 * s.head_k + 2 * 64 * 64 + 64 * s.head_v + 64 * s.head_v + 64 * s.head_k) * threads  # ggml-cpu.c:2995
    compute_reserved = int(n_vocab * n_ubatch * 4 + act + mask)
    compute = compute_reserved - n_vocab * n_ubatch * 4 + n_vocab * 4 + int(work) + fa_scratch
    vocab_heap = n_vocab * VOCAB_BYTES_PER_TOKEN + s.n_merges * VOCAB_BYTES_PER_MERGE + s.metadata_bytes
    overhead = int(FIT["process_base"] + vocab_heap)

    total = weights + repack + kv + rs + compute + output + overhead
    return {
        "weights": weights, "repack": repack, "kv": kv + rs, "compute": compute, "output": output,
        "overhead": overhead, "total": total,
        "reserved": {"mapped": mapped, "repack": repack, "kv": kv, "recurrent": rs, "output": output,
                     "compute": compute_reserved},
        "details": {
            "source": s.source, "architecture": s.architecture, "arch": arch, "features": sorted(features),
            "ctx": ctx, "n_ctx": n_ctx, "n_ubatch": n_ubatch, "kv_type": kv_type.lower(), "n_layer": n_layer,
            "n_embd": s.n_embd, "n_ff": s.n_ff, "n_head_kv": list(s.n_head_kv), "head_k": s.head_k,
            "head_v": s.head_v, "n_vocab": n_vocab, "n_merges": s.n_merges, "swa_layers": sum(swa),
            "n_swa": s.n_swa, "swa_cells": swa_cells, "repacked_tensors": repack_names, "vocab_heap": vocab_heap,
            "work_buffer": int(work), "fa_scratch": fa_scratch, "n_outputs": n_outputs,
            "recurrent_layers": sum(recurrent), "recurrent_bytes": rs, "n_seq": n_seq,
        },
    }


def predict_memory(gguf_path: str | os.PathLike, ctx: int, kv_type: str = "f16", arch: str = "x86_64",
                   threads: int = 2) -> dict:
    """Predicted peak RSS (bytes) of llama-bench at ``ctx`` on the CPU build, with its components: the
    :func:`components` of the file's :meth:`ModelShape.from_gguf`, ``details["file"]`` naming it."""
    _check(ctx, kv_type, arch)  # before reading the file
    p = components(ModelShape.from_gguf(gguf_path), ctx, kv_type, arch, threads)
    p["details"]["file"] = str(gguf_path)
    return p


