"""Stage: the speed-up a draft (or the model's MTP heads) gives, measured with ``llama-server`` (issue #30).

The acceptance stage counts accepted tokens; only a clock says whether they pay. On a CPU, verifying a batch of drafted
tokens is not nearly free as on a GPU, so a pair that accepts most of its drafts can still decode slower.

For one pair, on the build box, with every core (the stage takes them all: nothing else runs beside it):

* **baseline**: the deploy line's server with ``-md``, ``--spec-type`` and every ``--spec-draft-*`` removed and
  ``--spec-type none`` added: a kept ``-md`` still loads the draft, and without a type the server infers one from the
  draft file (common/arg.cpp:566-573, common/speculative.cpp:33-45 of b11312);
* **rounds**: the same ``-c -t`` and prompts for every configuration; each configuration's server is started once,
  warmed up by a short request and kept running (idle servers sleep); each round sends every configuration the
  prompts one at a time, in an order that reverses from round to round;
* **per request**: the server's ``timings`` (tools/server/server-common.cpp:85-103): decoded tokens, decode t/s,
  ``draft_n`` and ``draft_n_accepted``;
* **result**: per round, decode t/s with the draft over decode t/s without; the median over rounds and the interval
  min-max over rounds;
* **conditions**: greedy at every ``n_max`` of the grid (the choice: the highest median, the shorter on a tie); at the
  chosen ``n_max`` only, sampled (``temperature``, ``seed``); these on one slot (``-np 1``: a device serving one
  user), then ``parallel`` concurrent requests on servers with as many slots (``-np parallel``). With a draft the
  server samples as it would without: the draft proposes its top-1 token (a top-k 10 sampler, ``cur_p->data[0]``,
  common/speculative.cpp:232-238, 363) and a drafted token is kept only where the target's own sample equals it
  (common/sampling.cpp:678-709).

The deploy line is published only when the lower end of the chosen interval is above 1 (pipeline/stages/
publish_sections.py); every figure here is volatile (the manifest's ``build`` section).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline.bounds import finite
from pipeline.errors import PipelineError, RecipeError
from pipeline.fsutil import sha256_file
from pipeline.records import SpeedupRecord, VocabRecord
from pipeline.stagedef import Stage, mem_mb
from pipeline.stages.draft import prompts_from_text, spec_args
from pipeline.tools import Toolchain, find_toolchain, serve_tool

CTX = 4096  # room for `parallel` requests of a prompt (about 70 tokens) and n_predict each
WARMUP_TOKENS = 8
# The clock times decoding; a short prompt keeps prompt processing (done by the main model and the draft alike) from
# dominating a round. About 70 tokens of prose.
PROMPT_CHARS = 240


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


def server_args(main, draft, spec_type: str, n_max: int | None, threads: int, parallel: int,
                ctx: int = CTX, flags: tuple[str, ...] = ()) -> list[str]:
    """``llama-server`` arguments of one configuration: the deploy line's speculative arguments (``n_max`` None: the
    baseline, ``--spec-type none`` and no ``-md``) with ``flags`` (:func:`variant_flags`), then the arguments every
    configuration shares."""
    spec = (["-m", str(main), "--spec-type", "none"] if n_max is None
            else [*spec_args(main, draft, spec_type, n_max), *flags])
    return [*spec, "-c", str(ctx), "-t", str(threads), "-np", str(parallel)]


def variant_flags(variant: tuple[str, float] | None) -> tuple[str, ...]:
    """A tuning variant's flags: ``("p_min", p)``: stop drafting at the first draft token whose top probability is
    below p (common/speculative.cpp:366); ``("n_min", n)``: drop a draft shorter than n (common/speculative.cpp:409)."""
    if variant is None:
        return ()
    key, value = variant
    return (f"--spec-draft-{key.replace('_', '-')}", f"{value:g}")


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


@contextlib.contextmanager
def servers(tc: Toolchain, configs: dict, log, what: str):
    """One ``llama-server`` per configuration (``configs``: key -> arguments), each warmed up by a short request, all
    kept running while the block measures them (an idle server sleeps); yields key -> URL. Starting each
    configuration once, not once per round, is what keeps the demo's pair within a minute (docs/drafts.md)."""
    with contextlib.ExitStack() as stack:
        urls = {}
        for key, args in configs.items():
            try:
                urls[key] = stack.enter_context(serve_tool(tc, args, Path(log) if log else None))
                _complete(urls[key], "The", WARMUP_TOKENS, 0.0, 1)
            except PipelineError as exc:
                raise PipelineError(f"{what} ({_name(key)}): {exc}") from None
            except (OSError, ValueError) as exc:
                raise PipelineError(f"{what} ({_name(key)}): llama-server's /completion failed: {exc}") from None
        yield urls


