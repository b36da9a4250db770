"""Eval axes (issue #33 item 1): ``render: chat`` and ``ctx: long`` parsed with one-line refusals, chat JSONL read
with one line naming the file and line for anything that is not a conversation, ``ctx: long`` resolved from the
GGUF's trained context (refused without one), and the report's per-axis lines and per-length table. No llama.cpp
tools (the runs: tests/e2e/test_eval_axes.py)."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import BOTCHAN, ROOT, recipe_error

from pipeline.errors import PipelineError
from pipeline.recipe import load_recipe
from pipeline.stages.eval_sets import read_conversations, resolve_ctx
from pipeline.stages.evaluate import _check_length
from pipeline.stages.report_axes import axis, eval_desc, length_table
from unit.test_memory_model import llama_like

SHA = "6b5982a638c6ed4e3da15711b6a5a1328c34a53e"
CHAT = ROOT / "data" / "chat" / "chat-gate.jsonl"


def _recipe(tmp_path, *gates):
    d = {"name": "m", "source": {"repo": "org/model", "revision": SHA}, "quants": ["Q8_0"], "gates": list(gates)}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False), encoding="utf-8")
    return path


def test_render_and_long_parsed_and_described(tmp_path):
    r = load_recipe(_recipe(tmp_path, {"name": "prose", "text": str(BOTCHAN), "ctx": 512, "chunks": 16},
                            {"name": "chat", "text": str(CHAT), "render": "chat", "ctx": 512, "chunks": 9},
                            {"name": "long", "text": str(BOTCHAN), "ctx": "long", "max_ctx": 2048}))
    prose, chat, long = r.eval_sets
    assert (prose.render, prose.long) == ("text", False) and "render" not in prose.describe()  # older keys kept
    assert chat.render == "chat" and chat.describe()["render"] == "chat"
    assert (long.long, long.ctx, long.chunks) == (True, 2048, 1) and long.describe()["ctx_long"] is True
    assert r.long_eval_set is long
    default = load_recipe(_recipe(tmp_path, {"name": "long", "text": str(BOTCHAN), "ctx": "long"})).eval_sets[0]
    assert (default.ctx, default.chunks) == (4096, 1)  # the cap's default


@pytest.mark.parametrize("gate, field, what", [
    ({"ctx": "longer", "chunks": 4}, "gates[0].ctx", "must be an integer >= 16 or long"),
    ({"ctx": "long", "chunks": 4}, "gates[0].chunks", "must be 1 with ctx: long"),
    ({"ctx": "long", "max_ctx": 8}, "gates[0].max_ctx", "must be an integer 16..2147483647"),
    ({"ctx": 512, "chunks": 16, "max_ctx": 4096}, "gates[0].max_ctx", "only with ctx: long"),
    ({"ctx": 512, "chunks": 16, "render": "html"}, "gates[0].render", "must be text or chat"),
])
def test_bad_axis_fields_one_line(tmp_path, gate, field, what):
    exc = recipe_error(_recipe(tmp_path, {"name": "g", "text": str(BOTCHAN), **gate}))
    assert exc.field == field and what in exc.message, exc


@pytest.mark.parametrize("line, what", [
    ("{not json", "not a JSON line"),
    ('["a list"]', "not a conversation: needs a non-empty \"messages\" list"),
    ('{"messages": []}', "not a conversation"),
    ('{"messages": [{"role": "narrator", "content": "x"}]}', "messages[0] is not a message"),
    ('{"messages": [{"role": "user", "content": 3}]}', "messages[0] is not a message"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant message"),
])
def test_a_line_that_is_not_a_conversation_names_file_and_line(tmp_path, line, what):
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    path = tmp_path / "c.jsonl"
    path.write_text(f"{good}\n\n{line}\n{good}\n", encoding="utf-8")
    with pytest.raises(PipelineError) as e:
        read_conversations(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:3: ") and what in msg and "\n" not in msg, msg


def test_the_demo_chat_sets_read_as_conversations():
    convs = read_conversations(CHAT)
    assert len(convs) == 313 and convs[0][0] == 1
    assert all(m[0]["role"] == "user" and any(x["role"] == "assistant" for x in m) for _, m in convs)
    assert len(read_conversations(ROOT / "data" / "chat" / "chinese-gate.jsonl")) == 477


def test_long_ctx_resolves_from_the_gguf_and_refuses_an_unknown_context(tmp_path):
    r = load_recipe(_recipe(tmp_path, {"name": "long", "text": str(BOTCHAN), "ctx": "long", "max_ctx": 4096}))
    es = r.eval_sets[0]
    short = llama_like(tmp_path, "short.gguf", extra={".context_length": 2048})
    assert resolve_ctx(es, short, "m: long").ctx == 2048  # the trained context, under the cap
    wide = llama_like(tmp_path, "wide.gguf", extra={".context_length": 131072})
    assert resolve_ctx(es, wide, "m: long").ctx == 4096  # the cap
    unknown = llama_like(tmp_path, "unknown.gguf")
    with pytest.raises(PipelineError) as e:
        resolve_ctx(es, unknown, "m: eval set long: base")
    assert "gates long.ctx: long needs the model's trained context" in str(e.value)
    plain = load_recipe(_recipe(tmp_path, {"name": "p", "text": str(BOTCHAN), "ctx": 512, "chunks": 16})).eval_sets[0]
    assert resolve_ctx(plain, unknown, "x") is plain


def test_a_text_shorter_than_two_contexts_is_refused(tmp_path):
    r = load_recipe(_recipe(tmp_path, {"name": "long", "text": str(BOTCHAN), "ctx": "long", "max_ctx": 4096}))
    _check_length(8192, r.eval_sets[0], "m")
    with pytest.raises(PipelineError) as e:
        _check_length(8191, r.eval_sets[0], "m: eval set long: base")  # one chunk, yet llama-perplexity wants 2 x ctx
    assert "is too short: 8191 tokens, ctx 4096 x 1 chunks needs 8192" in str(e.value)


def _manifest():
    sets = [{"name": "prose", "text": "botchan.txt", "text_sha256": "a" * 64, "ctx": 512, "chunks": 16,
             "scored_tokens": 4080},
            {"name": "chat", "text": "chat.jsonl", "text_sha256": "b" * 64, "ctx": 512, "chunks": 9,
             "scored_tokens": 2295, "render": {"conversations": 313, "tokens": 20000, "special_tokens": 1500}},
            {"name": "long", "text": "botchan.txt", "text_sha256": "a" * 64, "ctx": 4096, "chunks": 1,
             "scored_tokens": 2047, "ctx_long": {"max_ctx": 4096}}]
    arts = [{"file": "m-Q8_0.gguf", "metrics": {"prose": {"kld_mean": 0.004}, "long": {"kld_mean": 0.005}}},
            {"file": "m-Q4_K_M.gguf", "metrics": {"prose": {"kld_mean": 0.05}, "long": {"kld_mean": 0.2}}},
            {"file": "m-F16.gguf", "metrics": {}}]
    return {"eval_sets": sets, "artifacts": arts}


def test_report_names_each_axis_and_the_kld_per_length():
    m = _manifest()
    assert [axis(es) for es in m["eval_sets"]] == ["text", "chat-rendered conversations", "long context"]
    desc = eval_desc(m)
    assert "ctx 4096, 1 chunk (2047 scored tokens); ctx = min(the model's trained context, 4096);" in desc
    assert "313 conversations rendered with the model's chat template by llama.cpp, 20000 tokens of which 1500 special" \
        in desc
    table = length_table(m)
    assert "| ctx 512 | ctx 4096 | ratio |" in table
    assert "| `m-Q8_0.gguf` | 0.00400 | 0.00500 | 1.25 |" in table
    assert "| `m-Q4_K_M.gguf` | 0.05000 | 0.20000 | 4.00 |" in table and "F16" not in table
    m["eval_sets"][2]["text_sha256"] = "c" * 64  # another text: no pair, no table
    assert length_table(m) == ""


def test_chat_calibration_parsed_and_refused_in_one_line(tmp_path):
    calib = ROOT / "data" / "chat" / "chat-calib.jsonl"
    gate = {"name": "chat", "text": str(CHAT), "render": "chat", "ctx": 512, "chunks": 9}

    def recipe(cal):
        d = {"name": "m", "source": {"repo": "org/model", "revision": SHA}, "quants": ["Q4_K_M"], "gates": [gate],
             "imatrix": {"calibration": cal}}
        path = tmp_path / "r.yaml"
        path.write_text(yaml.safe_dump(d, sort_keys=False), encoding="utf-8")
        return path

    r = load_recipe(recipe({"conversations": str(calib)}))
    assert r.imatrix.render == "chat" and r.imatrix.calibration == calib
    assert r.imatrix.describe() == {"calibration": "chat-calib.jsonl", "ctx": 512, "chunks": 32, "render": "chat"}
    assert "render" not in load_recipe(recipe(str(ROOT / "data" / "botchan-calib.txt"))).imatrix.describe()
    exc = recipe_error(recipe({"conversation": str(calib)}))
    assert exc.field == "imatrix.calibration" and "got the keys ['conversation']" in exc.message, exc
    exc = recipe_error(recipe({"conversations": str(CHAT)}))  # the chat gate's own conversations
    assert exc.field == "imatrix.calibration" and "is the eval text of gates 'chat'" in exc.message, exc


def test_card_lists_the_hub_datasets_the_recipe_names(tmp_path):
    from pipeline.stages.card import front_matter

    r = load_recipe(_recipe(tmp_path, {"name": "prose", "text": str(BOTCHAN), "ctx": 512, "chunks": 16,
                                       "hub_dataset": "Salesforce/wikitext"}))
    assert r.eval_sets[0].describe()["hub_dataset"] == "Salesforce/wikitext"
    exc = recipe_error(_recipe(tmp_path, {"name": "p", "text": str(BOTCHAN), "ctx": 512, "chunks": 16,
                                          "hub_dataset": "not a dataset id"}))
    assert exc.field == "gates[0].hub_dataset", exc
    m = {"source": {"repo": "org/model"}, "eval_sets": [{"name": "p", "hub_dataset": "Salesforce/wikitext"},
                                                        {"name": "chat"}],
         "artifacts": [{"role": "quant", "calibration": {"imatrix": {"hub_dataset": "org/calib-chat"}}},
                       {"role": "quant", "calibration": {}}, {"role": "base"}]}
    fm = front_matter(m)
    assert "datasets:\n  - Salesforce/wikitext\n  - org/calib-chat\n" in fm, fm  # sorted, as strings
    m["eval_sets"][0].pop("hub_dataset")
    m["artifacts"][0]["calibration"] = {}
    assert "datasets:" not in front_matter(m)  # the demo's texts have no Hub id: no key at all


def test_the_committed_demo_reports_every_axis():
    """The committed demo manifest (make dvc-repro): chat and Chinese sets rendered with special tokens, the long set
    at the trained context capped at 4096, every quant measured and inside each set's thresholds, conformance at the
    long chunk, and the report's per-axis headings and per-length table."""
    art = ROOT / "artifacts" / "smollm2-135m"
    m = json.loads((art / "manifest.json").read_text())
    sets = {es["name"]: es for es in m["eval_sets"]}
    assert list(sets) == ["botchan", "chat", "chinese", "code", "long"]
    assert sets["chat"]["render"]["special_tokens"] > 0 and sets["chinese"]["render"]["conversations"] == 477
    assert (sets["long"]["ctx"], sets["long"]["chunks"], sets["long"]["ctx_long"]) == (4096, 1, {"max_ctx": 4096})
    quants = [a for a in m["artifacts"] if a.get("role") == "quant"]
    assert len(quants) == 3 and all(set(sets) <= set(a["metrics"]) for a in quants) and not m["rejected"]
    long = m["conformance"]["checks"]["logits_long"]
    assert long["passed"] and long["n_ctx"] == 4096 and long["positions"] == 2047
    report = (art / "report.md").read_text()
    assert "## Eval set `chat`: chat-rendered conversations" in report and "## KLD per context length" in report


def test_draft_prompts_come_from_the_first_plain_text_set(tmp_path):
    """A draft's acceptance prompts are cut from text: a chat-rendered first set is passed over, and a recipe with no
    plain-text set must name draft.eval_text."""
    chat = {"name": "chat", "text": str(CHAT), "render": "chat", "ctx": 512, "chunks": 9}
    prose = {"name": "prose", "text": str(BOTCHAN), "ctx": 512, "chunks": 16}
    draft = {"source": {"repo": "org/small", "revision": SHA}, "quants": ["Q4_0"]}

    def write(*gates):
        d = {"name": "m", "source": {"repo": "org/model", "revision": SHA}, "quants": ["Q8_0"], "gates": list(gates),
             "draft": draft}
        path = tmp_path / "r.yaml"
        path.write_text(yaml.safe_dump(d, sort_keys=False), encoding="utf-8")
        return path

    r = load_recipe(write(chat, prose))
    assert r.draft.eval_text == BOTCHAN and r.draft_recipe().conformance.text == BOTCHAN
    exc = recipe_error(write(chat))
    assert exc.field == "draft.eval_text" and "no plain-text gates eval set" in exc.message, exc
