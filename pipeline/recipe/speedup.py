"""A draft's measured speed-up (``draft.speedup``, ``draft.min_speedup``): what pipeline/stages/speedup.py runs and
what the publish stage decides from it (docs/drafts.md#measured-speed-up). (see pipeline/recipe/__init__.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pipeline.recipe import schema as _schema

SPEEDUP_KEYS = _schema.keys("draft.speedup")
ROUNDS_MIN = 3  # an interval of fewer rounds says nothing


@dataclass(frozen=True)
class Speedup:
    """``draft.speedup``: rounds of llama-server with and without the draft; at the chosen draft length also sampled
    (``temperature``, ``seed``) and with ``parallel`` requests at once (``-np``)."""

    rounds: int = ROUNDS_MIN
    temperature: float = 0.8  # llama.cpp's default (common/common.h), what a client that sets none gets
    seed: int = 1
    parallel: int = 4  # llama-server's -np when none is given (auto: 4 slots)
    prompts: int | None = None  # None: draft.prompts
    n_predict: int | None = None  # None: draft.n_predict
    p_min: tuple[float, ...] = ()  # --spec-draft-p-min values tried at the chosen length
    n_min: tuple[int, ...] = ()  # --spec-draft-n-min values tried at the chosen length

    def describe(self) -> dict:
        return asdict(self)


def parse_speedup(ctx, value, min_speedup) -> tuple[Speedup | None, float | None]:
    """``draft.speedup`` (true, false or a mapping) and ``draft.min_speedup`` (``ctx``: the parser's ``_Ctx``)."""
    if min_speedup is not None:
        ctx.number(min_speedup, "draft.min_speedup", "draft")
    if value is False:
        if min_speedup is not None:
            ctx.fail("draft.min_speedup", "needs the speed-up measured (draft.speedup is false)")
        return None, None
    if value is True or value is None:
        return Speedup(), min_speedup
    d = ctx.mapping(value, "draft.speedup", SPEEDUP_KEYS)
    out = {key: ctx.number(d[key], f"draft.speedup.{key}", "draft.speedup")
           for key in ("rounds", "parallel", "seed", "prompts", "n_predict") if key in d}
    if "temperature" in d:
        out["temperature"] = float(ctx.number(d["temperature"], "draft.speedup.temperature", "draft.speedup"))
    for key in ("p_min", "n_min"):
        if key in d:
            out[key] = _values(ctx, d[key], key)
    return Speedup(**out), min_speedup


def _values(ctx, value, key: str) -> tuple:
    """``draft.speedup.p_min`` (probabilities 0 < p < 1) or ``n_min`` (draft lengths >= 1), as a list."""
    where = f"draft.speedup.{key}"
    if not isinstance(value, list) or not value:
        ctx.fail(where, f"must be a non-empty list, got {value!r}")
    for v in value:  # 0, llama.cpp's default, is always measured
        ctx.number(v, where, "draft.speedup")
    if len(set(value)) != len(value):
        ctx.fail(where, f"repeats a value: {value!r}")
    return tuple(float(v) for v in value) if key == "p_min" else tuple(value)