def _name(key) -> str:
    """A configuration's name: None the baseline, an int a draft length, a tuning variant ``(key, value)``."""
    if key is None:
        return "baseline"
    if isinstance(key, str):  # the concurrent condition's "with"
        return "with the draft"
    return f"n_max {key}" if isinstance(key, int) else f"{key[0]} {key[1]:g}"


def measure(url: str, prompts: list[str], n_predict: int, what: str, temperature: float = 0.0, seed: int = 1,
            concurrent: int = 0) -> dict:
    """The prompts one at a time (``temperature``, ``seed``), or with ``concurrent`` that many greedy requests at
    once. Decode t/s: decoded tokens over decode seconds of the sequential requests; of the concurrent ones, the sum of
    their rates (the server's throughput)."""
    try:
        if not concurrent:
            return _rates([_complete(url, p, n_predict, temperature, seed) for p in prompts])
        batch = [prompts[i % len(prompts)] for i in range(concurrent)]
        with ThreadPoolExecutor(concurrent) as pool:
            par = list(pool.map(lambda p: _complete(url, p, n_predict, 0.0, seed), batch))
    except (OSError, ValueError) as exc:
        raise PipelineError(f"{what}: llama-server's /completion failed: {exc}") from None
    return {**_rates(par), "tokens_per_s": round(sum(r["predicted_n"] / (r["predicted_ms"] / 1000)
                                                     for r in par if r["predicted_ms"]), 3)}


def _rates(reqs: list[dict]) -> dict:
    tokens, ms = sum(r["predicted_n"] for r in reqs), sum(r["predicted_ms"] for r in reqs)
    return {"tokens": tokens, "tokens_per_s": round(tokens / (ms / 1000), 3) if ms else 0.0,
            "drafted": sum(r["draft_n"] for r in reqs), "accepted": sum(r["draft_n_accepted"] for r in reqs)}


def summarize(with_draft: list[float], without: list[float]) -> dict:
    """Per-round speed-ups (same round with over without), their median and min-max interval."""
    ratios = [round(w / b, 4) if b else 0.0 for w, b in zip(with_draft, without, strict=True)]
    if not all(map(finite, ratios)):  # min() and median() of a list holding NaN depend on its order: no speed-up
        return {"tokens_per_s": with_draft, "baseline_tokens_per_s": without, "speedup_by_round": ratios,
                "speedup": math.nan, "interval": [math.nan, math.nan]}
    return {"tokens_per_s": with_draft, "baseline_tokens_per_s": without, "speedup_by_round": ratios,
            "speedup": round(statistics.median(ratios), 4), "interval": [min(ratios), max(ratios)]}


