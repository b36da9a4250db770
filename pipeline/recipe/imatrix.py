"""Recipe ``imatrix:`` (llama-imatrix over a calibration text) and its expert-coverage gate for mixture-of-experts
models (``min_expert_coverage``, ``min_expert_tokens``: pipeline/stages/imatrix_coverage.py). (see
pipeline/recipe/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ImatrixConfig:
    """``imatrix:``: llama-imatrix over the calibration text, once per base GGUF."""

    calibration: Path
    ctx: int = 512
    chunks: int = 32
    min_expert_coverage: float | None = None  # None: coverage recorded, not gated
    min_expert_tokens: int = 1
    render: str = "text"  # "chat": ``calibration: {conversations: FILE}``, rendered with the model's chat template
    hub_dataset: str | None = None  # the calibration's Hub dataset id (the card's ``datasets:``)

    def describe(self) -> dict:  # the coverage keys only where set: older recipes keep their keys (and rerun trigger)
        gate = {"min_expert_coverage": self.min_expert_coverage, "min_expert_tokens": self.min_expert_tokens}
        return {"calibration": self.calibration.name, "ctx": self.ctx, "chunks": self.chunks,
                **({} if gate == {"min_expert_coverage": None, "min_expert_tokens": 1} else gate),
                **({"render": self.render} if self.render != "text" else {}),
                **({"hub_dataset": self.hub_dataset} if self.hub_dataset else {})}


def parse_coverage(ctx, d: dict) -> dict:
    """``imatrix.min_expert_coverage`` (a fraction 0..1) and ``imatrix.min_expert_tokens`` (>= 1), one line each."""
    out = {}
    cov = d.get("min_expert_coverage")
    if cov is not None:
        out["min_expert_coverage"] = float(ctx.number(cov, "imatrix.min_expert_coverage", "imatrix"))
    out["min_expert_tokens"] = ctx.number(d.get("min_expert_tokens", 1), "imatrix.min_expert_tokens", "imatrix")
    return out
