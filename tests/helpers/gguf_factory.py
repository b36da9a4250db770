"""Tiny, loadable GGUF models with a chosen tokenizer, written with gguf-py's GGUFWriter (tests only).

:func:`tiny_llama` copies every ``tokenizer.*`` key of a source GGUF (a real model or one of llama.cpp's
vocab-only ``ggml-vocab-*.gguf`` files), lets the caller edit them, and writes a small random
``llama``-architecture model around that vocabulary that llama.cpp b11312 loads and runs (e.g. as the target
or draft of ``llama-speculative-simple``). Embedding and output matrices follow the (possibly edited) vocab
size, so a 49152-token vocab at the default 64 dims is about 25 MB in F32.

``nextn_layers=K`` writes a model with K extra multi-token-prediction (NextN/MTP) blocks instead. The llama
architecture has no NextN tensors, so such a model uses ``exaone4``: the simplest (dense, no MoE) architecture
whose gguf-py tensor list (``MODEL_TENSORS`` in gguf/constants.py) includes ``NEXTN_*``. Following llama.cpp's
convention, ``exaone4.block_count`` counts all ``n_layer + K`` blocks, ``exaone4.nextn_predict_layers`` is K,
and the last K blocks (``blk.{n_layer}`` ... ``blk.{n_layer+K-1}``) carry the ordinary exaone4 block tensors
plus ``blk.{bid}.nextn.eh_proj`` / ``.enorm`` / ``.hnorm`` / ``.shared_head_norm`` -- the NextN tensors
``llama_model_exaone4::load_arch_tensors`` creates. llama.cpp b11312 loads and runs such a model (it warns
"model has unused tensor blk.N.nextn.*" and skips the NextN blocks), though callers that count tensors only
need its header. ``nextn_extra=True`` also writes ``nextn.embed_tokens`` and ``nextn.shared_head_head``
(used by other NextN architectures, e.g. glm4moe); exaone4 does not create those, so llama.cpp then refuses
the file ("done_getting_tensors: wrong number of tensors").
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import (
    MODEL_ARCH,
    MODEL_TENSOR,
    MODEL_TENSORS,
    TENSOR_NAMES,
    GGUFReader,
    GGUFValueType,
    GGUFWriter,
    LlamaFileType,
    TokenType,
)

__all__ = ["Tokenizer", "read_tokenizer", "tiny_llama", "NEXTN_ARCH"]

NEXTN_ARCH = "exaone4"
_TOKENS = "tokenizer.ggml.tokens"
_PARALLEL_ARRAYS = ("tokenizer.ggml.token_type", "tokenizer.ggml.scores")  # one element per token

_SCALAR_FMT = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_NP_DTYPE = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.UINT16: "<u2", GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4", GGUFValueType.FLOAT32: "<f4", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8", GGUFValueType.FLOAT64: "<f8",
}


@dataclass
class KV:
    """One metadata value: its GGUF type, the element type for arrays, and the Python value (str for
    strings, lists for arrays). Strings are decoded as UTF-8 with ``surrogateescape`` so any bytes survive."""

    type: GGUFValueType
    value: Any
    sub_type: GGUFValueType | None = None


def _scalar_type(key: str, value: Any, int_type: GGUFValueType = GGUFValueType.UINT32) -> GGUFValueType:
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        return int_type
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    if isinstance(value, str):
        return GGUFValueType.STRING
    raise TypeError(f"{key}: give vtype for a value of type {type(value).__name__}")


def _full_key(key: str) -> str:
    """``"add_bos_token"`` -> ``"tokenizer.ggml.add_bos_token"``; keys already under ``tokenizer.`` unchanged."""
    return key if key.startswith("tokenizer.") else f"tokenizer.ggml.{key}"


@dataclass
class Tokenizer:
    """The ``tokenizer.*`` metadata of a GGUF, in file order, editable.

    Key names may be given in full (``tokenizer.chat_template``) or, for ``tokenizer.ggml.*`` keys, short
    (``add_bos_token``, ``eos_token_id``)."""

    kv: dict[str, KV] = field(default_factory=dict)

    # ------------------------------------------------------------------ reading
    def __contains__(self, key: str) -> bool:
        return _full_key(key) in self.kv

    def get(self, key: str, default: Any = None) -> Any:
        kv = self.kv.get(_full_key(key))
        return default if kv is None else kv.value

    @property
    def tokens(self) -> list[str]:
        return self.kv[_TOKENS].value

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def copy(self) -> Tokenizer:
        return Tokenizer({k: KV(v.type, list(v.value) if isinstance(v.value, list) else v.value, v.sub_type)
                          for k, v in self.kv.items()})

    # ------------------------------------------------------------------ editing
    def set(self, key: str, value: Any, vtype: GGUFValueType | None = None) -> None:
        """Set a key; None removes it. A scalar's type defaults to the key's current one, else to what
        llama.cpp reads: bool -> BOOL, int -> UINT32 (token ids), float -> FLOAT32, str -> STRING. A list is
        an array whose element type (``vtype`` here) defaults likewise, ints to INT32."""
        key = _full_key(key)
        if value is None:
            self.kv.pop(key, None)
            return
        old = self.kv.get(key)
        if isinstance(value, list):
            if vtype is None and old is not None and old.type == GGUFValueType.ARRAY:
                vtype = old.sub_type
            self.kv[key] = KV(GGUFValueType.ARRAY, value, vtype or _scalar_type(key, value[0], GGUFValueType.INT32))
            return
        if vtype is None:
            vtype = old.type if old is not None and old.type != GGUFValueType.ARRAY else _scalar_type(key, value)
        self.kv[key] = KV(vtype, value)

    def remove(self, key: str) -> None:
        self.kv.pop(_full_key(key), None)

    def truncate(self, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` tokens (and their types and scores); merges are left as they are."""
        for key in (_TOKENS, *_PARALLEL_ARRAYS):
            if key in self.kv:
                del self.kv[key].value[n_tokens:]

    def set_token(self, token_id: int, text: str) -> None:
        """Change the text of one token (llama.cpp refuses a vocab with two equal texts)."""
        self.tokens[token_id] = text

    def append_tokens(self, texts: int | Iterable[str], token_type: int = TokenType.USER_DEFINED,
                      score: float = 0.0) -> list[int]:
        """Append tokens (a count makes ``<|tiny_extra_N|>`` texts), extending token types and scores in
        step. Returns the new ids."""
        if isinstance(texts, int):
            texts = [f"<|tiny_extra_{i}|>" for i in range(texts)]
        texts = list(texts)
        first = self.n_tokens
        self.tokens.extend(texts)
        for key in _PARALLEL_ARRAYS:
            kv = self.kv.get(key)
            if kv is not None:
                kv.value.extend([score if key.endswith("scores") else int(token_type)] * len(texts))
        return list(range(first, first + len(texts)))

    def apply(self, edit: Callable[[Tokenizer], Any] | Mapping[str, Any] | None) -> Tokenizer:
        """Apply an edit: a callable taking this Tokenizer (it may return a replacement), or a mapping of

        - ``"tokens": {id: text}`` -- change token texts (a list replaces them all);
        - ``"append_tokens": N or [texts]`` -- append tokens;
        - any other key -> value -- :meth:`set` it (None removes the key).
        """
        if edit is None:
            return self
        if callable(edit):
            out = edit(self)
            return self if out is None else out
        for key, value in edit.items():
            if key == "tokens" and isinstance(value, Mapping):
                for token_id, text in value.items():
                    self.set_token(int(token_id), text)
            elif key == "append_tokens":
                self.append_tokens(value)
            else:
                self.set(key, value)
        return self

    # ------------------------------------------------------------------ writing
    def write_to(self, writer: GGUFWriter) -> None:
        n = self.n_tokens
        for key in _PARALLEL_ARRAYS:
            kv = self.kv.get(key)
            if kv is not None and len(kv.value) != n:
                raise ValueError(f"{key} has {len(kv.value)} elements for {n} tokens")
        for key, kv in self.kv.items():
            value = kv.value
            if kv.type == GGUFValueType.STRING:
                value = value.encode("utf-8", "surrogateescape")
            elif kv.type == GGUFValueType.ARRAY and kv.sub_type == GGUFValueType.STRING:
                value = [s.encode("utf-8", "surrogateescape") for s in value]
            writer.add_key_value(key, value, kv.type, kv.sub_type)


