"""Draft <-> main vocabulary compatibility, from GGUF metadata.

:func:`check_pair` implements llama.cpp's own rule (``common_speculative_are_compatible`` in
common/speculative.cpp of the pinned build): same vocab type; same add-BOS flag and, when set, same
BOS id; same add-EOS flag and, when set, same EOS id; vocab sizes differ by at most 128; token texts
equal for every id from 5 to the smaller size. The flags and ids are read as llama.cpp reads them,
defaults included (:mod:`pipeline.gguf.vocab_defaults`). Beyond llama.cpp it warns about a different
pre-tokenizer, merges, token types, special tokens (EOT, PAD) or chat template.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.gguf.vocab_defaults import effective_vocab, tokenizer_metadata

MAX_SIZE_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE
CHECK_START_TOKEN_ID = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID
MAX_DIFF_SHOWN = 5


def _vocab_facts(path: Path) -> dict:
    try:
        facts = effective_vocab(path)
        meta = tokenizer_metadata(path)
    except ValueError as exc:  # what llama.cpp refuses to load
        raise PipelineError(f"{path}: llama.cpp cannot load this vocabulary: {exc}") from None
    except OSError as exc:
        raise PipelineError(f"{path}: cannot read: {exc}") from None
    # llama.cpp compares token texts as C strings (strcmp): a text ends at its first NUL byte
    facts["tokens"] = [t.split(b"\0", 1)[0] for t in meta.get("tokenizer.ggml.tokens") or []]
    facts["token_types"] = meta.get("tokenizer.ggml.token_type")
    facts["merges"] = meta.get("tokenizer.ggml.merges")
    facts["chat_template"] = meta.get("tokenizer.chat_template")
    facts["eot_id"] = meta.get("tokenizer.ggml.eot_token_id")
    facts["pad_id"] = meta.get("tokenizer.ggml.padding_token_id")
    return facts


def _text(token: bytes) -> str:
    return token.decode("utf-8", "backslashreplace")


def check_pair(main: str | Path, draft: str | Path) -> dict:
    """Compare two GGUFs' vocabularies. Returns ``{"compatible", "rule", "reason", "diff", "warnings",
    "main", "draft"}``; ``rule`` names the first llama.cpp rule that failed (None when compatible)."""
    m, d = _vocab_facts(Path(main)), _vocab_facts(Path(draft))
    out = {"compatible": True, "rule": None, "reason": None, "diff": [], "warnings": [],
           "main": _summary(m), "draft": _summary(d)}

    def fail(rule: str, reason: str, diff=None):
        out.update(compatible=False, rule=rule, reason=reason, diff=diff or [])
        return out

    if m["vocab_type"] != d["vocab_type"]:
        return fail("vocab_type", f"vocab type differs: main {m['vocab_type']}, draft {d['vocab_type']}")
    if m["add_bos"] != d["add_bos"] or (m["add_bos"] and m["bos_id"] != d["bos_id"]):
        return fail("bos", f"BOS differs: add_bos main {m['add_bos']} / draft {d['add_bos']}, "
                           f"id main {m['bos_id']} / draft {d['bos_id']}")
    if m["add_eos"] != d["add_eos"] or (m["add_eos"] and m["eos_id"] != d["eos_id"]):
        return fail("eos", f"EOS differs: add_eos main {m['add_eos']} / draft {d['add_eos']}, "
                           f"id main {m['eos_id']} / draft {d['eos_id']}")
    n_m, n_d = m["n_tokens"], d["n_tokens"]
    if abs(n_m - n_d) > MAX_SIZE_DIFFERENCE:
        return fail("vocab_size", f"vocab sizes differ by {abs(n_m - n_d)} (main {n_m}, draft {n_d}); "
                                  f"llama.cpp allows {MAX_SIZE_DIFFERENCE}")
    diffs = [i for i in range(CHECK_START_TOKEN_ID, min(n_m, n_d)) if m["tokens"][i] != d["tokens"][i]]
    if diffs:
        shown = [{"id": i, "main": _text(m["tokens"][i]), "draft": _text(d["tokens"][i])} for i in diffs[:MAX_DIFF_SHOWN]]
        return fail("token_text", f"{len(diffs)} of {min(n_m, n_d) - CHECK_START_TOKEN_ID} token texts differ from "
                                  f"id {CHECK_START_TOKEN_ID} on (first at id {diffs[0]}: main {shown[0]['main']!r}, "
                                  f"draft {shown[0]['draft']!r})", shown)

    # Beyond llama.cpp: differences that do not stop speculation but usually mean a wrong pairing.
    w = out["warnings"]
    if m["pre"] != d["pre"]:
        w.append(f"pre-tokenizer differs: main {m['pre']!r}, draft {d['pre']!r}")
    if m["merges"] != d["merges"]:
        w.append("BPE merges differ")
    n = min(n_m, n_d)
    if (m["token_types"] or b"")[:4 * n] != (d["token_types"] or b"")[:4 * n]:  # int32 per token
        w.append("token types differ")
    for key, label in (("eot_id", "EOT"), ("pad_id", "PAD"), ("eos_id", "EOS"), ("bos_id", "BOS")):
        if m[key] != d[key]:
            w.append(f"{label} token id differs: main {m[key]}, draft {d[key]}")
    if m["chat_template"] != d["chat_template"]:
        w.append("chat template differs")
    if n_m != n_d:
        w.append(f"vocab sizes differ by {abs(n_m - n_d)} (allowed up to {MAX_SIZE_DIFFERENCE})")
    return out


def _summary(f: dict) -> dict:
    return {k: f[k] for k in ("model", "pre", "vocab_type", "n_tokens", "add_bos", "bos_id", "add_eos", "eos_id")}


def describe_failure(result: dict, main_name: str, draft_name: str) -> str:
    text = f"draft {draft_name} is incompatible with {main_name} (llama.cpp rule {result['rule']}): {result['reason']}"
    if result["diff"]:
        text += "; first differing ids: " + ", ".join(
            f"{d['id']}: {d['main']!r} vs {d['draft']!r}" for d in result["diff"])
    return text
