"""Check 3, the chat template rendered by both engines. (see pipeline/stages/conformance/__init__.py)."""

from __future__ import annotations

import time
from typing import Any

from pipeline.errors import PipelineError
from pipeline.stages.conformance.common import (
    HELPER,
    clean_piece,
    describe_diff,
    fail_line,
    first_difference,
    hf_encode,
)

# --------------------------------------------------------------------------- 3. chat template


def _template_sources(tok) -> list[str]:
    t = getattr(tok, "chat_template", None)
    if t is None:
        return []
    if isinstance(t, dict):
        return [str(v) for v in t.values()]
    if isinstance(t, list):
        return [str(x.get("template", "")) for x in t if isinstance(x, dict)]
    return [str(t)]


def _merge_system(messages: list[dict]) -> list[dict]:
    """llama.cpp's workaround for a template without a system role (common/chat.cpp:1016-1030): the first
    (system) message's content, a newline and the next message's content, in the next message."""
    if not messages or messages[0].get("role") != "system":
        return messages
    if len(messages) == 1:
        return []
    second = dict(messages[1])
    second["content"] = f"{messages[0].get('content', '')}\n{second.get('content', '')}"
    return [second, *messages[2:]]


def hf_render(tok, messages: list[dict], add_generation_prompt: bool, tools: list | None, date_string: str) -> dict:
    """transformers' rendering: {"text"} or {"error"}; ``enable_thinking`` defined true, as llama.cpp always
    defines it (common/chat.cpp:914-949), ``date_string`` pinned."""
    kwargs: dict[str, Any] = {"add_generation_prompt": add_generation_prompt, "tokenize": False,
                              "date_string": date_string, "enable_thinking": True}
    if tools:
        kwargs["tools"] = tools
    try:
        return {"text": tok.apply_chat_template(messages, **kwargs)}
    except Exception as exc:  # a template error of any kind is a rejection
        return {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}


def _variants(text: str, bos_text: str | None, eos_text: str | None) -> dict[tuple[bool, bool], str]:
    """The HF text as llama.cpp would normalise it for each (add_bos, add_eos) of the vocab (chat.cpp:958-964)."""
    out = {}
    for add_bos in (False, True):
        for add_eos in (False, True):
            t = text
            if add_bos and bos_text and t.startswith(bos_text):
                t = t[len(bos_text):]
            if add_eos and eos_text and t.endswith(eos_text):
                t = t[:-len(eos_text)]
            out[(add_bos, add_eos)] = t
    return out


def plan_chat_template(tok, gguf_template: str | None, conversations: dict, residual_fn=None) -> dict:
    """The HF renders and the helper requests of the chat-template check (run before the helper: llama.cpp's
    normalisation depends on the vocab's add_bos/add_eos, so each HF text is tokenized in each variant).
    ``residual_fn``: the HF normalizer members llama.cpp does not apply (causes.Normalizer.residual_fn); each
    variant it changes is tokenized normalized too, so that an id difference it explains gets its cause."""
    t0 = time.monotonic()
    sources = _template_sources(tok)
    plan: dict[str, Any] = {"hf_template": bool(sources), "gguf_template": gguf_template is not None,
                            "items": [], "requests": []}
    if not sources or gguf_template is None:
        plan["seconds"] = time.monotonic() - t0
        return plan
    uses_tools = any("tools" in s for s in sources)
    plan["uses_tools"] = uses_tools
    plan["now_dependent"] = any("strftime_now" in s for s in [*sources, gguf_template])
    date = conversations.get("date_string", "26 Jul 2024")
    bos_text, eos_text = getattr(tok, "bos_token", None), getattr(tok, "eos_token", None)
    for conv in conversations["conversations"]:
        item: dict[str, Any] = {"name": conv["name"], "add_generation_prompt": bool(conv.get("add_generation_prompt"))}
        if conv.get("tools") and not uses_tools:
            item["skipped"] = "the HF template does not use tools"
            plan["items"].append(item)
            continue
        tools = conversations.get("tools") if conv.get("tools") else None
        messages = conv["messages"]
        hf = hf_render(tok, messages, item["add_generation_prompt"], tools, date)
        if "error" in hf and messages and messages[0].get("role") == "system" and "system" in hf["error"].lower():
            merged = hf_render(tok, _merge_system(messages), item["add_generation_prompt"], tools, date)
            if "text" in merged:
                hf, item["hf_normalisation"] = merged, "system message merged into the next (chat.cpp:1016-1030)"
        item["hf"] = hf
        req: dict[str, Any] = {"op": "render", "messages": messages, "add_generation_prompt": item["add_generation_prompt"],
                               "chat_template_kwargs": {"date_string": date}}
        if tools:
            req["tools"] = tools
        item["render_request"] = len(plan["requests"])
        plan["requests"].append(req)
        if "text" in hf:
            hf["ids"] = hf_encode(tok, hf["text"], add_special_tokens=False)  # = apply_chat_template(tokenize=True)
            item["variants"] = {}
            for flags, text in _variants(hf["text"], bos_text, eos_text).items():
                item["variants"][flags] = (text, len(plan["requests"]))
                plan["requests"].append({"op": "tokenize", "text": text, "add_special": True, "parse_special": True})
                normalized = residual_fn(text) if residual_fn else text
                if normalized != text:
                    item.setdefault("normalized", {})[flags] = len(plan["requests"])
                    plan["requests"].append({"op": "tokenize", "text": normalized, "add_special": True,
                                             "parse_special": True})
        plan["items"].append(item)
    plan["seconds"] = time.monotonic() - t0
    return plan


