"""Quant type names: llama-quantize's list, gguf-py's, the recipe's references to a file key. (see pipeline/recipe/__init__.py)."""

from __future__ import annotations

import functools
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.recipe import naming
from pipeline.recipe.model import QUANT_ALIASES
from pipeline.tools import read_build_version


@functools.lru_cache(maxsize=4)
def known_quant_types(quantize_exe: str) -> tuple[frozenset[str], int]:
    """Quant type names accepted by this llama-quantize (parsed from its usage text)."""
    out = subprocess.run([quantize_exe, "--help"], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    types = set(re.findall(r"^\s+\d+\s+or\s+([A-Z0-9_]+)\s*:", text, flags=re.M))
    types |= set(re.findall(r"^\s+([A-Z][A-Z0-9_]+)\s+:", text, flags=re.M))
    if not types:
        raise PipelineError(f"could not read the quant types from `{quantize_exe} --help`")

    build = read_build_version(Path(quantize_exe).parent / "llama-perplexity")[0]
    return frozenset(types), build


@functools.lru_cache(maxsize=1)
def gguf_file_types() -> frozenset[str]:
    """Quant types that the importable ``gguf`` package can name (LlamaFileType.MOSTLY_*).

    Read from the source of its ``constants`` module (the ``MOSTLY_*`` members of ``class LlamaFileType``)
    unless ``gguf`` is already imported: the package itself imports numpy and more (0.7 s), and even
    executing ``constants.py`` alone (its many enums) took 35 ms, paid by every Snakemake start and every
    stage for loading a recipe. tests/unit/test_tools.py checks the text reading against the enum."""
    mod = sys.modules.get("gguf")
    if mod is not None:
        return frozenset(m.name[len("MOSTLY_"):] for m in mod.LlamaFileType if m.name.startswith("MOSTLY_"))
    spec = importlib.util.find_spec("gguf")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    return file_types_in_source((Path(next(iter(spec.submodule_search_locations))) / "constants.py").read_text(
        encoding="utf-8"))


def file_types_in_source(text: str) -> frozenset[str]:
    """The ``MOSTLY_*`` member names (less the prefix) of ``class LlamaFileType`` in gguf-py's constants.py."""
    body = re.search(r"^class LlamaFileType\b.*?:\n(.*?)(?=^\S)", text, re.M | re.S)
    return frozenset(re.findall(r"^[ \t]+MOSTLY_(\w+)[ \t]*=", body.group(1), re.M)) if body else frozenset()


def key_ref(text: str) -> str:
    """A file key as a recipe or a command line writes it: ``Q4_K_M``, ``q4_k``(alias), ``Q4_K_M_IMAT``, or the
    pre-#16 ``Q4_K_M-imat`` (renamed: CHANGELOG.md); ``gguf`` (a given draft GGUF) and ``mtp`` (the MTP heads as the
    draft, recipe ``draft: {mtp: true}``) as is."""
    if text in ("gguf", "mtp"):
        return text
    if "-" in text and not text.startswith(naming.MTP_MARK):
        t, v = text.split("-", 1)
        return naming.quant_label(QUANT_ALIASES.get(t.upper(), t.upper()), v)
    if text.lower().startswith(naming.MTP_MARK):
        rest = text[len(naming.MTP_MARK):].upper()
        return naming.mtp_key(rest[: -len(naming.MTP_SUFFIX)] if rest.endswith(naming.MTP_SUFFIX) else rest)
    return QUANT_ALIASES.get(text.upper(), text.upper())
