"""Expert coverage of an importance matrix (issue #31): which experts of a mixture-of-experts model the calibration
text reached.

llama-imatrix counts, per expert of each ``*_exps`` weight, the routed tokens that reached it (``e.counts[ex]++`` per
token and slot: tools/imatrix/imatrix.cpp:316-328 of b11312) and stores them as ``<weight>.counts``, an F32 tensor of
``[1, n_expert]`` beside ``<weight>.in_sum2`` ``[ne0, n_expert]`` (imatrix.cpp:614-629). It only warns "partial data"
(imatrix.cpp:559-571), and llama-quantize weighs a zero-count expert as if it were uniform, so a cold expert goes to a
low-bit type unguided. Here the counts are read back per layer (the gate, up and down experts of a layer see the same
routing; the largest count per expert is taken), and ``imatrix.min_expert_coverage`` turns them into a gate: the
fraction of a layer's experts with at least ``imatrix.min_expert_tokens`` routed tokens. Standard library only.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

from pipeline.bounds import below
from pipeline.errors import PipelineError
from pipeline.gguf import read_header

_EXPS = re.compile(r"^blk\.(\d+)\.(\w+_exps)\.weight\.counts$")


def expert_counts(path: str | Path) -> dict[int, list[int]]:
    """Per layer, the routed tokens of each expert (an empty dict for a dense model's imatrix)."""
    header = read_header(path)
    layers: dict[int, list[int]] = {}
    with open(path, "rb") as fh:
        for t in header.tensors:
            m = _EXPS.match(t.name)
            if not m:
                continue
            if t.type_name != "F32" or len(t.shape) != 2 or t.shape[0] != 1:
                raise PipelineError(f"{path}: {t.name}: not llama-imatrix's [1, n_expert] F32 counts "
                                    f"({t.type_name} {list(t.shape)})")
            fh.seek(t.offset)
            counts = [int(round(c)) for c in struct.unpack(f"<{t.shape[1]}f", fh.read(4 * t.shape[1]))]
            layer = int(m.group(1))
            have = layers.get(layer)
            if have is not None and len(have) != len(counts):
                raise PipelineError(f"{path}: {t.name}: {len(counts)} experts, another tensor of layer {layer} has "
                                    f"{len(have)}")
            layers[layer] = counts if have is None else [max(a, b) for a, b in zip(have, counts, strict=True)]
    return dict(sorted(layers.items()))


def coverage(counts: dict[int, list[int]], min_tokens: int = 1) -> list[dict]:
    """Per layer: experts, the covered ones (at least ``min_tokens`` routed tokens), the fraction, the cold experts,
    and the fewest and most tokens an expert got."""
    out = []
    for layer, c in counts.items():
        cold = [i for i, n in enumerate(c) if n < min_tokens]
        out.append({"layer": layer, "experts": len(c), "covered": len(c) - len(cold),
                    "fraction": round((len(c) - len(cold)) / len(c), 6) if c else 0.0, "cold": cold,
                    "min_tokens": min(c, default=0), "max_tokens": max(c, default=0)})
    return out


def coverage_failures(table: list[dict], min_coverage: float | None, min_tokens: int, where: str) -> list[str]:
    """One line per layer below ``min_coverage`` (None: not gated), naming the layer and its cold experts."""
    if min_coverage is None:
        return []
    return [f"{where}: layer {row['layer']} covers {row['covered']}/{row['experts']} experts ({row['fraction']:.3f} < "
            f"imatrix.min_expert_coverage {min_coverage:g}); cold experts (fewer than {min_tokens} routed tokens): "
            + ", ".join(map(str, row["cold"])) for row in table if below(row["fraction"], min_coverage)]


def imatrix_mismatch(base, matrix) -> str | None:
    """Why the importance matrix ``matrix`` is not one of the model ``base`` (GGUF headers both), or None: an entry names
    a weight the base lacks, or its row length or expert count differs from the weight's (llama-quantize only logs a
    missing name, and throws on a size mismatch after writing part of the file: src/llama-quant.cpp:1276-1293)."""
    weights = {t.name: t for t in base.tensors}
    entries = [t for t in matrix.tensors if t.name.endswith(".in_sum2")]
    for e in entries:
        name = e.name.removesuffix(".in_sum2")
        w = weights.get(name)
        if w is None:
            return f"it names {name}, which {base.path.name} does not have"
        n_expert = w.shape[2] if len(w.shape) > 2 else 1
        got = (e.shape[0], e.shape[1] if len(e.shape) > 1 else 1)
        if got != (w.shape[0], n_expert):
            what = "experts" if got[0] == w.shape[0] else "columns"
            return (f"{name} has {w.shape[0]} columns x {n_expert} expert(s) in {base.path.name}, {got[0]} x {got[1]} "
                    f"in the matrix ({what} differ)")
    if not entries:
        return "it holds no in_sum2 entry (not a llama-imatrix GGUF)"
    return None
