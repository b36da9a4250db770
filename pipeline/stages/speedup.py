"""Stage: the speed-up a draft (or the model's MTP heads) gives, measured with ``llama-server`` (issue #30).

The acceptance stage counts accepted tokens; only a clock says whether they pay. On a CPU, verifying a batch of drafted
tokens is not nearly free as on a GPU, so a pair that accepts most of its drafts can still decode slower.

For one pair, on the build box, with every core (the stage takes them all: nothing else runs beside it):

* **baseline**: the deploy line's server with ``-md``, ``--spec-type`` and every ``--spec-draft-*`` removed and
  ``--spec-type none`` added: a kept ``-md`` still loads the draft, and without a type the server infers one from the
  draft file (common/arg.cpp:566-573, common/speculative.cpp:33-45 of b11312);
* **rounds**: the same ``-c -t -np`` and prompts for every configuration; in each round every configuration gets a
  fresh server, a short warm-up request, then the prompts one at a time; the order alternates from round to round;
* **per request**: the server's ``timings`` (tools/server/server-common.cpp:85-103): decoded tokens, decode t/s,
  ``draft_n`` and ``draft_n_accepted``;
* **result**: per round, decode t/s with the draft over decode t/s without; the median over rounds and the interval
  min-max over rounds;
* **conditions**: greedy at every ``n_max`` of the grid (the choice: the highest median, the shorter on a tie); at the
  chosen ``n_max`` only, sampled (``temperature``, ``seed``) and ``parallel`` concurrent requests. With a draft the
  server samples as it would without: the draft proposes its top-1 token (a top-k 10 sampler, ``cur_p->data[0]``,
  common/speculative.cpp:232-238, 363) and a drafted token is kept only where the target's own sample equals it
  (common/sampling.cpp:678-709).

The deploy line is published only when the lower end of the chosen interval is above 1 (pipeline/stages/
publish_sections.py); every figure here is volatile (the manifest's ``build`` section).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline.errors import PipelineError, RecipeError
from pipeline.fsutil import sha256_file
from pipeline.records import SpeedupRecord, VocabRecord
from pipeline.stagedef import Stage, mem_mb
from pipeline.stages.draft import prompts_from_text, spec_args
from pipeline.tools import Toolchain, find_toolchain, serve_tool

CTX = 4096  # room for `parallel` requests of a prompt (about 400 tokens) and n_predict each, in one unified cache
WARMUP_TOKENS = 8


def box() -> str:
    """This machine in words, for the verdicts: CPU model and cores."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "Hardware")):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def server_args(main, draft, spec_type: str, n_max: int | None, threads: int, parallel: int) -> list[str]:
    """``llama-server`` arguments of one configuration: the deploy line's speculative arguments (``n_max`` None: the
    baseline, ``--spec-type none`` and no ``-md``), then the arguments every configuration shares."""
    spec = ["-m", str(main), "--spec-type", "none"] if n_max is None else spec_args(main, draft, spec_type, n_max)
    return [*spec, "-c", str(CTX), "-t", str(threads), "-np", str(parallel)]


