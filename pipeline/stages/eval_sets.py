"""Eval sets beyond prose at a fixed context: chat-rendered conversations (``render: chat``) and one long chunk
(``ctx: long``). Used by pipeline/stages/evaluate.py; docs/quality-gates.md#chat-rendered-sets.

* **render: chat.** llama-perplexity tokenizes its text with special tokens left as text
  (tools/perplexity/perplexity.cpp:473: ``common_tokenize(ctx, prompt, true)``, parse_special false), so a rendered
  ``<|im_start|>`` would be scored as the characters of its name. The conversations are therefore rendered with the
  model's own template by llama.cpp (common/chat.cpp ``common_chat_templates_apply``, through ggufpipe-conformance:
  the engine that conformance compares with Hugging Face's), tokenized there with special tokens parsed, and the
  base logits are written from those ids by ggufpipe-logits (pipeline/native/logits.cpp). Each quant's
  ``llama-perplexity --kl-divergence`` then reads the tokens from the base file (perplexity.cpp:1702-1730).
* **ctx: long.** One chunk at min(the model's trained context, ``max_ctx``), resolved from the base GGUF.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.gguf.reader import read_header
from pipeline.memory import ModelShape
from pipeline.recipe import EvalSet
from pipeline.tools import Toolchain, run_helper

RENDER_HELPER = "ggufpipe-conformance"  # renders and tokenizes (pipeline/native/conformance.cpp)
LOGITS_HELPER = "ggufpipe-logits"  # writes base logits from ids (pipeline/native/logits.cpp)
ROLES = ("system", "user", "assistant")


def resolve_ctx(es: EvalSet, gguf: str | os.PathLike, what: str) -> EvalSet:
    """``es`` with a ``ctx: long`` resolved to min(the GGUF's trained context, ``max_ctx``); others unchanged."""
    if not es.long:
        return es
    n = ModelShape.from_gguf(gguf).n_ctx_train
    if n <= 0:
        raise PipelineError(f"{what}: gates {es.name}.ctx: long needs the model's trained context, and "
                            f"{Path(gguf).name} has no <arch>.context_length: give an integer ctx")
    return replace(es, ctx=min(n, es.max_ctx))


def read_conversations(path: str | os.PathLike) -> list[tuple[int, list[dict]]]:
    """(line number, messages) of every conversation of a chat JSONL file: one ``{"messages": [{"role",
    "content"}, ...]}`` a line (blank lines skipped). A PipelineError, one line naming the file and line, for
    anything else."""
    path = Path(path)
    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                d = json.loads(line)
            except ValueError as exc:
                raise PipelineError(f"{where}: not a JSON line ({exc.msg}): render: chat needs one conversation "
                                    "a line, {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}") from None
            msgs = d.get("messages") if isinstance(d, dict) else None
            if not isinstance(msgs, list) or not msgs:
                raise PipelineError(f"{where}: not a conversation: needs a non-empty \"messages\" list")
            for i, m in enumerate(msgs):
                if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
                    raise PipelineError(f"{where}: messages[{i}] is not a message: needs \"role\" (one of "
                                        f"{', '.join(ROLES)}) and a string \"content\"")
            if not any(m["role"] == "assistant" for m in msgs):
                raise PipelineError(f"{where}: the conversation has no assistant message: nothing of the model's "
                                    "own turns would be scored")
            out.append((n, msgs))
    if not out:
        raise PipelineError(f"{path}: no conversation (render: chat needs JSONL, one conversation a line)")
    return out


def render_conversations(tc: Toolchain, gguf: str | os.PathLike, path: Path, what: str,
                         log: Path | None = None) -> tuple[list[str], dict, set[int]]:
    """Every conversation of the chat JSONL ``path`` rendered with ``gguf``'s chat template by llama.cpp (no
    generation prompt): the texts in file order, the record of how, and the vocabulary's special ids."""
    convs = read_conversations(path)
    reqs = [{"op": "vocab"}] + [{"op": "render", "messages": m, "add_generation_prompt": False} for _, m in convs]
    answers = run_helper(tc, RENDER_HELPER, gguf, reqs, log)
    vocab, rendered = answers[0], answers[1:]
    for (n, _), a in zip(convs, rendered, strict=True):
        if "prompt" not in a:
            raise PipelineError(f"{what}: {path}:{n}: the model's chat template rejects this conversation: "
                                f"{a.get('error', 'no prompt')}")
    template = read_header(gguf).metadata.get("tokenizer.chat_template")
    render = {"engine": "llama.cpp common_chat_templates_apply, ids by llama_tokenize(parse_special=true)",
              "template": "tokenizer.chat_template of the base GGUF",
              "template_sha256": hashlib.sha256(template.encode()).hexdigest() if isinstance(template, str) else None,
              "add_generation_prompt": False, "conversations": len(convs)}
    return [a["prompt"] for a in rendered], render, {int(k) for k in vocab.get("pieces_of_specials", {})}


def tokenize_special(tc: Toolchain, gguf: str | os.PathLike, texts: list[str], add_special: bool = False,
                     log: Path | None = None) -> list[list[int]]:
    """``texts`` tokenized by llama.cpp with special tokens parsed."""
    answers = run_helper(tc, RENDER_HELPER, gguf, [{"op": "tokenize", "text": t, "add_special": add_special,
                                                    "parse_special": True} for t in texts], log)
    return [a["ids"] for a in answers]


def render_chat(tc: Toolchain, gguf: str | os.PathLike, es: EvalSet, what: str,
                log: Path | None = None) -> tuple[list[int], dict]:
    """The ids of every conversation of ``es.text`` rendered with ``gguf``'s chat template (no generation prompt)
    and tokenized with special tokens parsed, concatenated in file order; and the record of how."""
    prompts, render, specials = render_conversations(tc, gguf, es.text, what, log)
    ids = [i for t in tokenize_special(tc, gguf, prompts, log=log) for i in t]
    return ids, {**render, "tokens": len(ids), "special_tokens": sum(1 for i in ids if i in specials)}


@contextlib.contextmanager
def base_ids_file(tc: Toolchain, gguf: str | os.PathLike, es: EvalSet, what: str, log: Path | None = None):
    """Yields (path of a file of the rendered ids, whitespace-separated; render record) for ggufpipe-logits when ``es``
    is chat-rendered, (None, None) for a text set (llama-perplexity reads its text itself)."""
    if es.render != "chat":
        yield None, None
        return
    ids, render = render_chat(tc, gguf, es, what, log)
    with tempfile.TemporaryDirectory(prefix="ggufpipe-chat-") as d:
        path = Path(d) / "ids.txt"
        path.write_text(" ".join(map(str, ids)) + "\n", encoding="ascii")
        yield path, render
