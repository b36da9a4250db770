"""Stage bench: ``llama-bench`` once per quant — prompt processing and generation tokens/s on this
build box (same threads for all). Build-box figures, for the report; not a quality gate."""

from __future__ import annotations

import json
import platform
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.records import BenchRecord
from pipeline.stagedef import Stage, mem_mb
from pipeline.tools import Toolchain, find_toolchain, run_tool, tail

PROMPT_TOKENS = 256
GEN_TOKENS = 64
REPETITIONS = 3


def parse_bench_json(output: str) -> dict:
    lines = output.splitlines()
    try:  # the JSON array sits between a line "[" and a line "]" (logs go around it)
        first = lines.index("[")
        last = len(lines) - 1 - lines[::-1].index("]")
        rows = json.loads("\n".join(lines[first:last + 1]))
    except ValueError:
        rows = None
    if not rows:
        raise PipelineError(f"llama-bench printed no JSON results: {tail(output)}")
    out = {}
    for row in rows:
        if row.get("n_prompt", 0) > 0 and row.get("n_gen", 0) == 0:
            out["pp_tokens_per_s"] = round(float(row["avg_ts"]), 2)
            out["pp_tokens"] = int(row["n_prompt"])
        elif row.get("n_gen", 0) > 0 and row.get("n_prompt", 0) == 0:
            out["tg_tokens_per_s"] = round(float(row["avg_ts"]), 2)
            out["tg_tokens"] = int(row["n_gen"])
    if "pp_tokens_per_s" not in out or "tg_tokens_per_s" not in out:
        raise PipelineError(f"llama-bench results lack the pp or tg test: {sorted(out)}")
    return out


def measure(tc: Toolchain, gguf: str | Path, threads: int, prompt: int = PROMPT_TOKENS, gen: int = GEN_TOKENS,
            repetitions: int = REPETITIONS, log: str | Path | None = None) -> dict:
    """llama-bench's prompt-processing and generation tokens/s of ``gguf`` (also ``ggufpipe device-check``'s short
    run)."""
    args = ["-m", gguf, "-p", str(prompt), "-n", str(gen), "-t", str(threads), "-r", str(repetitions), "-o", "json"]
    res = run_tool(tc, "llama-bench", args, Path(log) if log else None)
    return {**parse_bench_json(res.output), "threads": threads}


def bench(gguf: str | Path, record: str | Path, threads: int = 2, log: str | Path | None = None,
          tc: Toolchain | None = None) -> dict:
    """Entry function: tokens/s of one GGUF on this machine, written to ``record``."""
    rec = BenchRecord(**measure(tc or find_toolchain(), gguf, threads, log=log),
                      machine=f"{platform.machine()} {platform.processor() or ''}".strip(),
                      label="build-box figures (CPU, this machine), not device speed")
    rec.write(record)
    return rec.to_dict()


STAGE = Stage(
    "bench", "bench", order=53, log="bench-{bkey}", wildcards=("bkey",), threads="eval_threads",
    run=lambda j: bench(j.input["gguf"], j.output["record"], threads=j.threads, log=j.log),
    inputs=lambda r, wc, L: {"gguf": L.main_gguf(r, wc["bkey"])},
    outputs=lambda L: {"record": L.bench_record("{name}", "{bkey}")},
    trigger=lambda r, wc, s: {"offload": s.offload},
    resources={"mem_mb": lambda s: mem_mb(s.total, 1.3, 1024), "disk_mb": 1024,
               "runtime": lambda s: int(30 + s.total / 100)},
)
