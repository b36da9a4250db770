"""Why a tokenizer probe differs. Each cause is a rule that reproduces llama.cpp's ids or HF's exactly:

- a normalizer cause (``nfc``, ``nfkc``, ``nfd+strip-accents``...): llama.cpp's ids of ``residual(probe)`` are HF's
  ids of the probe, ``residual`` being the HF normalizer without the members llama.cpp's tokenizer type applies;
- ``ignore-merges``: HF's BPE with ``ignore_merges`` turned off gives llama.cpp's ids (the GGUF's pre-tokenizer type
  does not look whole words up first);
- ``control-typed``: special text not parsed, HF's ids hold an added token HF keeps plain (``special: false``) that
  the GGUF types CONTROL: the converter types ``<|...|>`` tokens so (conversion/base.py:1557-1572 of b11312) and
  llama.cpp matches CONTROL tokens only with special parsing on (src/llama-vocab.cpp:3261).

A mismatch no rule reproduces is ``unexplained``. (see pipeline/stages/conformance/__init__.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from pipeline.recipe.model import CONFORMANCE_LIMITATIONS, NORMALIZER_CAUSES

UNEXPLAINED = "unexplained"
BOS_EOS = "bos-eos"
IGNORE_MERGES = "ignore-merges"
CONTROL_TYPED = "control-typed"
CONTROL = 3  # LLAMA_TOKEN_TYPE_CONTROL in tokenizer.ggml.token_type (include/llama.h:96)

# GGUF tokenizer.ggml.model -> llama.cpp's tokenizer type (src/llama-vocab.cpp:1949-2151 of b11312, load())
VOCAB_TYPES = {"llama": "spm", "gpt2": "bpe", "hybriddna": "bpe", "whitespace": "bpe", "gemma4": "bpe",
               "bert": "wpm", "t5": "ugm", "rwkv": "rwkv", "plamo2": "plamo2", "test": "test", "no_vocab": "none",
               "none": "none"}

# The normalizer members each llama.cpp tokenizer type applies itself (src/llama-vocab.cpp of b11312):
# spm a space prefix and spaces as U+2581 (3452-3462); bpe only the optional U+2581 escape (3505-3508) and no
# Unicode normal form at all; wpm NFD, lowercase and accent stripping (834-860, 2661-2663; NFD is the only form
# src/unicode.h implements); ugm its precompiled charsmap (904-922, 1078-1120). Which ones llama.cpp really
# applied is proven per probe by the ids, not assumed from this table.
_SPACE = ("Replace", " ", "\u2581")
IMPLEMENTED: dict[str, set] = {
    "spm": {("Prepend", "\u2581"), _SPACE},
    "bpe": {_SPACE},
    "wpm": {"NFD", "Lowercase", "StripAccents", "BertNormalizer"},
    "ugm": {"Precompiled"},
}


def _key(member: dict):
    t = member.get("type")
    if t == "Replace":
        return (t, (member.get("pattern") or {}).get("String"), member.get("content"))
    if t == "Prepend":
        return (t, member.get("prepend"))
    return t


def _flatten(spec: dict | None) -> list[dict]:
    if not spec:
        return []
    if spec.get("type") == "Sequence":
        return [m for s in spec.get("normalizers", []) for m in _flatten(s)]
    return [spec]


def _describe(member: dict) -> str:
    t = member.get("type", "?")
    if t == "Replace":
        pat = member.get("pattern") or {}
        return f"Replace({pat.get('String', pat.get('Regex'))!r}->{member.get('content')!r})"
    if t == "Prepend":
        return f"Prepend({member.get('prepend')!r})"
    return t


def cause_name(members: list[dict]) -> str:
    """``nfc``, ``nfkc``, ``nfd+strip-accents``...: the sorted kinds of the members, joined by ``+``."""
    kinds = {NORMALIZER_CAUSES.get(m.get("type", ""), str(m.get("type", "?")).lower()) for m in members}
    return "+".join(sorted(kinds))


def _normalize_fn(members: list[dict]) -> Callable[[str], str]:
    """HF's own implementation of ``members`` (tokenizers' normalizers, through a one-token tokenizer)."""
    # tokenizers: only the conformance run needs it
    from tokenizers import Tokenizer

    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": {"type": "Sequence", "normalizers": members}, "pre_tokenizer": None,
            "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}}
    return Tokenizer.from_str(json.dumps(spec)).normalizer.normalize_str


@dataclass
class Normalizer:
    """The HF tokenizer's normalizer against llama.cpp's tokenizer type."""

    source: str  # the file it was read from (tokenizer.json), or why there is none
    vocab_type: str
    members: list[dict]
    residual: list[dict]  # the members llama.cpp's type does not apply

    @property
    def cause(self) -> str | None:
        return cause_name(self.residual) if self.residual else None

    def describe(self) -> str | None:
        if not self.members:
            return None
        return " + ".join(_describe(m) for m in self.members)

    @cached_property
    def residual_fn(self) -> Callable[[str], str] | None:
        """HF's own normalization by the residual members (built once)."""
        return _normalize_fn(self.residual) if self.residual else None

    def why(self) -> str:
        """Why a mismatch of this cause exists, naming the tokenizer file and llama.cpp's tokenizer type."""
        return (f"the HF normalizer {' + '.join(_describe(m) for m in self.residual)} of {self.source}, which "
                f"llama.cpp's {self.vocab_type.upper()} tokenizer does not apply")

    def record(self) -> dict:
        return {"source": self.source, "vocab_type": self.vocab_type, "describe": self.describe(),
                "residual": [_describe(m) for m in self.residual], "cause": self.cause}


