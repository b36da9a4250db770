"""Stage device-slice: the eval slice a device re-measures with ``ggufpipe device-check`` (pipeline/devices/check.py).

The slice is the first ``device_slice`` chunks (1 or 2) of the recipe's first eval set, published as their base logits
(``device-slice.logits``: llama-perplexity's ``--kl-divergence-base`` file, which carries the chunks' tokens, so a
device needs no text and no tokenizer). It is cut from the eval set's base logits (:func:`write_slice`): a
``--kl-divergence-base`` run evaluates each chunk alone, so the first N chunks of a 16-chunk file are the file a run
over N chunks writes (tests/e2e/test_device_check.py compares the bytes).

The build box's slice values come from runs it makes anyway: each quant's eval row N (the running statistics after
chunk N, :func:`pipeline.stages.evaluate.parse_chunk_rows`, the same accumulators a run over N chunks ends with); the
base file's own value (its KLD against its own logits: not 0, the logits are stored as 16-bit steps) from one run
here, which also proves llama-perplexity reads the slice.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.fsutil import atomic_output, sha256_file, write_json_atomic
from pipeline.recipe import EvalSet, scored_tokens
from pipeline.tools import Toolchain, find_toolchain

MAGIC = b"_logits_"
_HEADER = struct.Struct("=8siii")  # magic, n_ctx, n_vocab, n_chunk (perplexity.cpp: native order, no padding)
COPY_BLOCK = 1 << 22


def _record_bytes(n_vocab: int) -> int:
    """One scored token's record: n_vocab uint16 rounded up to even, plus two float32 (min and scale)."""
    return 2 * (2 * ((n_vocab + 1) // 2) + 4)


def logits_bytes(ctx: int, chunks: int, n_vocab: int) -> int:
    """Size of the ``llama-perplexity --kl-divergence-base`` file: a 20-byte header, the ctx * chunks
    tokens (int32), then for each scored token (the last ctx - 1 - ctx/2 of each chunk) the vocabulary's
    log-probabilities as uint16 (n_vocab rounded up to even) plus 4 uint16 (min and scale floats)."""
    return _HEADER.size + 4 * ctx * chunks + chunks * (ctx - 1 - ctx // 2) * _record_bytes(n_vocab)


def read_logits_header(path: Path) -> tuple[int, int, int]:
    """(n_ctx, n_vocab, n_chunk) of a ``--kl-divergence-base`` file; PipelineError when it is not one or its size is
    not the one its header implies."""
    with open(path, "rb") as fh:
        head = fh.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise PipelineError(f"{path}: {len(head)} bytes: not a llama-perplexity base-logits file")
    magic, n_ctx, n_vocab, n_chunk = _HEADER.unpack(head)
    if magic != MAGIC or n_ctx < 2 or n_vocab < 1 or n_chunk < 1:
        raise PipelineError(f"{path}: header {magic!r} n_ctx={n_ctx} n_vocab={n_vocab} n_chunk={n_chunk}: not a "
                            "llama-perplexity base-logits file")
    want = logits_bytes(n_ctx, n_chunk, n_vocab)
    if path.stat().st_size != want:
        raise PipelineError(f"{path}: {path.stat().st_size} bytes, its header (n_ctx {n_ctx}, n_vocab {n_vocab}, "
                            f"{n_chunk} chunks) implies {want}: truncated or not a base-logits file")
    return n_ctx, n_vocab, n_chunk


def write_slice(src: str | Path, dst: str | Path, chunks: int) -> dict:
    """The first ``chunks`` chunks of the base-logits file ``src`` as a base-logits file of their own, written
    atomically to ``dst``: its header with ``n_chunk = chunks``, their tokens, their records. Returns its facts."""
    src, dst = Path(src), Path(dst)
    n_ctx, n_vocab, n_chunk = read_logits_header(src)
    if not 1 <= chunks <= n_chunk:
        raise PipelineError(f"{src}: holds {n_chunk} chunks, the slice asks for {chunks}")
    spans = [(_HEADER.size, 4 * chunks * n_ctx),  # tokens
             (_HEADER.size + 4 * n_chunk * n_ctx, _record_bytes(n_vocab) * chunks * (n_ctx - 1 - n_ctx // 2))]
    with open(src, "rb") as fin, atomic_output(dst) as tmp, open(tmp, "wb") as fout:
        fout.write(_HEADER.pack(MAGIC, n_ctx, n_vocab, chunks))
        for start, length in spans:
            fin.seek(start)
            while length:
                block = fin.read(min(COPY_BLOCK, length))
                if not block:
                    raise PipelineError(f"{src}: ended early (truncated)")
                fout.write(block)
                length -= len(block)
    if dst.stat().st_size != logits_bytes(n_ctx, chunks, n_vocab):
        raise PipelineError(f"{dst}: written with {dst.stat().st_size} bytes, expected {logits_bytes(n_ctx, chunks, n_vocab)}")
    return {"n_ctx": n_ctx, "n_vocab": n_vocab, "chunks": chunks}


def device_slice(recipe_name: str, es: EvalSet, chunks: int, base_gguf: str | Path, base_logits: str | Path,
                 base_record: str | Path, out_logits: str | Path, record: str | Path, threads: int = 2,
                 log: str | Path | None = None, tc: Toolchain | None = None) -> dict:
    """Entry function: cut the slice from the eval set's base logits (recomputed first when ``ggufpipe clean-logits``
    emptied them) and measure the base file on it."""
    import json

    from pipeline.stages.evaluate import kl_divergence, restore_base_logits

    tc = tc or find_toolchain()
    what = f"{recipe_name}: device slice ({chunks} chunk(s) of eval set {es.name})"
    base = json.loads(Path(base_record).read_text())
    restore_base_logits(tc, es, base_gguf, base_logits, base_record, threads, log, what)
    facts = write_slice(base_logits, out_logits, chunks)
    if facts["n_ctx"] != es.ctx:
        raise PipelineError(f"{what}: {base_logits} was written at n_ctx {facts['n_ctx']}, the eval set has ctx {es.ctx}")
    metrics, res = kl_divergence(tc, dataclasses.replace(es, chunks=chunks), base_gguf, out_logits, threads, log, what)
    rec = {
        "eval_set": es.name,
        "text": base["text"],
        "text_sha256": base["text_sha256"],
        "ctx": es.ctx,
        "chunks": chunks,
        "scored_tokens": scored_tokens(es.ctx, chunks),
        "n_vocab": facts["n_vocab"],
        "file": Path(out_logits).name,
        "sha256": sha256_file(out_logits),
        "size_bytes": Path(out_logits).stat().st_size,
        "threads": threads,
        "base_metrics": metrics,
        "seconds": round(res.seconds, 1),
    }
    write_json_atomic(record, rec)
    return rec
