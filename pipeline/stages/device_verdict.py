"""A device's verdict on the slice (:func:`judge`) and what a device-check result is (its kind, its labels), shared by
``ggufpipe device-check`` on a device (pipeline/devices/check.py), ``ggufpipe collect`` and the publish stage
(pipeline/stages/device_results.py). Standard library plus the pipeline's own modules: a device install runs it."""

from __future__ import annotations

import math
import re

from pipeline import bounds

RESULT_KIND = "ggufpipe-device-check"
RESULT_VERSION = 1
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # a result's `timestamp`: when device-check ran, UTC; it orders a device's results
# device labels land in devices.json and the card's table: the rule of a recipe `devices:` name
# (pipeline/recipe/devices.py DEVICE_NAME_RE; not imported: a device install has no YAML)
LABEL_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")
POWER_MODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_. -]{0,31}$")


def entry_sha256(entry: dict) -> str | None:
    """The SHA256 a result names its file by: the file's own; a split file's, which has none, is the unsplit file's
    (its shards were each verified against the manifest). None when the entry has neither."""
    sha = entry.get("sha256")
    split = entry.get("split")
    if sha is None and isinstance(split, dict) and isinstance(split.get("unsplit"), dict):
        sha = split["unsplit"].get("sha256")
    return sha if isinstance(sha, str) else None


def same_top_p_limit(tolerance: dict, scored_tokens: int) -> float:
    """Points of same top p a correct device may differ by on ``scored_tokens``: the fixed floor, or the spread of
    near-tied tokens flipping at the stated rate (pipeline/stages/publish_devices.py ``TOLERANCE``), if wider."""
    flips = tolerance.get("same_top_p_sigmas", 0) * 100.0 * math.sqrt(tolerance.get("same_top_p_flip_rate", 0.0)
                                                                      / scored_tokens)
    return round(max(tolerance["same_top_p_points"], flips), 4)


# What a verdict is computed from, each checked before it is compared (a NaN compares false, so |Δ| <= limit would
# pass it): the slice values of the build box and the device, and the manifest's tolerance (publish_devices.TOLERANCE)
SLICE_RANGES = {"kld_mean": bounds.KLD_MEAN, "same_top_p": bounds.FRACTION}
TOLERANCE_RANGES = {"kld_mean_abs": bounds.Range(0, 1), "kld_mean_rel": bounds.Range(0, 10),
                    "same_top_p_points": bounds.Range(0, 100)}
TOLERANCE_OPTIONAL = {"same_top_p_flip_rate": bounds.FRACTION, "same_top_p_sigmas": bounds.Range(0, 100)}
SCORED_TOKENS = bounds.integer(1, bounds.SIZE_MAX)


NAMES = ("expected", "measured", "tolerance", "scored_tokens")


def judge_problems(expected, measured, tolerance, scored_tokens, names: tuple[str, ...] = NAMES) -> list[str]:
    """What makes a verdict impossible, each naming its field (``expected.kld_mean: must be ..., got nan``; ``names``:
    what to call the four inputs); [] when every input of :func:`judge` is there, finite and in range."""
    out = []
    for what, values, ranges, optional in ((names[0], expected, SLICE_RANGES, {}),
                                           (names[1], measured, SLICE_RANGES, {}),
                                           (names[2], tolerance, TOLERANCE_RANGES, TOLERANCE_OPTIONAL)):
        if not isinstance(values, dict):
            out.append(f"{what}: must be a mapping, got {type(values).__name__}")
            continue
        for key, rng in {**ranges, **optional}.items():
            if key not in values:
                if key not in optional:
                    out.append(f"{what}.{key}: missing")
            elif (msg := rng.problem(values[key])) is not None:
                out.append(f"{what}.{key}: {msg}")
    if (msg := SCORED_TOKENS.problem(scored_tokens)) is not None:
        out.append(f"{names[3]}: {msg}")
    return out


def judge(expected: dict, measured: dict, tolerance: dict, scored_tokens: int) -> dict:
    """The verdict on the slice: each metric's delta (device - build box) and limit, and ``passed``. It fails closed:
    a value or tolerance that is missing, NaN, infinite or out of range gives ``passed`` false, no deltas and
    ``problems`` naming each (:func:`judge_problems`)."""
    problems = judge_problems(expected, measured, tolerance, scored_tokens)
    if problems:
        return {"delta": None, "limit": None, "passed": False, "problems": problems}
    kld_limit = max(tolerance["kld_mean_abs"], tolerance["kld_mean_rel"] * expected["kld_mean"])
    top_limit = same_top_p_limit(tolerance, scored_tokens)
    d_kld = measured["kld_mean"] - expected["kld_mean"]
    d_top = 100.0 * (measured["same_top_p"] - expected["same_top_p"])
    return {"delta": {"kld_mean": round(d_kld, 8), "same_top_p_points": round(d_top, 6)},
            "limit": {"kld_mean": round(kld_limit, 8), "same_top_p_points": top_limit},
            "passed": abs(d_kld) <= kld_limit and abs(d_top) <= top_limit + 1e-9}
