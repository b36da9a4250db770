"""Reading what a llama.cpp tool printed: its error lines, and the bounded re-run of a run that lost its last lines.

The pinned b11312's tools log through a thread that ``main`` does not join: common/log.cpp:453-458 leaks the logger
singleton on purpose (llama.cpp issue 22142), so lines still queued when ``main`` returns are never written, and exit
can tear a line (common/log.cpp:160-166: fprintf then fflush while exit flushes stdout). The tool exits 0 without
its final lines: llama-perplexity's estimate or statistics, llama-speculative-simple's counts (its ``main`` returns
without ``common_log_flush``: examples/speculative-simple/speculative-simple.cpp:347-374). :func:`run_complete`
re-runs such a run, at most :data:`LOST_LINES_RETRIES` times and logged, for exactly that symptom: exit 0, no error
line, the run started, its output incomplete. pipeline/tools.py also runs the tools with passive OpenMP waiting,
which makes it rare.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pipeline import tools
from pipeline.tools import Toolchain, ToolResult

# Three runs in a row lost their last lines on a 2-core box under a parallel Snakemake build (a 0.1 s run of the
# tiny model), twice in one suite; a pause between tries lets the other jobs' bursts pass.
LOST_LINES_RETRIES = 6
LOST_LINES_PAUSE = 0.25  # seconds, times the attempt number

_ERROR_LINE = re.compile(r"^\s*(?:\d+\.\d+\.\d+\.\d+ )?E ((?:\w+: )?.+?)\s*$", re.M)


def tool_errors(output: str) -> list[str]:
    """llama.cpp's own error lines (``E ...``, with or without the timestamp) of a run's output."""
    return [m.group(1) for m in _ERROR_LINE.finditer(output)]


def lost_final_lines(res: ToolResult, started: Callable[[str], bool] | None, complete: Callable[[str], bool]) -> bool:
    """The symptom of b11312's unjoined logger: exit 0, no error line, the run started (``started`` None: a tool that
    exits non-zero on every early failure), its output incomplete."""
    return (res.returncode == 0 and not tool_errors(res.output) and (started is None or started(res.output))
            and not complete(res.output))


def run_complete(tc: Toolchain, name: str, args: list, log: Path | None, started: Callable[[str], bool] | None,
                 complete: Callable[[str], bool], what: str, retries: int = LOST_LINES_RETRIES) -> ToolResult:
    """``run_tool(check=False)``, re-run (at most ``retries`` times, each noted on stderr and in ``log``) while its
    output lost its final lines (:func:`lost_final_lines`). The last result is returned whatever it holds: the
    caller's parser then says what is missing."""
    for attempt in range(1, retries + 2):
        res = tools.run_tool(tc, name, args, log, check=False)
        if attempt > retries or not lost_final_lines(res, started, complete):
            return res
        note = (f"{what}: {name} exited 0 but its output lost its final lines or tore one (unjoined logger thread "
                f"of b11312): re-run {attempt} of at most {retries}")
        print(f"warning: {note}", file=sys.stderr, flush=True)
        if log:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(f"[{note}]\n")
        time.sleep(LOST_LINES_PAUSE * attempt)
    return res
