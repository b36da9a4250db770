"""Read llama-perplexity's ``--kl-divergence-base`` file (the base logits eval-base writes) with numpy.

The format is the one ``tools/perplexity/perplexity.cpp`` of the pinned llama.cpp (b11312) writes and reads
(native byte order, little-endian here; no padding between the fields):

* ``char[8]`` magic ``_logits_``, then ``int32`` ``n_ctx`` (the ``-c`` value: one chunk), ``int32`` ``n_vocab``,
  ``int32`` ``n_chunk`` (perplexity.cpp:466-467, 521-522);
* ``int32[n_chunk * n_ctx]``: the evaluated token ids in text order, as tokenized (BOS included when the vocab
  adds one; the BOS that llama-perplexity swaps into each chunk's first position is not stored, 565-580);
* ``n_chunk * (n_ctx - 1 - n_ctx/2)`` records, chunk by chunk: record ``r`` of chunk ``c`` is the distribution
  at in-chunk position ``n_ctx/2 + r`` and scores the token after it (540, 573, 607-614). A record is
  ``nv = 2*((n_vocab+1)/2) + 4`` uint16 words: words 0-1 are the float32 ``scale``, words 2-3 the float32
  ``min_log_prob``, then one ``q`` per token (one zero padding word when n_vocab is odd). ``log_softmax``
  (79-107) clamps the logits 16 nats below the top one, and stores ``q = nearest_int((logit - min_logit) /
  scale)``, 0 for a clamped logit. Its reader (``kl_divergence``, 191-252) decodes
  ``log_prob = scale*q + min_log_prob`` in float32; :meth:`LogitsFile.log_probs` does the same.

The records are memory-mapped, not read: a 16-chunk file of a 49k-token vocabulary is 400 MB, of a 256k one
2 GB, and a conformance check reads a few chunks of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import PipelineError

MAGIC = b"_logits_"
HEADER_BYTES = 20
# kl_divergence() sums only the base tokens whose decoded log-prob is above this absolute value (perplexity.cpp:229).
KLD_LOG_PROB_FLOOR = np.float32(-16.0)


def record_words(n_vocab: int) -> int:
    """uint16 words of one record: n_vocab rounded up to even, plus the two float32 of the header."""
    return 2 * ((n_vocab + 1) // 2) + 4


def scored_per_chunk(n_ctx: int) -> int:
    return n_ctx - 1 - n_ctx // 2


def expected_size(n_ctx: int, n_vocab: int, n_chunk: int) -> int:
    return HEADER_BYTES + 4 * n_chunk * n_ctx + 2 * record_words(n_vocab) * n_chunk * scored_per_chunk(n_ctx)


@dataclass(frozen=True)
class LogitsFile:
    """One ``--kl-divergence-base`` file: its header, tokens and (memory-mapped) records."""

    path: Path
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray  # int32, n_chunk * n_ctx
    records: np.ndarray  # uint16 memmap, (n_chunk, n_scored, nv)

    @property
    def first(self) -> int:
        """In-chunk position of the first scored distribution (``n_ctx/2``)."""
        return self.n_ctx // 2

    @property
    def n_scored(self) -> int:
        """Records per chunk."""
        return scored_per_chunk(self.n_ctx)

    def _check_chunk(self, chunk: int) -> None:
        if not 0 <= chunk < self.n_chunk:
            raise IndexError(f"{self.path}: chunk {chunk} out of range (the file holds {self.n_chunk})")

    def chunk_tokens(self, chunk: int) -> np.ndarray:
        """The ``n_ctx`` token ids of ``chunk`` as stored (no BOS substitution)."""
        self._check_chunk(chunk)
        return self.tokens[chunk * self.n_ctx:(chunk + 1) * self.n_ctx]

    def model_input(self, chunk: int, bos: int | None) -> np.ndarray:
        """The ids llama-perplexity evaluates for ``chunk``: the stored ones with the first replaced by ``bos``
        (pass the vocab's BOS id when its add_bos is true, else None; perplexity.cpp:565-580)."""
        ids = np.array(self.chunk_tokens(chunk), dtype=np.int64)
        if bos is not None:
            ids[0] = bos
        return ids

    def targets(self, chunk: int) -> np.ndarray:
        """The token each record of ``chunk`` scores: ``tokens[c*n_ctx + first + r + 1]``."""
        ids = self.chunk_tokens(chunk)
        return np.asarray(ids[self.first + 1:self.n_ctx], dtype=np.int64)

    def scales(self, chunk: int) -> tuple[np.ndarray, np.ndarray]:
        """(scale, min_log_prob) of every record of ``chunk``, float32."""
        self._check_chunk(chunk)
        head = np.ascontiguousarray(self.records[chunk, :, :4]).view("<f4")  # (n_scored, 2)
        return head[:, 0].copy(), head[:, 1].copy()

    def log_probs(self, chunk: int, rows: slice | None = None) -> np.ndarray:
        """float32 log-probabilities (n_rows, n_vocab) of the records ``rows`` (default: all) of ``chunk``,
        decoded as kl_divergence() decodes them: ``scale*q + min_log_prob`` in float32."""
        self._check_chunk(chunk)
        rows = rows or slice(0, self.n_scored)
        rec = self.records[chunk, rows]
        head = np.ascontiguousarray(rec[:, :4]).view("<f4")
        scale, min_lp = head[:, :1], head[:, 1:2]
        q = rec[:, 4:4 + self.n_vocab].astype(np.float32)
        return q * scale + min_lp  # float32 product, rounded, then float32 sum: no fused multiply-add in the C++

    def target_log_probs(self, chunk: int) -> np.ndarray:
        """float32 log-prob of each record's target token (``-nll_base`` of kl_divergence())."""
        self._check_chunk(chunk)
        tgt = self.targets(chunk)
        scale, min_lp = self.scales(chunk)
        q = self.records[chunk, np.arange(self.n_scored), 4 + tgt].astype(np.float32)
        return q * scale + min_lp

    def target_clamped(self, chunk: int) -> np.ndarray:
        """True where a record's target was clamped (stored q=0: its logit was at least 16 nats below the
        top one): its decoded log-prob is an upper bound, not the value."""
        self._check_chunk(chunk)
        tgt = self.targets(chunk)
        return self.records[chunk, np.arange(self.n_scored), 4 + tgt] == 0

    def mean_ppl_base(self, n_chunks: int | None = None) -> float:
        """``Mean PPL(base)`` of a ``--kl-divergence`` run over the first ``n_chunks`` chunks (default all):
        exp of the mean of the float32 ``nll_base``, summed in double (perplexity.cpp:214, 1901)."""
        n = self.n_chunk if n_chunks is None else n_chunks
        if not 0 < n <= self.n_chunk:
            raise IndexError(f"{self.path}: {n} chunks asked, the file holds {self.n_chunk}")
        total = 0.0
        for c in range(n):
            nll = -self.target_log_probs(c)
            total += float(np.sum(nll.astype(np.float64)))
        return float(np.exp(total / (n * self.n_scored)))


def read_logits_file(path: str | os.PathLike) -> LogitsFile:
    """Open ``path``; a PipelineError (one line: the path and what is wrong) for a file that is not a
    complete ``--kl-divergence-base`` file."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(HEADER_BYTES)
    except OSError as exc:
        raise PipelineError(f"{path}: cannot read the base logits: {exc.strerror or exc}") from None
    if size == 0:
        raise PipelineError(f"{path}: the base logits are empty (cleaned by `ggufpipe clean-logits`?): "
                            "run eval-base again")
    if not (MAGIC.startswith(head) if len(head) < 8 else head[:8] == MAGIC):
        raise PipelineError(f"{path}: not a llama-perplexity --kl-divergence-base file "
                            f"(magic {head[:8]!r}, expected {MAGIC!r})")
    if len(head) < HEADER_BYTES:
        raise PipelineError(f"{path}: truncated base logits: {size} bytes, the header alone needs {HEADER_BYTES} "
                            "(llama-perplexity stopped early?)")
    n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(head, "<i4", 3, 8))
    if n_ctx < 2 or n_vocab < 1 or n_chunk < 1:
        raise PipelineError(f"{path}: base logits header is invalid: n_ctx={n_ctx}, n_vocab={n_vocab}, "
                            f"n_chunk={n_chunk}")
    want = expected_size(n_ctx, n_vocab, n_chunk)
    if size != want:
        what = "truncated" if size < want else "oversized"
        raise PipelineError(f"{path}: {what} base logits: {size} bytes, n_ctx={n_ctx} n_vocab={n_vocab} "
                            f"n_chunk={n_chunk} need {want} (llama-perplexity stopped early, or not its file)")
    tokens = np.fromfile(path, dtype="<i4", count=n_chunk * n_ctx, offset=HEADER_BYTES)
    bad = (tokens < 0) | (tokens >= n_vocab)
    if bad.any():
        i = int(np.argmax(bad))
        raise PipelineError(f"{path}: token {i} of the base logits is {int(tokens[i])}, outside the vocabulary "
                            f"of {n_vocab}")
    nv = record_words(n_vocab)
    records = np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES + 4 * n_chunk * n_ctx,
                        shape=(n_chunk, scored_per_chunk(n_ctx), nv))
    return LogitsFile(path, n_ctx, n_vocab, n_chunk, tokens, records)


# --------------------------------------------------------------------------- writer (tests)


def _nearest_int(x: np.ndarray) -> np.ndarray:
    """perplexity.cpp's nearest_int: float32 ``x + 12582912.f``, low 23 bits of its representation, minus 2^22
    (rounds half to even, like the FPU)."""
    val = (np.asarray(x, dtype=np.float32) + np.float32(12582912.0)).astype(np.float32)
    return (val.view(np.int32) & 0x007FFFFF) - 0x00400000


def encode_record(logits: np.ndarray) -> np.ndarray:
    """One record (``record_words(n_vocab)`` uint16) for float32 ``logits``, with the arithmetic of
    perplexity.cpp's ``log_softmax`` writer (79-107): float32 max/min, the sum of ``expf`` in double, its
    ``log`` in double then float32, ``inv_scale = 1/scale`` and ``nearest_int(inv_scale*(logit - min_logit))``.
    Used by the tests to synthesize files from known log-probs (numpy's float32 exp may differ from glibc's
    expf in the last bit; the sum is in double either way)."""
    logits = np.asarray(logits, dtype=np.float32)
    n_vocab = logits.shape[0]
    max_logit = np.float32(logits.max())
    min_logit = np.float32(max(np.float32(logits.min()), np.float32(max_logit - np.float32(16))))
    sum_exp = float(np.sum(np.exp((logits - max_logit).astype(np.float32)).astype(np.float64)))
    log_sum_exp = np.float32(np.log(sum_exp))
    min_log_prob = np.float32(np.float32(min_logit - max_logit) - log_sum_exp)
    scale = np.float32(np.float32(max_logit - min_logit) / np.float32(65535.0))
    out = np.zeros(record_words(n_vocab), dtype="<u2")
    out[:4] = np.array([scale, min_log_prob], dtype="<f4").view("<u2")
    if scale != 0:
        inv_scale = np.float32(np.float32(1.0) / scale)
        q = _nearest_int((inv_scale * (logits - min_logit).astype(np.float32)).astype(np.float32))
        out[4:4 + n_vocab] = np.where(logits > min_logit, q, 0).astype("<u2")
    return out


def write_header(fh, n_ctx: int, n_vocab: int, n_chunk: int) -> None:
    """The 20-byte header of a ``--kl-divergence-base`` file into the binary file ``fh``."""
    fh.write(MAGIC)
    fh.write(np.array([n_ctx, n_vocab, n_chunk], dtype="<i4").tobytes())


def write_logits_file(path: str | os.PathLike, n_ctx: int, tokens: np.ndarray, logits_per_chunk) -> None:
    """Write a ``--kl-divergence-base`` file: ``tokens`` (n_chunk * n_ctx ids) and, per chunk, the float32
    logits (n_scored, n_vocab) of its scored positions. For tests; the pipeline's files come from
    llama-perplexity."""
    tokens = np.asarray(tokens, dtype="<i4")
    chunks = [np.asarray(c, dtype=np.float32) for c in logits_per_chunk]
    n_chunk = len(chunks)
    n_vocab = chunks[0].shape[1]
    assert tokens.shape == (n_chunk * n_ctx,) and all(c.shape == (scored_per_chunk(n_ctx), n_vocab) for c in chunks)
    with open(path, "wb") as fh:
        write_header(fh, n_ctx, n_vocab, n_chunk)
        fh.write(tokens.tobytes())
        for c in chunks:
            for row in c:
                fh.write(encode_record(row).tobytes())