def _text_diff(a: str, b: str) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return (f"first difference at character {i} (HF {len(a)}, llama.cpp {len(b)}): "
            f"HF {a[max(0, i - 20):i + 30]!r} vs llama.cpp {b[max(0, i - 20):i + 30]!r}")


def check_chat_template(recipe_name: str, tok, plan: dict, answers: list[dict], vocab: dict,
                        cause: tuple[str, str, str] | None = None) -> dict:
    """Judge the renders of :func:`plan_chat_template` with the helper's ``answers`` to ``plan["requests"]``.
    ``cause``: (name, status, why) of the normalizer cause (pipeline/stages/conformance/tokenizer.py): input ids
    that differ only by it are judged as the tokenizer check judges that cause."""
    t0 = time.monotonic()
    check = "chat template"
    failures: list[str] = []
    warnings: list[str] = []
    out: dict[str, Any] = {"hf_template": plan["hf_template"], "gguf_template": plan["gguf_template"]}
    if not plan["hf_template"] and not plan["gguf_template"]:
        out.update(passed=True, note="no chat template", conversations=[], failures=[], warnings=[], seconds=0.0)
        return out
    if not plan["gguf_template"]:
        out["note"] = "the GGUF has no chat template"
        failures.append(fail_line(recipe_name, check, "the HF tokenizer has a chat template, the GGUF has no "
                                  "tokenizer.chat_template (llama.cpp would render ChatML): set "
                                  "chat_template_override"))
    if not plan["hf_template"]:
        out["note"] = "not compared: the HF tokenizer has no chat template"
        warnings.append(fail_line(recipe_name, check, "the GGUF has a chat template, the HF tokenizer none: "
                                  "nothing to compare it with"))
    add_bos, add_eos = bool(vocab.get("add_bos")), bool(vocab.get("add_eos"))
    bos, eos = vocab.get("bos"), vocab.get("eos")
    rendered = 0
    results = []
    bos_written: list[str] = []
    bos_text = getattr(tok, "bos_token", None)
    for item in plan["items"]:
        res: dict[str, Any] = {"name": item["name"], "add_generation_prompt": item["add_generation_prompt"]}
        results.append(res)
        if "skipped" in item:
            res["skipped"] = item["skipped"]
            continue
        where = f"conversation {item['name']}"
        hf = item["hf"]
        ll = answers[item["render_request"]]
        res["hf_error"], res["llama_error"] = hf.get("error"), ll.get("error")
        if item.get("hf_normalisation"):
            res["hf_normalisation"] = item["hf_normalisation"]
        if "error" in hf or "error" in ll:
            if "error" in hf and "error" in ll:
                res["verdict"] = "rejected by both"
                continue
            who, msg = ("HF", hf["error"]) if "error" in hf else ("llama.cpp", ll["error"])
            failures.append(fail_line(recipe_name, check, f"{where}: rejected by {who} only ({msg[:160]})"))
            res["verdict"] = f"rejected by {who} only"
            continue
        rendered += 1
        text, idx = item["variants"][(add_bos, add_eos)]
        prompt = clean_piece(ll.get("prompt", ""))
        res.update(hf_text=hf["text"], llama_prompt=prompt, hf_ids=hf["ids"])
        if add_bos and bos is not None and bos_text and hf["text"].startswith(bos_text):
            bos_written.append(item["name"])
        if text != prompt:
            res["verdict"] = "text differs"
            norm = (" (HF's text with llama.cpp's normalisation: its leading BOS / trailing EOS text stripped, "
                    "chat.cpp:958-964)") if text != hf["text"] else ""
            failures.append(fail_line(recipe_name, check, f"{where}: rendered text differs{norm}: "
                                      f"{_text_diff(text, prompt)}"))
            continue
        tk = answers[idx]
        if "error" in tk:
            raise PipelineError(f"{HELPER} could not tokenize the prompt of {where}: {tk['error']}")
        ll_ids, hf_ids = [int(i) for i in tk["ids"]], hf["ids"]
        res["llama_ids"] = ll_ids
        problems = []
        if bos is not None and len(ll_ids) >= 2 and ll_ids[0] == ll_ids[1] == bos:
            both = " (HF's ids too: the template writes it twice)" if hf_ids[:2] == [bos, bos] else ""
            problems.append(f"double BOS at the start of llama.cpp's input ids ({ll_ids[:3]}){both}")
        elif bos is not None and ll_ids[:1] == [bos] and hf_ids[:1] != [bos]:
            problems.append(f"llama.cpp adds BOS {bos} where HF has none (HF starts {hf_ids[:3]})")
        if eos is not None and add_eos and ll_ids[-1:] == [eos] and hf_ids[-1:] != [eos]:
            problems.append(f"llama.cpp adds EOS {eos} where HF has none")
        explained = item.get("normalized", {}).get((add_bos, add_eos))
        if not problems and ll_ids != hf_ids and cause and explained is not None and [
                int(i) for i in answers[explained].get("ids", [])] == hf_ids:
            res["cause"] = cause[0]
            if cause[1] in ("known limitation", "accepted"):
                res["verdict"] = f"identical but for {cause[0]} ({cause[1]})"
                continue
            problems.append(f"input ids differ: cause {cause[0]} ({cause[2]})")
        if not problems and ll_ids != hf_ids:
            at = first_difference(hf_ids, ll_ids)
            pieces = [clean_piece(p) for p in tk.get("pieces") or ["?"] * len(ll_ids)]
            problems.append("input ids differ: " + describe_diff(tok, hf_ids, ll_ids, pieces, at))
        if problems:
            res["verdict"] = "; ".join(problems)
            failures.extend(fail_line(recipe_name, check, f"{where}: {p}") for p in problems)
        else:
            res["verdict"] = "identical"
    if bos_written:
        warnings.append(fail_line(recipe_name, check, f"the template writes the BOS text {bos_text!r} and the GGUF "
                                  f"adds BOS ({len(bos_written)} conversations, {bos_written[0]} first): llama.cpp's "
                                  "chat path strips it (chat.cpp:958-964), a client that renders the template itself "
                                  "and tokenizes the text with specials gets BOS twice"))
    out.update(passed=not failures, conversations=results, rendered=rendered,
               compared=sum(1 for r in results if "skipped" not in r), uses_tools=plan.get("uses_tools"),
               now_dependent=plan.get("now_dependent"), failures=failures, warnings=warnings,
               seconds=round(plan.get("seconds", 0.0) + time.monotonic() - t0, 3))
    return out
