"""Check 4, end of generation. (see pipeline/stages/conformance/__init__.py)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from pipeline.stages.conformance.common import TURN_END_MARK, _hf_piece, fail_line
from pipeline.stages.conformance.template import hf_render

# --------------------------------------------------------------------------- 4. end of generation


def hf_eos_ids(hf_dir: str | os.PathLike) -> tuple[list[int], str]:
    """HF's ``eos_token_id`` as a list, and where it came from (generation_config.json, else config.json)."""
    hf_dir = Path(hf_dir)
    for name in ("generation_config.json", "config.json"):
        p = hf_dir / name
        if not p.is_file():
            continue
        data = json.loads(p.read_text(encoding="utf-8"))
        v = data.get("eos_token_id")
        if v is None and name == "config.json":
            v = (data.get("text_config") or {}).get("eos_token_id")
        if v is None and name == "generation_config.json":
            continue
        ids = [v] if isinstance(v, int) else list(v or [])
        return [int(i) for i in ids], name
    return [], "none"


def turn_end_token(tok, date_string: str) -> dict:
    """The special token the template writes right after an assistant message's content (rendering
    [user, assistant TURN_END_MARK]): {"text", "id"}, or {"note"} when there is none."""
    hf = hf_render(tok, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": TURN_END_MARK}],
                   False, None, date_string)
    if "error" in hf:
        return {"note": f"the template rejects [user, assistant]: {hf['error'][:160]}"}
    text = hf["text"]
    at = text.rfind(TURN_END_MARK)
    if at < 0:
        return {"note": "the template does not write the assistant's content"}
    after = text[at + len(TURN_END_MARK):]
    rest = after.lstrip(" \n")
    specials = {t.content for t in tok.added_tokens_decoder.values() if t.special}
    specials |= set(getattr(tok, "all_special_tokens", []))
    hit = max((s for s in specials if s and rest.startswith(s)), key=len, default=None)
    if hit is None:  # a marker that is an ordinary token of the vocabulary (<end_of_turn>, [/INST]...)
        m = re.match(r"<\|[^|\s]{1,40}\|>|<[^<>\s]{1,40}>|\[/?[A-Z_]{1,40}\]", rest)
        if m and m.group(0) in tok.get_vocab():
            hit = m.group(0)
    if hit is None:
        return {"note": f"no special token after the assistant content (then {after[:40]!r})"}
    return {"text": hit, "id": int(tok.convert_tokens_to_ids(hit))}


def check_eog(recipe_name: str, tok, hf_dir: str | os.PathLike, vocab: dict, turn_end: dict | None) -> dict:
    t0 = time.monotonic()
    check = "end of generation"
    eog = [int(i) for i in vocab.get("eog", [])]
    eog_set = set(eog)
    failures, warnings = [], []
    eos_ids, source = hf_eos_ids(hf_dir)

    def label(i: int) -> str:
        return f"{i} {_hf_piece(tok, i)!r}"

    eog_text = ", ".join(label(i) for i in eog[:8]) + (", ..." if len(eog) > 8 else "")
    for i in eos_ids:
        if i not in eog_set:
            failures.append(fail_line(recipe_name, check, f"HF {source} eos_token_id {label(i)} is not an "
                                      f"end-of-generation token of the GGUF (EOG: {eog_text}): llama.cpp would not "
                                      "stop on it; set eos_token_ids"))
    out: dict[str, Any] = {"eog": eog, "hf_eos_ids": eos_ids, "hf_eos_source": source, "gguf_eos": vocab.get("eos"),
                           "gguf_eot": vocab.get("eot")}
    if turn_end is not None:
        out["turn_end"] = turn_end
        if "id" in turn_end and turn_end["id"] not in eog_set:
            failures.append(fail_line(recipe_name, check, f"the template ends an assistant turn with "
                                      f"{turn_end['text']!r} (id {turn_end['id']}), not an end-of-generation token "
                                      f"of the GGUF (EOG: {eog_text})"))
        elif "note" in turn_end:
            warnings.append(fail_line(recipe_name, check, f"turn-end token not found: {turn_end['note']}"))
    gguf_eos = vocab.get("eos")
    if gguf_eos is not None and gguf_eos >= 0 and eos_ids and gguf_eos not in eos_ids:
        warnings.append(fail_line(recipe_name, check, f"the GGUF's EOS {label(gguf_eos)} is not among HF's "
                                  f"eos_token_id {eos_ids} ({source}): llama.cpp stops on a token HF never stops on"))
    out.update(passed=not failures, failures=failures, warnings=warnings, seconds=round(time.monotonic() - t0, 3))
    return out
