"""A source checkpoint as ``ggufpipe plan`` and ``ggufpipe init`` see it: :func:`source_facts` reads its
``config.json`` and safetensors headers (or the index), which come from outside, so every number is checked before it
sizes anything (:func:`check_config`, :data:`CONFIG_INTS`) and only regular files are opened. What the build will
need from these facts: :mod:`pipeline.devices.plan`."""

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
    moe_counts,
)
from pipeline.errors import PipelineError
from pipeline.fsutil import read_json
from pipeline.memory import (
    config_swa,
    recurrent_state_bytes,
)

MIB = 1 << 20

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
