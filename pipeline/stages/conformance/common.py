"""Shared by the checks: thresholds and constants, the one-line failure format, the probes and conversations, the helper call, id-sequence diffs. (see pipeline/stages/conformance/__init__.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.stages.eval_sets import RENDER_HELPER
from pipeline.tools import Toolchain
from pipeline.tools import run_helper as _run

ROOT = Path(__file__).resolve().parents[3]  # pipeline/stages/conformance/common.py -> the project
DATA = ROOT / "data" / "conformance"
PROBES_FILE = DATA / "probes.txt"
CONVERSATIONS_FILE = DATA / "conversations.json"
HELPER = RENDER_HELPER  # ggufpipe-conformance, which the chat-rendered eval sets call too

# Fixed before measuring (issue #15): an F16/BF16 GGUF against the HF model in float32.
THRESHOLDS = {"min_top1": 0.99, "max_kld_mean": 1e-3, "max_kld_p99": 1e-2, "max_abs_ln_ppl_ratio": 0.005}
DEFAULT_CHUNKS = 4
EVAL_SLICE_CHARS = 2000
GIB = 1 << 30
MAX_LINES_PER_KIND = 5  # failure lines of one kind (a tokenizer mode...); the record keeps them all
MAX_FULL_DIFFS = 50  # tokenizer mismatches whose full id sequences go into the record
TURN_END_MARK = "Conformance-turn-end-probe-7Q"  # the assistant content rendered to find the turn-end token

_MARKER_PREFIX, _MARKER_SUFFIX = "=== probe: ", " ==="


def fail_line(recipe: str, check: str, detail: str) -> str:
    return " ".join(f"conformance: recipe {recipe}: {check}: {detail}".split("\n"))


# --------------------------------------------------------------------------- probes and conversations


def load_probes(path: str | os.PathLike = PROBES_FILE) -> list[tuple[str, str]]:
    """(name, text) of every probe: ``=== probe: NAME ===`` marker lines, a ``json`` suffix for a body that is one
    JSON string literal; the newline before a marker is the marker's."""
    with open(path, encoding="utf-8", newline="") as fh:  # exact text: no newline translation
        text = fh.read()
    out: list[tuple[str, str]] = []
    name, is_json, body = None, False, []

    def close():
        if name is None:
            return
        raw = "\n".join(body)
        if is_json:
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise PipelineError(f"{path}: probe {name}: not a JSON string literal: {exc}") from None
            if not isinstance(value, str):
                raise PipelineError(f"{path}: probe {name}: the json body is not a string")
            raw = value
        if not raw:
            raise PipelineError(f"{path}: probe {name} is empty")
        out.append((name, raw))

    for line in text.split("\n"):
        if line.startswith(_MARKER_PREFIX) and line.endswith(_MARKER_SUFFIX):
            close()
            label = line[len(_MARKER_PREFIX):-len(_MARKER_SUFFIX)].strip()
            is_json = label.endswith(" json")
            name = label[:-len(" json")].strip() if is_json else label
            if any(n == name for n, _ in out):
                raise PipelineError(f"{path}: probe {name} is defined twice")
            body = []
        elif name is not None:
            body.append(line)
    if name is not None:
        if body and body[-1] == "":  # the file's final newline
            body.pop()
        close()
    if not out:
        raise PipelineError(f"{path}: no probe (marker lines `{_MARKER_PREFIX}NAME{_MARKER_SUFFIX}`)")
    return out


def added_token_probes(tok) -> list[tuple[str, str]]:
    """One probe per added/special token of the HF tokenizer (its text alone), and all of them in running
    text (each between words, to see lstrip/rstrip and the text around specials)."""
    added = sorted((int(i), t.content) for i, t in tok.added_tokens_decoder.items())
    for t in getattr(tok, "all_special_tokens", []):
        i = tok.convert_tokens_to_ids(t)
        if isinstance(i, int) and all(t != c for _, c in added):
            added.append((i, t))
    probes = [(f"added-token {i} {content!r}", content) for i, content in added if content]
    if probes:
        probes.append(("added-tokens-in-text", "".join(f"word{n} {c} x{c}y\n" for n, (_, c) in enumerate(added))))
    return probes


def eval_slice_probe(text_path: str | os.PathLike | None) -> list[tuple[str, str]]:
    if text_path is None or not Path(text_path).is_file():
        return []
    with open(text_path, encoding="utf-8", errors="replace") as fh:
        return [(f"eval-text {Path(text_path).name}[:{EVAL_SLICE_CHARS}]", fh.read(EVAL_SLICE_CHARS))]


def load_conversations(path: str | os.PathLike = CONVERSATIONS_FILE) -> dict:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    for c in data["conversations"]:
        if not c.get("name") or not isinstance(c.get("messages"), list):
            raise PipelineError(f"{path}: every conversation needs a name and a list of messages")
    return data


# --------------------------------------------------------------------------- the llama.cpp side


def run_helper(tc: Toolchain, gguf: str | os.PathLike, requests: list[dict], log: Path | None = None) -> list[dict]:
    """Every request in one ``ggufpipe-conformance GGUF < requests.json`` run (pipeline/tools.py); its answers."""
    return _run(tc, HELPER, gguf, requests, log)


# --------------------------------------------------------------------------- 1. tokenizer parity

MODES = {
    "a": {"label": "no specials added, special text parsed",
          "hf": {"add_special_tokens": False}, "llama": {"add_special": False, "parse_special": True}},
    "b": {"label": "each side's defaults",
          "hf": {"add_special_tokens": True}, "llama": {"add_special": True, "parse_special": True}},
    "c": {"label": "special text not parsed",
          "hf": {"add_special_tokens": False, "split_special_tokens": True},
          "llama": {"add_special": False, "parse_special": False}},
}


def tokenizer_requests(probes: list[tuple[str, str]]) -> list[dict]:
    return [{"op": "tokenize", "text": text, **MODES[m]["llama"]} for m in MODES for _, text in probes]


def hf_encode(tok, text: str, **kwargs) -> list[int]:
    return list(tok(text, **kwargs)["input_ids"])


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _hf_piece(tok, i: int) -> str:
    try:
        return tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    except Exception:  # an id outside the HF vocabulary
        return "?"


def clean_piece(piece: str) -> str:
    """A helper piece as readable text: the bytes of a piece that ends inside a UTF-8 character come as lone
    surrogates (U+DC80 + the byte, pipeline/native/conformance.cpp); they are written as backslash-x escapes."""
    return piece.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _window(ids: list[int], pieces: list[str], at: int, before: int = 2, after: int = 3) -> str:
    lo, hi = max(0, at - before), min(len(ids), at + after)
    items = [f"{ids[k]} {pieces[k]!r}" for k in range(lo, hi)]
    return "[" + ("... " if lo else "") + ", ".join(items) + (" ..." if hi < len(ids) else "") + "]"


def describe_diff(tok, hf_ids: list[int], llama_ids: list[int], llama_pieces: list[str], at: int) -> str:
    hf_pieces = [_hf_piece(tok, i) if abs(k - at) <= 3 else "" for k, i in enumerate(hf_ids)]
    return (f"first difference at token {at} (HF {len(hf_ids)} tokens, llama.cpp {len(llama_ids)}): "
            f"HF {_window(hf_ids, hf_pieces, at)} vs llama.cpp {_window(llama_ids, llama_pieces, at)}")
