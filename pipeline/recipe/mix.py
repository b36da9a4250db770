"""What a measured mix is (``quants[]`` with ``type: mix``) and what it is measured on (``sensitivity:``): docs/mixes.md.
(see pipeline/recipe/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError

# Measured mixes (issue #19 part 2, docs/mixes.md): the candidate ladders when a mix names none, without and with
# an importance matrix (IQ types only with one), and the floor every other tensor sits at while one group is measured.
MIX_CANDIDATES = ("Q3_K", "Q4_K", "Q5_K", "Q6_K")
MIX_CANDIDATES_IMATRIX = ("IQ3_S", "IQ4_XS", "Q5_K", "Q6_K")
MIX_FLOOR = "Q8_0"
MIX_BUDGETS = ("size_of", "bpw", "max_mb")
MIX_TARGETS = ("max_kld_mean",)
FLAVOUR_BASES = ("plain", "awq")  # Quant.base
IMATRIX_SUFFIX = "-imatrix"


@dataclass(frozen=True, order=True)
class Flavour:
    """What a mix is measured on: its base GGUF (``plain``: the published F16, ``awq``: the AWQ-scaled one), with
    or without that base's importance matrix. ``str()`` is its name in wildcards, file names and records
    (``plain``, ``plain-imatrix``, ``awq``, ``awq-imatrix``); the order is the names' order."""

    base: str
    imatrix: bool = False

    def __str__(self) -> str:
        return self.base + (IMATRIX_SUFFIX if self.imatrix else "")

    @classmethod
    def parse(cls, name: str) -> Flavour:
        base = name.removesuffix(IMATRIX_SUFFIX)
        if base not in FLAVOUR_BASES:
            raise PipelineError(f"{name!r} is not a mix flavour (one of {', '.join(map(str, cls.every()))})")
        return cls(base, base != name)

    @classmethod
    def every(cls) -> tuple[Flavour, ...]:
        return tuple(cls(base, imatrix) for base in FLAVOUR_BASES for imatrix in (False, True))


@dataclass(frozen=True)
class Mix:
    """A quant whose per-tensor types are solved from measured sensitivity (``type: mix``): exactly one of
    ``budget`` (``("size_of", "Q4_K_M")``, ``("bpw", 4.0)``, ``("max_mb", 90.0)``: the best quality within it) or
    ``target`` (``("max_kld_mean", 0.03)``: the smallest file that meets it)."""

    candidates: tuple[str, ...]
    budget: tuple[str, Any] | None = None
    target: tuple[str, float] | None = None

    def describe(self) -> dict:
        goal = {"budget": {self.budget[0]: self.budget[1]}} if self.budget else {"target": {self.target[0]: self.target[1]}}
        return {**goal, "candidates": list(self.candidates)}


@dataclass(frozen=True)
class Sensitivity:
    """``sensitivity:``: the text and layout of the per-group measurements every mix of the recipe is solved from."""

    text: Path
    text_sha256: str
    ctx: int = 512
    chunks: int = 4
    bands: int = 8
    floor: str = MIX_FLOOR
    search: str = "exhaustive"

    def describe(self) -> dict:
        return {"text": self.text.name, "text_sha256": self.text_sha256, "ctx": self.ctx, "chunks": self.chunks,
                "bands": self.bands, "floor": self.floor, "search": self.search}