def backend_spec(tok) -> dict | None:
    """A fast HF tokenizer's whole definition (tokenizer.json as loaded); None for a slow one."""
    backend = getattr(tok, "backend_tokenizer", None)
    return json.loads(backend.to_str()) if backend is not None else None


def read_normalizer(tok, spec: dict | None, hf_dir: Path, gguf_tokenizer_model: str | None) -> Normalizer:
    """The loaded HF tokenizer's normalizer from its :func:`backend_spec` (a slow tokenizer has none to read,
    so every mismatch stays unexplained)."""
    vocab_type = VOCAB_TYPES.get(str(gguf_tokenizer_model), str(gguf_tokenizer_model))
    if spec is None:
        return Normalizer(f"{type(tok).__name__} (slow: no normalizer to read)", vocab_type, [], [])
    members = _flatten(spec.get("normalizer"))
    done = IMPLEMENTED.get(vocab_type, set())
    residual = [m for m in members if _key(m) not in done and m.get("type") not in done]
    name = "tokenizer.json" if (Path(hf_dir) / "tokenizer.json").is_file() else "the tokenizer files"
    return Normalizer(f"{name} ({type(tok).__name__})", vocab_type, members, residual)


def text_share(fn: Callable[[str], str], path: Path) -> dict:
    """The share of a text's characters (in whitespace-separated words) that ``fn`` changes."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    total = changed = words = 0
    memo: dict[str, bool] = {}
    for w in text.split():
        total += len(w)
        if w not in memo:
            memo[w] = fn(w) != w
        if memo[w]:
            changed += len(w)
            words += 1
    return {"text": Path(path).name, "chars": total, "changed_chars": changed, "changed_words": words,
            "share": round(changed / total, 6) if total else 0.0}


def is_limitation(cause: str) -> bool:
    return cause in CONFORMANCE_LIMITATIONS


def merging_variant(spec: dict | None):
    """The tokenizer of :func:`backend_spec` with BPE ``ignore_merges`` off, or None where it is not on."""
    model = (spec or {}).get("model") or {}
    if model.get("type") != "BPE" or not model.get("ignore_merges"):
        return None
    # tokenizers: only the conformance run needs it
    from tokenizers import Tokenizer

    return Tokenizer.from_str(json.dumps({**spec, "model": {**model, "ignore_merges": False}}))


def encode_variant(alt, text: str, mode: str) -> list[int]:
    """``alt`` as HF's call of mode ``mode`` encodes (pipeline/stages/conformance/common.py ``MODES``)."""
    alt.encode_special_tokens = mode == "c"
    return list(alt.encode(text, add_special_tokens=mode == "b").ids)


def control_typed(tok, token_types: list[int] | None) -> set[int]:
    """Added tokens HF keeps plain that the GGUF types CONTROL."""
    types = token_types or []
    return {int(i) for i, t in tok.added_tokens_decoder.items()
            if not t.special and int(i) < len(types) and types[int(i)] == CONTROL}