def _complete(url: str, prompt: str, n_predict: int, temperature: float, seed: int) -> dict:
    # urllib.request (slow): only the llama-server runs need it
    import urllib.request

    body = json.dumps({"prompt": prompt, "n_predict": n_predict, "temperature": temperature, "seed": seed,
                       "cache_prompt": False}).encode()
    req = urllib.request.Request(url + "/completion", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        t = json.loads(r.read()).get("timings") or {}
    return {"predicted_n": int(t.get("predicted_n", 0)), "predicted_ms": float(t.get("predicted_ms", 0.0)),
            "draft_n": int(t.get("draft_n", 0)), "draft_n_accepted": int(t.get("draft_n_accepted", 0))}


def run_config(tc: Toolchain, args: list[str], prompts: list[str], n_predict: int, log, what: str,
               temperature: float = 0.0, seed: int = 1, concurrent: int = 0) -> dict:
    """One server start: a warm-up request, then ``prompts`` one at a time (``temperature``, ``seed``), then, with
    ``concurrent``, that many greedy requests at once. Decode t/s: decoded tokens over decode seconds of the sequential
    requests; of the concurrent ones, the sum of their rates (the server's throughput)."""
    try:
        with serve_tool(tc, args, Path(log) if log else None) as url:
            _complete(url, prompts[0], WARMUP_TOKENS, 0.0, seed)
            seq = [_complete(url, p, n_predict, temperature, seed) for p in prompts]
            par = []
            if concurrent:
                batch = [prompts[i % len(prompts)] for i in range(concurrent)]
                with ThreadPoolExecutor(concurrent) as pool:
                    par = list(pool.map(lambda p: _complete(url, p, n_predict, 0.0, seed), batch))
    except PipelineError as exc:
        raise PipelineError(f"{what}: {exc}") from None
    except (OSError, ValueError) as exc:
        raise PipelineError(f"{what}: llama-server's /completion failed: {exc}") from None
    out = {"sequential": _rates(seq)}
    if concurrent:
        out["concurrent"] = {**_rates(par), "tokens_per_s": round(sum(
            r["predicted_n"] / (r["predicted_ms"] / 1000) for r in par if r["predicted_ms"]), 3)}
    return out


def _rates(reqs: list[dict]) -> dict:
    tokens, ms = sum(r["predicted_n"] for r in reqs), sum(r["predicted_ms"] for r in reqs)
    return {"tokens": tokens, "tokens_per_s": round(tokens / (ms / 1000), 3) if ms else 0.0,
            "drafted": sum(r["draft_n"] for r in reqs), "accepted": sum(r["draft_n_accepted"] for r in reqs)}


def summarize(with_draft: list[float], without: list[float]) -> dict:
    """Per-round speed-ups (same round with over without), their median and min-max interval."""
    ratios = [round(w / b, 4) if b else 0.0 for w, b in zip(with_draft, without, strict=True)]
    return {"tokens_per_s": with_draft, "baseline_tokens_per_s": without, "speedup_by_round": ratios,
            "speedup": round(statistics.median(ratios), 4), "interval": [min(ratios), max(ratios)]}


def _condition(rounds: list[tuple[dict, dict]], part: str) -> dict:
    """A condition's summary from each round's (with, without) measurements of ``part``."""
    w, b = [r[0][part] for r in rounds], [r[1][part] for r in rounds]
    drafted, accepted = sum(x["drafted"] for x in w), sum(x["accepted"] for x in w)
    return {**summarize([x["tokens_per_s"] for x in w], [x["tokens_per_s"] for x in b]), "drafted": drafted,
            "accepted": accepted, "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0}


def verdict(speedup: float, interval: list[float], n_max: int, where: str) -> tuple[bool, str]:
    """(helps, the line the manifest, report and card give): a speed-up only when the whole interval is above 1."""
    lo, hi = interval
    if lo > 1.0:
        return True, f"speed-up {speedup:.2f}x ({lo:.2f}-{hi:.2f}) at n_max {n_max} on {where}"
    return False, f"no speed-up on {where}: measured {speedup:.2f}x ({lo:.2f}-{hi:.2f}) at n_max {n_max}"


def speedup(main_gguf, draft_gguf, vocab_record, text, n_max: tuple[int, ...], prompts: int, n_predict: int,
            record, settings, threads: int = 2, log=None, tc: Toolchain | None = None,
            spec_type: str = "draft-simple") -> dict:
    """Entry function: the measured speed-up of one compatible pair (skipped for incompatible ones). ``settings``: the
    recipe's ``draft.speedup`` (rounds, temperature, seed, parallel)."""
    t0 = time.monotonic()
    tc = tc or find_toolchain()
    text = Path(text)
    vocab = VocabRecord.read(vocab_record, "speedup")
    base = {"eval_text": text.name, "text_sha256": sha256_file(text), "prompts": prompts, "n_predict": n_predict,
            "threads": threads, "spec_type": spec_type, "rounds": settings.rounds, "ctx": CTX}
    if not vocab.compatible:
        rec = SpeedupRecord(**base, skipped="vocabularies are incompatible")
        rec.write(record)
        return rec.to_dict()
    pair = Path(main_gguf).name + (f" + {Path(draft_gguf).name}" if draft_gguf is not None else "")
    passages = prompts_from_text(text.read_text(encoding="utf-8"), prompts)
    where = box()

    def one(n, round_i, temperature=0.0, concurrent=0):
        what = f"speed-up of {pair} ({'baseline' if n is None else f'n_max {n}'}, round {round_i + 1})"
        return run_config(tc, server_args(main_gguf, draft_gguf, spec_type, n, threads, settings.parallel), passages,
                          n_predict, log, what, temperature, settings.seed, concurrent)

    configs: list[int | None] = [None, *n_max]
    greedy: list[dict] = []
    for i in range(settings.rounds):
        order = configs if i % 2 == 0 else configs[::-1]  # alternate, so that a drift favours no configuration
        greedy.append({n: one(n, i) for n in order})
    by_n = {str(n): _condition([(g[n], g[None]) for g in greedy], "sequential") for n in n_max}
    best = max(n_max, key=lambda n: (by_n[str(n)]["speedup"], -n))
    extra: list[tuple[dict, dict]] = []
    for i in range(settings.rounds):  # the chosen n_max only: sampled, and `parallel` requests at once
        pair_runs = {n: one(n, i, settings.temperature, settings.parallel)
                     for n in ((best, None) if i % 2 == 0 else (None, best))}
        extra.append((pair_runs[best], pair_runs[None]))
    chosen = by_n[str(best)]
    helps, line = verdict(chosen["speedup"], chosen["interval"], best, where)
    rec = SpeedupRecord(**base, box=where, by_n_max=by_n, best_n_max=best, speedup=chosen["speedup"],
                        interval=chosen["interval"], helps=helps, verdict=line,
                        sampled={"temperature": settings.temperature, "seed": settings.seed,
                                 **_condition(extra, "sequential")},
                        concurrent={"parallel": settings.parallel, **_condition(extra, "concurrent")},
                        command=" ".join(["llama-server", *server_args(Path(main_gguf).name, None if draft_gguf is None
                                                                       else Path(draft_gguf).name, spec_type, best,
                                                                       threads, settings.parallel)]),
                        baseline=" ".join(["llama-server", *server_args(Path(main_gguf).name, None, spec_type, None,
                                                                        threads, settings.parallel)]),
                        seconds=round(time.monotonic() - t0, 1))
    rec.write(record)
    print(f"speedup: {pair}: {line}", flush=True)
    return rec.to_dict()


def _run(j) -> None:
    r, d = j.recipe, j.recipe.draft
    if d.speedup is None:
        raise RecipeError(r.path, "draft.speedup", "the recipe measures no speed-up (speedup: false)")
    draft = None if d.mtp and r.mtp != "separate" else j.input["draft"]  # MTP heads inside the main file: no -md
    speedup(j.input["main"], draft, j.input["vocab"], d.eval_text, d.n_max, d.prompts, d.n_predict, j.output["record"],
            d.speedup, threads=j.threads, log=j.log, spec_type=d.spec_type)


def _inputs(r, wc, L) -> dict:
    return {"main": L.main_gguf(r, wc["mkey"]), "draft": L.draft_gguf(r, wc["dkey"], wc["mkey"]),
            "vocab": L.vocab_record(r.name, wc["mkey"], wc["dkey"])}


SPEEDUP = Stage(
    # every core it is given (config speedup_threads, capped by --cores), so that nothing runs beside the clock
    "speedup", "speedup", order=63, log="speedup-{mkey}--{dkey}", wildcards=("mkey", "dkey"),
    threads="speedup_threads", capped=True, run=_run, inputs=_inputs, outputs=lambda L: {"record": L.speedup_record("{name}", "{mkey}", "{dkey}")},
    trigger=lambda r, wc, s: {"speedup": r.draft.speedup.describe() if r.draft.speedup else None,
                              "eval_text": str(r.draft.eval_text), "n_max": r.draft.n_max, "prompts": r.draft.prompts,
                              "n_predict": r.draft.n_predict, "build": s.build_number, "spec_type": r.draft.spec_type},
    resources={"mem_mb": lambda s: mem_mb(s.total, 1.5, 1024), "disk_mb": 1024,
               "runtime": lambda s: int(120 + s.total / 10)},
)
