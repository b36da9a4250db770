"""The embedded demo model proves itself: its F16 GGUF has the source GGUF's vocab, llama.cpp and the
HF tokenizer agree on real text, and F16 perplexity matches the source GGUF's within 1%."""

from __future__ import annotations

import hashlib
import json

import pytest
from helpers import DEMO_RECIPE, DEMO_TEST_CHUNKS

from pipeline.errors import ToolError
from pipeline.gguf import read_header
from pipeline.stages.evaluate import perplexity
from pipeline.tools import run_tool

# The source run's chunks, the first of the test-sized build's: the F16 is 0.25% off the source over 8 chunks as over 16
# (0.6% over 4)
SOURCE_CHUNKS = 8


def _vocab(path):
    field = read_header(path).get
    return {
        "model": field("tokenizer.ggml.model"),
        "pre": field("tokenizer.ggml.pre"),
        "tokens": field("tokenizer.ggml.tokens"),
        "types": field("tokenizer.ggml.token_type"),
        "merges": field("tokenizer.ggml.merges"),
        "bos": field("tokenizer.ggml.bos_token_id"),
        "eos": field("tokenizer.ggml.eos_token_id"),
        "add_bos": bool(field("tokenizer.ggml.add_bos_token", False)),
    }


@pytest.fixture(scope="module")
def f16(demo_build):
    return demo_build / "artifacts" / "smollm2-135m" / "smollm2-135m-F16.gguf"


def test_f16_has_source_vocab(f16, source_gguf):
    src, out = _vocab(source_gguf), _vocab(f16)
    assert out["model"] == "gpt2" and out["pre"] == "smollm"
    assert len(out["tokens"]) == 49152
    assert out["tokens"] == src["tokens"]
    assert len(out["merges"]) == len(src["merges"]) == 48900
    assert out["merges"] == src["merges"]
    assert out["types"] == src["types"]
    assert (out["bos"], out["eos"]) == (src["bos"], src["eos"]) == (1, 2)
    assert out["add_bos"] is src["add_bos"] is False


def test_eval_text_normalised(eval_text):
    raw = eval_text.read_bytes()
    assert not raw.startswith(b"\xef\xbb\xbf") and b"\r" not in raw
    assert raw.startswith(b"Project Gutenberg's Botchan")
    assert len(raw) > 250_000
    from pipeline.demo import BOTCHAN_SHA256

    assert hashlib.sha256(raw).hexdigest() == BOTCHAN_SHA256
    # the copy in the repo that the demo recipe gates on is exactly that text
    assert (DEMO_RECIPE.parent.parent / "data" / "botchan.txt").read_bytes() == raw


def test_llama_tokenize_matches_hf_tokenizer(f16, demo_snapshot, eval_text, toolchain, tmp_path):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(demo_snapshot))
    lines = eval_text.read_text().splitlines(keepends=True)
    paragraphs = ["".join(lines[i:i + 12]) for i in range(400, 4400, 800)]  # five passages of the book
    paragraphs.append("Numbers 1234567 and 3.14, emoji 🦙, <|im_start|>user\nHi<|im_end|>")
    assert len(paragraphs) == 6
    for i, text in enumerate(paragraphs):
        f = tmp_path / f"p{i}.txt"
        f.write_text(text)
        res = run_tool(toolchain, "llama-tokenize", ["-m", f16, "-f", f, "--ids", "--log-disable"], None)
        ids = json.loads(res.output.strip().splitlines()[-1])
        assert ids == hf.encode(text), f"paragraph {i} tokenizes differently"


def test_f16_perplexity_matches_source(f16, demo_build, source_gguf, eval_text, toolchain, tmp_path):
    """llama-perplexity run here on the source GGUF (ctx 512, the first SOURCE_CHUNKS chunks of the eval text)
    against the F16's perplexity over the same chunks, read from the base logits the build's eval-base stage
    saved: the F16 is the source model (within 1%); and the F16 perplexity recorded in the manifest (all the
    build's chunks) is the one those logits, the tool's own, give."""
    from pipeline.stages.logitsfile import read_logits_file

    manifest = json.loads((f16.parent / "manifest.json").read_text())
    es = next(e for e in manifest["eval_sets"] if e["name"] == "botchan")
    assert (es["ctx"], es["chunks"]) == (512, DEMO_TEST_CHUNKS) and SOURCE_CHUNKS <= DEMO_TEST_CHUNKS, es
    ppl_f16 = manifest["eval_base"]["botchan"]["ppl"]
    logits = read_logits_file(demo_build / "work" / "smollm2-135m" / "eval" / "botchan" / "base.logits")
    assert (logits.n_ctx, logits.n_chunk) == (512, DEMO_TEST_CHUNKS)
    # the manifest's figure is printed to 4 decimals from the tool's float logits; the file holds them as 16 bits
    assert abs(logits.mean_ppl_base() - ppl_f16) <= 2e-4 * ppl_f16, (logits.mean_ppl_base(), ppl_f16)
    ppl_src, _ = perplexity(toolchain, source_gguf, eval_text, ctx=512, chunks=SOURCE_CHUNKS, log=tmp_path / "src.log")
    assert 20 < ppl_src < 35, ppl_src
    ppl_f16_first = logits.mean_ppl_base(SOURCE_CHUNKS)
    assert abs(ppl_f16_first - ppl_src) / ppl_src < 0.01, (ppl_f16_first, ppl_src)


def test_perplexity_refuses_too_short_text(f16, toolchain, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("A few words only.")
    with pytest.raises(ToolError, match="you need at least") as exc:
        perplexity(toolchain, f16, short, ctx=512, chunks=4)
    assert exc.value.tool == "llama-perplexity"


