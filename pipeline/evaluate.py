"""llama-perplexity runs and parsing of their output."""

from __future__ import annotations

import re
from pathlib import Path

from .errors import PipelineError
from .tools import Toolchain, run_tool, tail

_PPL_RE = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
# llama-perplexity exits 0 in some failures; these lines reveal them.
_SILENT_FAILURES = (
    re.compile(r"you need at least \d+ tokens[^\n]*"),
    re.compile(r"failed to (?:load|open)[^\n]*"),
)


def perplexity(tc: Toolchain, model: str | Path, text: str | Path, ctx: int, chunks: int, threads: int = 2,
               log: str | Path | None = None, extra: list[str] | None = None) -> tuple[float, float]:
    """Mean perplexity (and its +/-) of ``model`` on ``text``; raises when no estimate is printed."""
    args = ["-m", model, "-f", text, "-c", str(ctx), "--chunks", str(chunks), "-t", str(threads), "-b", str(ctx),
            *(extra or [])]
    res = run_tool(tc, "llama-perplexity", args, Path(log) if log else None, check=False)
    for rx in _SILENT_FAILURES:
        m = rx.search(res.output)
        if m:
            raise PipelineError(f"llama-perplexity on {model}: {m.group(0).strip()}")
    m = _PPL_RE.search(res.output)
    if res.returncode != 0 or not m:
        raise PipelineError(f"llama-perplexity on {model} printed no final estimate (exit {res.returncode}): "
                            f"{tail(res.output)}")
    return float(m.group(1)), float(m.group(2))