def condition(rounds: list[tuple[dict, dict]]) -> dict:
    """A condition's summary from each round's (with, without) measurements."""
    w, b = [r[0] for r in rounds], [r[1] for r in rounds]
    drafted, accepted = sum(x["drafted"] for x in w), sum(x["accepted"] for x in w)
    return {**summarize([x["tokens_per_s"] for x in w], [x["tokens_per_s"] for x in b]), "drafted": drafted,
            "accepted": accepted, "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0}


def alternate(keys: list, rounds: int, run) -> list[dict]:
    """``rounds`` rounds of ``run(key, round)`` over ``keys``, in reversed order every other round, so that a drift
    favours no configuration."""
    return [{k: run(k, i) for k in (keys if i % 2 == 0 else keys[::-1])} for i in range(rounds)]


def greedy_rounds(urls: dict, prompts: list[str], n_predict: int, n_max: tuple[int, ...], rounds: int, seed: int,
                  what: str) -> tuple[dict, int]:
    """The greedy rounds over the baseline and every draft length: the condition per ``n_max`` and the chosen one
    (the highest median; the shorter on a tie)."""
    got = alternate([None, *n_max], rounds, lambda n, i: measure(
        urls[n], prompts, n_predict, f"{what} ({_name(n)}, round {i + 1})", 0.0, seed))
    by_n = {str(n): condition([(g[n], g[None]) for g in got]) for n in n_max}
    return by_n, max(n_max, key=lambda n: (by_n[str(n)]["speedup"], -n))


def verdict(speedup: float, interval: list[float], n_max: int, where: str, variant=None) -> tuple[bool, str]:
    """(helps, the line the manifest, report and card give): a speed-up only when the whole interval is above 1."""
    lo, hi = interval
    at = f"n_max {n_max}" + (f", {_name(variant)}" if variant else "")
    if lo > 1.0:
        return True, f"speed-up {speedup:.2f}x ({lo:.2f}-{hi:.2f}) at {at} on {where}"
    return False, f"no speed-up on {where}: measured {speedup:.2f}x ({lo:.2f}-{hi:.2f}) at {at}"


def tune(urls: dict, best: int, variants: list, prompts: list[str], n_predict: int, rounds: int, seed: int,
         what: str) -> tuple[tuple | None, dict]:
    """Rounds over the baseline, the chosen length and each variant of it (p-min, n-min: recipe
    ``draft.speedup.p_min/n_min``): of the variants whose whole interval lies above the plain length's in the same
    rounds, the one with the highest median (None: no variant changes the answer); and the ``tuning`` record. A
    higher median alone is kept out: on the demo a variant that changes nothing won by noise."""
    keys = [None, best, *variants]
    got = alternate(keys, rounds, lambda k, i: measure(urls[k], prompts, n_predict,
                                                        f"{what} ({_name(k)}, tuning round {i + 1})", 0.0, seed))
    conds = {_name(k): condition([(g[k], g[None]) for g in got]) for k in keys[1:]}
    plain_hi = conds[_name(best)]["interval"][1]
    above = [v for v in variants if conds[_name(v)]["interval"][0] > plain_hi]
    chosen = max(above, key=lambda v: conds[_name(v)]["speedup"]) if above else None
    win = chosen or best
    return chosen, {"rounds": rounds, "by_config": conds, "chosen": _name(win), "changes_answer": chosen is not None}


def speedup(main_gguf, draft_gguf, vocab_record, text, n_max: tuple[int, ...], prompts: int, n_predict: int,
            record, settings, threads: int = 2, log=None, tc: Toolchain | None = None,
            spec_type: str = "draft-simple") -> dict:
    """Entry function: the measured speed-up of one compatible pair (skipped for incompatible ones). ``settings``: the
    recipe's ``draft.speedup`` (rounds, temperature, seed, parallel; its prompts and n_predict, when set, replace the
    acceptance's ``prompts`` and ``n_predict``)."""
    t0 = time.monotonic()
    tc = tc or find_toolchain()
    text = Path(text)
    vocab = VocabRecord.read(vocab_record, "speedup")
    prompts, n_predict = settings.prompts or prompts, settings.n_predict or n_predict
    base = {"eval_text": text.name, "text_sha256": sha256_file(text), "prompts": prompts, "n_predict": n_predict,
            "threads": threads, "spec_type": spec_type, "rounds": settings.rounds, "ctx": CTX,
            "prompt_chars": PROMPT_CHARS}
    if not vocab.compatible:
        rec = SpeedupRecord(**base, skipped="vocabularies are incompatible")
        rec.write(record)
        return rec.to_dict()
    pair = Path(main_gguf).name + (f" + {Path(draft_gguf).name}" if draft_gguf is not None else "")
    passages = prompts_from_text(text.read_text(encoding="utf-8"), prompts, PROMPT_CHARS)
    where, what, seed = box(), f"speed-up of {pair}", settings.seed

    def args(n, parallel, variant=None):
        return server_args(main_gguf, draft_gguf, spec_type, n, threads, parallel, flags=variant_flags(variant))

    variants = [("p_min", p) for p in settings.p_min] + [("n_min", n) for n in settings.n_min]
    # one request at a time on one slot (what a device serving one user runs): greedy at every length, the variants of
    # the chosen one, then sampled
    with servers(tc, {n: args(n, 1) for n in (None, *n_max)}, log, what) as urls:
        by_n, best = greedy_rounds(urls, passages, n_predict, n_max, settings.rounds, seed, what)
        with servers(tc, {v: args(best, 1, v) for v in variants}, log, what) as more:
            urls.update(more)
            variant, tuning = (tune(urls, best, variants, passages, n_predict, settings.rounds, seed, what)
                               if variants else (None, None))
            key = variant or best
            sampled = alternate([key, None], settings.rounds, lambda n, i: measure(
                urls[n], passages, n_predict, f"{what} ({_name(n)} sampled, round {i + 1})", settings.temperature,
                seed))
    concurrent = None
    if settings.parallel > 1:  # `parallel` slots, as many requests at once
        with servers(tc, {"with": args(best, settings.parallel, variant), None: args(None, settings.parallel)}, log,
                     what) as urls:
            got = alternate(["with", None], settings.rounds, lambda n, i: measure(
                urls[n], passages, n_predict, f"{what} ({'baseline' if n is None else 'with the draft'}, "
                                              f"-np {settings.parallel}, round {i + 1})",
                seed=seed, concurrent=settings.parallel))
        concurrent = {"parallel": settings.parallel, **condition([(g["with"], g[None]) for g in got]),
                      "command": _command(main_gguf, draft_gguf, spec_type, best, threads, settings.parallel, variant)}
    chosen = tuning["by_config"][_name(variant)] if variant else by_n[str(best)]
    helps, line = verdict(chosen["speedup"], chosen["interval"], best, where, variant)
    rec = SpeedupRecord(**base, box=where, by_n_max=by_n, best_n_max=best, speedup=chosen["speedup"],
                        interval=chosen["interval"], helps=helps, verdict=line,
                        **({"tuning": tuning} if tuning else {}),
                        **({"best_flags": list(variant_flags(variant))} if variant else {}),
                        sampled={"temperature": settings.temperature, "seed": seed,
                                 **condition([(g[key], g[None]) for g in sampled])},
                        **({"concurrent": concurrent} if concurrent else {}),
                        command=_command(main_gguf, draft_gguf, spec_type, best, threads, 1, variant),
                        baseline=_command(main_gguf, None, spec_type, None, threads, 1),
                        seconds=round(time.monotonic() - t0, 1))
    rec.write(record)
    print(f"speedup: {pair}: {line} ({rec.seconds:.0f} s)", flush=True)
    return rec.to_dict()


def _command(main, draft, spec_type: str, n_max: int | None, threads: int, parallel: int, variant=None) -> str:
    """A configuration's command line, file names bare (as the deploy line has them)."""
    return " ".join(["llama-server", *server_args(Path(main).name, None if draft is None else Path(draft).name,
                                                  spec_type, n_max, threads, parallel, flags=variant_flags(variant))])


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
