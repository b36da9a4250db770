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
    if min_speedup is not None and (isinstance(min_speedup, bool) or not isinstance(min_speedup, (int, float))
                                    or min_speedup <= 0):
        ctx.fail("draft.min_speedup", f"must be a number > 0 (a speed-up, 1 = as fast as without), got {min_speedup!r}")
    if value is False:
        if min_speedup is not None:
            ctx.fail("draft.min_speedup", "needs the speed-up measured (draft.speedup is false)")
        return None, None
    if value is True or value is None:
        return Speedup(), min_speedup
    d = ctx.mapping(value, "draft.speedup", SPEEDUP_KEYS)
    out = {}
    for key, lo in (("rounds", ROUNDS_MIN), ("parallel", 1), ("seed", 0), ("prompts", 1), ("n_predict", 8)):
        if key in d:
            v = d[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                ctx.fail(f"draft.speedup.{key}", f"must be an integer >= {lo}, got {v!r}")
            out[key] = v
    if "temperature" in d:
        t = d["temperature"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
            ctx.fail("draft.speedup.temperature", f"must be a number >= 0, got {t!r}")
        out["temperature"] = float(t)
    for key in ("p_min", "n_min"):
        if key in d:
            out[key] = _values(ctx, d[key], key)
    return Speedup(**out), min_speedup


def _values(ctx, value, key: str) -> tuple:
    """``draft.speedup.p_min`` (probabilities 0 < p < 1) or ``n_min`` (draft lengths >= 1), as a list."""
    where = f"draft.speedup.{key}"
    if not isinstance(value, list) or not value:
        ctx.fail(where, f"must be a non-empty list, got {value!r}")
    for v in value:
        if key == "p_min" and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1):
            ctx.fail(where, f"values must be probabilities 0 < p < 1 (0, llama.cpp's default, is always measured), "
                            f"got {v!r}")
        if key == "n_min" and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            ctx.fail(where, f"values must be integers >= 1 (0, llama.cpp's default, is always measured), got {v!r}")
    if len(set(value)) != len(value):
        ctx.fail(where, f"repeats a value: {value!r}")
    return tuple(float(v) for v in value) if key == "p_min" else tuple(value)
