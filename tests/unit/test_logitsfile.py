"""pipeline/stages/logitsfile.py on --kl-divergence-base files synthesized here with the writer's arithmetic
(perplexity.cpp's log_softmax: -16 clamp, uint16 steps, odd n_vocab padding), from known logits."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import PipelineError
from pipeline.stages.logitsfile import (
    KLD_LOG_PROB_FLOOR,
    encode_record,
    expected_size,
    read_logits_file,
    record_words,
    write_logits_file,
)

N_CTX, N_VOCAB, N_CHUNK = 10, 37, 3  # odd vocab: one padding word per record; 4 records per chunk


def log_softmax64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


@pytest.fixture
def synthetic(tmp_path):
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, N_VOCAB, N_CHUNK * N_CTX).astype(np.int32)
    tokens[N_CTX // 2 + 1] = 5  # the first record of chunk 0 scores a clamped token
    chunks = []
    for _ in range(N_CHUNK):
        logits = rng.normal(0, 3, (N_CTX - 1 - N_CTX // 2, N_VOCAB)).astype(np.float32)
        logits[:, 5] = logits.max(axis=1) - 25  # far below the top: clamped, stored as q=0
        logits[:, 6] = logits.max(axis=1) - 15.5  # just inside the 16-nat window
        chunks.append(logits)
    path = tmp_path / "base.logits"
    write_logits_file(path, N_CTX, tokens, chunks)
    return path, tokens, chunks


def test_header_tokens_targets_and_size(synthetic):
    path, tokens, _ = synthetic
    lf = read_logits_file(path)
    assert (lf.n_ctx, lf.n_vocab, lf.n_chunk, lf.first, lf.n_scored) == (N_CTX, N_VOCAB, N_CHUNK, 5, 4)
    assert path.stat().st_size == expected_size(N_CTX, N_VOCAB, N_CHUNK)
    assert record_words(N_VOCAB) == 42 and record_words(38) == 42  # rounded up to even, plus 4
    assert np.array_equal(lf.tokens, tokens)
    assert np.array_equal(lf.chunk_tokens(1), tokens[N_CTX:2 * N_CTX])
    # record r of chunk c scores tokens[c*n_ctx + first + r + 1]: the last position's logits are never stored
    assert np.array_equal(lf.targets(2), tokens[2 * N_CTX + 6:3 * N_CTX])
    # BOS substitution at each chunk's first position, the stored tokens untouched
    ids = lf.model_input(1, bos=33)
    assert ids[0] == 33 and np.array_equal(ids[1:], tokens[N_CTX + 1:2 * N_CTX]) and lf.tokens[N_CTX] == tokens[N_CTX]
    assert np.array_equal(lf.model_input(1, bos=None), tokens[N_CTX:2 * N_CTX])
    # odd n_vocab: the padding word after the last token is zero
    assert not lf.records[..., 4 + N_VOCAB:].any()
    with pytest.raises(IndexError):
        lf.targets(N_CHUNK)


def test_log_probs_decode_within_one_step(synthetic):
    path, _, chunks = synthetic
    lf = read_logits_file(path)
    for c, logits in enumerate(chunks):
        got = lf.log_probs(c)
        assert got.dtype == np.float32 and got.shape == (lf.n_scored, N_VOCAB)
        want = log_softmax64(logits)
        top = logits.max(axis=1, keepdims=True)
        inside = logits > top - 16
        scale, min_lp = lf.scales(c)
        assert np.all(scale <= 16 / 65535 * (1 + 1e-6))
        # every token inside the window decodes within half a step (plus float32 rounding) of its log-prob
        err = np.abs(got.astype(np.float64) - want)[inside]
        assert err.max() <= 16 / 65535 / 2 + 2e-5, err.max()
        # the top token decodes to -log_sum_exp
        lse = np.log(np.exp(logits.astype(np.float64) - top).sum(axis=1))
        assert np.allclose(got[np.arange(lf.n_scored), logits.argmax(axis=1)], -lse, atol=2e-5)
        # the clamp: 16 nats below the top logit, stored as 0, decoded as min_log_prob = -16 - log_sum_exp
        assert not lf.records[c, :, 4 + 5].any()
        assert np.array_equal(got[:, 5], min_lp) and np.allclose(min_lp, -16 - lse, atol=2e-5)
        assert np.all(got[:, 5] <= KLD_LOG_PROB_FLOOR)  # what kl_divergence() leaves out of the KLD sum
        # 15.5 nats below the top logit is inside the window (stored), but the KLD floor is an absolute
        # log-prob: with log_sum_exp > 0.5 such a token is left out of the KLD sum all the same
        assert lf.records[c, :, 4 + 6].all()
        assert np.array_equal(got[:, 6] <= KLD_LOG_PROB_FLOOR, logits[:, 6] - top[:, 0] - lse <= -16)
        # one row at a time gives the same numbers
        assert np.array_equal(lf.log_probs(c, slice(2, 3))[0], got[2])


def test_target_log_probs_and_mean_ppl_base(synthetic):
    path, tokens, chunks = synthetic
    lf = read_logits_file(path)
    nll = []
    for c, logits in enumerate(chunks):
        tgt = lf.targets(c)
        assert np.array_equal(lf.target_log_probs(c), lf.log_probs(c)[np.arange(lf.n_scored), tgt])
        assert np.array_equal(lf.target_clamped(c), tgt == 5)
        true = log_softmax64(logits)[np.arange(lf.n_scored), tgt]
        ok = tgt != 5  # a clamped target decodes to an upper bound of its log-prob
        assert np.abs(lf.target_log_probs(c)[ok] - true[ok]).max(initial=0) < 16 / 65535 / 2 + 2e-5
        assert np.all(lf.target_log_probs(c)[~ok] > true[~ok])
        nll.append(-lf.log_probs(c)[np.arange(lf.n_scored), tgt].astype(np.float64))
    want = float(np.exp(np.concatenate(nll).mean()))
    assert lf.mean_ppl_base() == pytest.approx(want, rel=1e-12)
    assert lf.mean_ppl_base(1) == pytest.approx(float(np.exp(nll[0].mean())), rel=1e-12)
    with pytest.raises(IndexError):
        lf.mean_ppl_base(N_CHUNK + 1)


def test_encode_record_edge_cases():
    # all logits within 16 nats: min_logit is the smallest logit (stored 0, decoded exactly as its log-prob)
    logits = np.array([0.0, 16.0, 8.0, 4.0, 12.0], dtype=np.float32)
    rec = encode_record(logits)
    assert rec.shape == (record_words(5),) and rec[-1] == 0  # padding word
    scale, min_lp = rec[:4].view("<f4")
    q = rec[4:9]
    assert q[1] == 65535 and q[0] == 0 and scale == np.float32(np.float32(16) / np.float32(65535))
    assert abs(float(min_lp) - log_softmax64(logits)[0]) < 1e-6
    # equal logits: scale 0, every q 0, every token decodes to -log(n_vocab)
    flat = encode_record(np.full(6, 3.5, dtype=np.float32))
    s, m = flat[:4].view("<f4")
    assert s == 0 and not flat[4:].any() and m == pytest.approx(-np.log(6), abs=1e-6)
    # a logit exactly 16 below the top sits on min_logit: not above it, so 0
    assert encode_record(np.array([10.0, -6.0, 9.0], dtype=np.float32))[4 + 1] == 0


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:-3], r"truncated base logits: \d+ bytes, n_ctx=10 n_vocab=37 n_chunk=3 need \d+"),
    (lambda b: b[:200], r"truncated base logits"),
    (lambda b: b[:12], r"truncated base logits: 12 bytes, the header alone needs 20"),
    (lambda b: b[:5], r"truncated base logits: 5 bytes"),
    (lambda b: b + b"\0\0", r"oversized base logits"),
    (lambda b: b"GGUF" + b[4:], r"not a llama-perplexity --kl-divergence-base file \(magic b'GGUF"),
    (lambda b: b[:8] + np.array([10, 37, 0], "<i4").tobytes() + b[20:], r"header is invalid: .*n_chunk=0"),
    (lambda b: b[:20] + np.array([99], "<i4").tobytes() + b[24:], r"token 0 of the base logits is 99, outside"),
    (lambda b: b"", r"the base logits are empty"),
])
def test_refuses_damaged_files(synthetic, damage, message):
    path, _, _ = synthetic
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(PipelineError, match=message) as exc:
        read_logits_file(path)
    assert str(exc.value).startswith(f"{path}: ") and "\n" not in str(exc.value)


def test_missing_file(tmp_path):
    with pytest.raises(PipelineError, match=r"cannot read the base logits"):
        read_logits_file(tmp_path / "nope.logits")
