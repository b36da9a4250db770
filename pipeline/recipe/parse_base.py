"""The recipe parser's helpers: one-line errors naming file and field (``_Ctx``), and the checks several sections
share (quant types, thresholds, splits, text files). (see pipeline/recipe/__init__.py)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from pipeline.errors import RecipeError
from pipeline.fsutil import sha256_file
from pipeline.recipe.model import (
    NOT_QUANTS,
    QUANT_ALIASES,
    SPLIT_KEYS,
    SPLIT_SIZE_RE,
    THRESHOLDS,
    Split,
)
from pipeline.recipe.quant_types import gguf_file_types
from pipeline.recipe.schema import number_range


class _Ctx:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, msg: str):
        raise RecipeError(self.path, where, msg)

    def mapping(self, value, where: str, allowed: set[str]) -> dict:
        if not isinstance(value, dict):
            self.fail(where, f"must be a mapping, got {type(value).__name__}")
        for k in value:
            if not isinstance(k, str) or k not in allowed:
                self.fail(f"{where}.{k}" if where else str(k),
                          f"unknown key (allowed: {', '.join(sorted(allowed))})")
        return value

    def string(self, value, where: str, pattern: re.Pattern | None = None, what: str = "") -> str:
        if not isinstance(value, str) or not value.strip():
            self.fail(where, f"must be a non-empty string, got {value!r}")
        if pattern and not pattern.fullmatch(value):  # not match: `$` also matches before a final newline
            self.fail(where, f"{value!r} is not {what or 'valid'}")
        return value

    def choice(self, value, where: str, allowed: tuple[str, ...]) -> str:
        if value not in allowed:
            self.fail(where, f"{value!r} is not one of {', '.join(allowed)}")
        return value

    def number(self, value, where: str, section: str, key: str | None = None, sub: str | None = None):
        """``value`` when inside the range the schema declares for ``key`` of ``section`` (by default the last key of
        ``where``; ``sub``: the key inside a map of numbers such as ``budget``), else one line naming the field. NaN,
        infinities, booleans and the wrong kind of number are out of every range."""
        rng = number_range(section, key or where.rsplit(".", 1)[-1].split("[", 1)[0])
        msg = (rng[sub] if sub is not None else rng).problem(value)
        if msg is not None:
            self.fail(where, msg)
        return value

    def boolean(self, value, where: str) -> bool:
        if not isinstance(value, bool):
            self.fail(where, f"must be true or false, got {value!r}")
        return value


def _thresholds(ctx: _Ctx, d: dict, where: str) -> tuple[tuple[str, float], ...]:
    return tuple((name, float(ctx.number(d[name], f"{where}.{name}", "gates[]", name)))
                 for name in THRESHOLDS if name in d)


def _parse_quant_gates(ctx: _Ctx, value, where: str, set_names: set[str]):
    if not isinstance(value, dict) or not value:
        ctx.fail(where, "must be a mapping of thresholds, or of eval set name -> thresholds")
    if not set_names:
        ctx.fail(where, "per-quant gates need a top-level `gates:` section")
    if all(k in THRESHOLDS for k in value):
        return (("*", _thresholds(ctx, value, where)),)
    out = []
    for k, v in value.items():
        if k in THRESHOLDS:
            ctx.fail(f"{where}.{k}", "do not mix thresholds with per-eval-set entries")
        if k not in set_names:
            ctx.fail(f"{where}.{k}", f"unknown key (thresholds: {', '.join(THRESHOLDS)}; eval sets: "
                                     f"{', '.join(sorted(set_names))})")
        d = ctx.mapping(v, f"{where}.{k}", set(THRESHOLDS))
        out.append((k, _thresholds(ctx, d, f"{where}.{k}")))
    return tuple(out)


def _check_quant_type(ctx: _Ctx, value: str, where: str, known: set[str] | None, build: int | None) -> str:
    t = value.strip().upper()
    t = QUANT_ALIASES.get(t, t)
    if t in NOT_QUANTS:
        ctx.fail(where, f"{t} is not a quantization (the {t.lower()} file comes from `outtype`)")
    if known is not None and t not in known:
        ctx.fail(where, f"unknown quant type {value!r} (llama-quantize b{build} accepts: {', '.join(sorted(known - NOT_QUANTS))})")
    if t not in gguf_file_types():
        ctx.fail(where, f"quant type {t} is unknown to the installed gguf Python package, which could not read the "
                        "result back; install the gguf-py of the pinned llama.cpp (`make tools`)")
    return t


def _parse_split(ctx: _Ctx, value, where: str, allow_false: bool = False) -> Split | None:
    """``split: {max_size: 2G}`` (or, for one quant, ``split: false``: published whole)."""
    if value is False and allow_false:
        return None
    if not isinstance(value, dict):
        ctx.fail(where, "must be a mapping {max_size: N(M|G)}" + (" or false" if allow_false else "")
                 + f", got {value!r}")
    d = ctx.mapping(value, where, SPLIT_KEYS)
    if "max_size" not in d:
        ctx.fail(f"{where}.max_size", "missing (the most tensor data per shard, e.g. 2G or 500M)")
    size = d["max_size"]
    if isinstance(size, bool) or not isinstance(size, str) or not SPLIT_SIZE_RE.match(size.strip()):
        ctx.fail(f"{where}.max_size", f"{size!r} is not a size llama-gguf-split takes: a whole number > 0 followed "
                                      "by M (10^6 bytes) or G (10^9 bytes), e.g. 500M or 2G")
    return Split(max_size=size.strip(), where=where)


def _text_path(ctx: _Ctx, value, where: str, what: str) -> Path:
    p = Path(ctx.string(value, where)).expanduser()
    if not p.is_absolute():
        p = (ctx.path.parent / p).resolve()
    if not p.is_file():
        ctx.fail(where, f"{what} {p} does not exist")
    size = p.stat().st_size
    if not size or (size < (1 << 20) and not p.read_bytes().strip()):
        ctx.fail(where, f"{what} {p} is empty")
    return p


def _fits_text(ctx: _Ctx, path: Path, tokens: int, where: str, what: str) -> None:
    """Refuse a count of tokens that a plain text of its size cannot hold: llama.cpp's tokenizers give every token at
    least one byte of the text (byte fallback at worst), plus a BOS and a SentencePiece prefix space. The stage
    that tokenizes checks the exact count; this bound catches a runaway ``chunks`` before any job runs."""
    size = path.stat().st_size
    if tokens > size + 2:
        ctx.fail(where, f"{what} needs {tokens} tokens, and {path.name} ({size} bytes) holds at most {size + 2} (every "
                        "token is at least one byte of the text): use a longer text, a smaller ctx or fewer chunks")


@functools.lru_cache(maxsize=64)
def _file_sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(path)  # cached per (path, size, mtime): recipes share calibration and eval texts


def _file_sha256(path: Path) -> str:
    st = path.stat()
    return _file_sha256_cached(str(path), st.st_size, st.st_mtime_ns)