def read_tokenizer(source: str | os.PathLike | GGUFReader | Tokenizer) -> Tokenizer:
    """The ``tokenizer.*`` keys of a GGUF path, a ``gguf.GGUFReader``, or a copy of a :class:`Tokenizer`.

    Paths are parsed directly (GGUFReader takes seconds on a 150k-token vocabulary)."""
    if isinstance(source, Tokenizer):
        return source.copy()
    if isinstance(source, GGUFReader):
        return _tokenizer_from_reader(source)
    with open(source, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return _tokenizer_from_bytes(mm)


def _tokenizer_from_reader(reader: GGUFReader) -> Tokenizer:
    tok = Tokenizer()
    for key, f in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = GGUFValueType(int(f.types[0]))
        if vtype == GGUFValueType.STRING:
            tok.kv[key] = KV(vtype, bytes(f.parts[f.data[0]]).decode("utf-8", "surrogateescape"))
        elif vtype == GGUFValueType.ARRAY:
            sub = GGUFValueType(int(f.types[-1]))
            if sub == GGUFValueType.STRING:
                value = [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
            else:
                value = [x for i in f.data for x in f.parts[i].tolist()]
            tok.kv[key] = KV(vtype, value, sub)
        else:
            tok.kv[key] = KV(vtype, f.parts[f.data[0]].tolist()[0])
    return tok


def _tokenizer_from_bytes(buf: Any) -> Tokenizer:
    if buf[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    pos = 24

    def read_str(p: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", buf, p)
        return bytes(buf[p + 8:p + 8 + n]).decode("utf-8", "surrogateescape"), p + 8 + n

    def read_value(vtype: GGUFValueType, p: int) -> tuple[Any, int]:
        if vtype == GGUFValueType.STRING:
            return read_str(p)
        fmt = _SCALAR_FMT[vtype]
        return struct.unpack_from(fmt, buf, p)[0], p + struct.calcsize(fmt)

    tok = Tokenizer()
    for _ in range(n_kv):
        key, pos = read_str(pos)
        (raw_type,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        vtype = GGUFValueType(raw_type)
        want = key.startswith("tokenizer.")
        if vtype != GGUFValueType.ARRAY:
            value, pos = read_value(vtype, pos)
            if want:
                tok.kv[key] = KV(vtype, value)
            continue
        sub_raw, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        sub = GGUFValueType(sub_raw)
        if sub == GGUFValueType.STRING:
            items = []
            for _ in range(count):
                s, pos = read_str(pos)
                items.append(s)
        elif sub in _NP_DTYPE:
            arr = np.frombuffer(buf, dtype=_NP_DTYPE[sub], count=count, offset=pos)
            pos += arr.nbytes
            items = arr.tolist()
        else:
            raise ValueError(f"{key}: nested arrays are not supported")
        if want:
            tok.kv[key] = KV(vtype, items, sub)
    return tok


def tiny_llama(path: str | os.PathLike, tokenizer_from: str | os.PathLike | GGUFReader | Tokenizer,
               edit: Callable[[Tokenizer], Any] | Mapping[str, Any] | None = None, *, n_layer: int = 2,
               n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2, n_ff: int = 128, seed: int = 0,
               nextn_layers: int = 0, nextn_extra: bool = False, dtype: str = "F32", tie_embeddings: bool = False,
               n_ctx_train: int = 2048, name: str = "tiny-llama") -> Path:
    """Write a tiny random model with the tokenizer of ``tokenizer_from`` (edited by ``edit``, see
    :meth:`Tokenizer.apply`) to ``path`` and return the path.

    ``dtype`` ("F32" or "F16") is the type of the 2-D weights (norms stay F32). ``tie_embeddings`` omits
    ``output.weight`` (llama.cpp then reuses ``token_embd.weight``). ``nextn_layers`` > 0 writes an
    ``exaone4`` model with that many NextN/MTP blocks (module docstring)."""
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must be a multiple of n_head, and n_head of n_head_kv")
    if dtype not in ("F32", "F16"):
        raise ValueError("dtype must be F32 or F16")
    tok = read_tokenizer(tokenizer_from).apply(edit)
    n_vocab = tok.n_tokens
    head_dim = n_embd // n_head
    n_blocks = n_layer + nextn_layers
    arch = NEXTN_ARCH if nextn_layers else "llama"
    wtype = np.float16 if dtype == "F16" else np.float32
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        # numpy shape (rows, cols) is GGML ne {cols, rows}: llama.cpp's {n_in, n_out} for a weight
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(wtype)

    def norm(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    path = Path(path)
    writer = GGUFWriter(path, arch)
    writer.add_type("model")
    writer.add_name(name)
    writer.add_file_type(LlamaFileType.MOSTLY_F16 if dtype == "F16" else LlamaFileType.ALL_F32)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_blocks)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(n_vocab)
    if nextn_layers:
        writer.add_nextn_predict_layers(nextn_layers)
    tok.write_to(writer)

    arch_tensors = MODEL_TENSORS[MODEL_ARCH.EXAONE4 if nextn_layers else MODEL_ARCH.LLAMA]

    def add(kind: MODEL_TENSOR, data: np.ndarray, bid: int | None = None) -> None:
        # gguf-py's canonical names, i.e. llama.cpp's (e.g. ATTN_POST_NORM -> blk.N.post_attention_norm)
        assert kind in arch_tensors, f"{kind.name} is not a {arch} tensor"
        writer.add_tensor(TENSOR_NAMES[kind].format(bid=bid) + ".weight", data)

    T = MODEL_TENSOR
    kv_dim = head_dim * n_head_kv
    add(T.TOKEN_EMBD, matrix(n_vocab, n_embd))
    add(T.OUTPUT_NORM, norm(n_embd))
    if not tie_embeddings:
        add(T.OUTPUT, matrix(n_vocab, n_embd))
    for bid in range(n_blocks):
        if arch == "llama":
            add(T.ATTN_NORM, norm(n_embd), bid)
        add(T.ATTN_Q, matrix(n_embd, n_embd), bid)
        add(T.ATTN_K, matrix(kv_dim, n_embd), bid)
        add(T.ATTN_V, matrix(kv_dim, n_embd), bid)
        add(T.ATTN_OUT, matrix(n_embd, n_embd), bid)
        if arch == "llama":
            add(T.FFN_NORM, norm(n_embd), bid)
        else:  # exaone4: q/k norms and post-norms instead of pre-norms
            add(T.ATTN_Q_NORM, norm(head_dim), bid)
            add(T.ATTN_K_NORM, norm(head_dim), bid)
            add(T.ATTN_POST_NORM, norm(n_embd), bid)
            add(T.FFN_POST_NORM, norm(n_embd), bid)
        add(T.FFN_GATE, matrix(n_ff, n_embd), bid)
        add(T.FFN_UP, matrix(n_ff, n_embd), bid)
        add(T.FFN_DOWN, matrix(n_embd, n_ff), bid)
        if bid >= n_layer:  # a NextN/MTP block
            add(T.NEXTN_EH_PROJ, matrix(n_embd, 2 * n_embd), bid)
            add(T.NEXTN_ENORM, norm(n_embd), bid)
            add(T.NEXTN_HNORM, norm(n_embd), bid)
            add(T.NEXTN_SHARED_HEAD_NORM, norm(n_embd), bid)
            if nextn_extra:
                add(T.NEXTN_EMBED_TOKENS, matrix(n_vocab, n_embd), bid)
                add(T.NEXTN_SHARED_HEAD_HEAD, matrix(n_vocab, n_embd), bid)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
