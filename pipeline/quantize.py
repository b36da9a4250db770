"""Stage quantize: one ``llama-quantize`` run per requested quant, from the F16/BF16 GGUF."""

from __future__ import annotations

import re
from pathlib import Path

from .errors import PipelineError
from .fsutil import atomic_output, write_json_atomic
from .recipe import Recipe
from .tools import Toolchain, find_toolchain, run_tool, tail


def explain_failure(output: str) -> str:
    if "requires an importance matrix" in output or "requires an imatrix" in output:
        return "this quant type needs an importance matrix (add an imatrix to the recipe)"
    if re.search(r"No space left on device|failed to write|write error", output, re.I):
        return "no space left on device while writing the quant"
    m = re.search(r"invalid (?:output tensor|token embedding|tensor) type[^\n]*|[^\n]*unknown ggml type[^\n]*", output, re.I)
    if m:
        return m.group(0).strip()
    return tail(output)


def quantize(recipe: Recipe, key: str, base_gguf: str | Path, out_gguf: str | Path, record: str | Path,
             log: str | Path | None = None, threads: int = 1, tc: Toolchain | None = None) -> dict:
    """Entry function: quantize ``base_gguf`` to ``out_gguf`` as the recipe's quant ``key``."""
    tc = tc or find_toolchain()
    q = recipe.quant(key)
    base_gguf, out_gguf, record = Path(base_gguf), Path(out_gguf), Path(record)
    if not base_gguf.is_file():
        raise PipelineError(f"{recipe.path}: quantize {key}: {base_gguf} is missing (run convert first)")
    args = q.quantize_args()
    with atomic_output(out_gguf) as tmp:
        res = run_tool(tc, "llama-quantize", [*args, base_gguf, tmp, q.type, str(max(1, threads))],
                       Path(log) if log else None, check=False)
        if res.returncode != 0 or not tmp.is_file():
            raise PipelineError(f"{recipe.path}: quantize {key}: llama-quantize failed: {explain_failure(res.output)}"
                                + (f" [log: {log}]" if log else ""))
    rec = {
        "quant": q.describe(),
        "tool": "llama-quantize",
        "toolchain": tc.describe(),
        "seconds": round(res.seconds, 1),
    }
    write_json_atomic(record, rec)
    return rec
