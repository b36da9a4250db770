"""One ``gates:`` entry of a recipe: an eval set (its text, context, chunks, thresholds, KV types, rendering and long
context). (see pipeline/recipe/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EvalSet:
    name: str
    text: Path
    ctx: int
    chunks: int
    thresholds: tuple[tuple[str, float], ...] = ()
    text_sha256: str | None = None
    kv_types: tuple[str, ...] = ()  # () or ("f16", more...): each quant also measured with these KV caches
    render: str = "text"  # "chat": the text is JSONL conversations, rendered with the model's chat template
    long: bool = False  # ``ctx: long``: one chunk at min(trained context, max_ctx); ctx is max_ctx until eval-base
    max_ctx: int = 4096
    hub_dataset: str | None = None  # the text's Hub dataset id (the card's ``datasets:``)

    def describe(self) -> dict:
        return {"name": self.name, "text": self.text.name, "ctx": self.ctx, "chunks": self.chunks, **self.describe_kv(),
                **({"render": self.render} if self.render != "text" else {}), **({"ctx_long": True} if self.long else {}),
                **({"hub_dataset": self.hub_dataset} if self.hub_dataset else {})}

    def describe_kv(self) -> dict:  # only where set: a recipe without kv_types keeps its keys and triggers
        return {"kv_types": list(self.kv_types)} if self.kv_types else {}

    @property
    def kv_extra(self) -> tuple[str, ...]:
        """The KV types measured besides the default f16 cache."""
        return tuple(k for k in self.kv_types if k != "f16")
