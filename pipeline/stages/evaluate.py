"""Stages eval-base and eval: llama-perplexity runs, strict parsing of their statistics, gate verdicts.

* :func:`eval_base` runs ``llama-perplexity --kl-divergence-base`` on the F16/BF16 GGUF once per
  recipe and eval set, saving the base logits.
* :func:`eval_quant` runs ``llama-perplexity --kl-divergence`` for one quant against those logits
  with the same context, chunks, batch and threads, parses the full statistics and compares them
  with the gate thresholds.

llama-perplexity exits 0 in several failures (missing or corrupt base file, inconsistent
vocabulary, too few tokens); the runner detects them from the tool's error lines and fails loudly.
The parser fails, never returns zeros, when a statistic is missing or its format changed.

llama-perplexity b11312 can also lose its last output lines at exit, or tear one, while exiting 0
(tests/data/perplexity/torn-line-kld.txt): :func:`run_perplexity` re-runs it through
pipeline/tools_rerun.py for exactly that symptom (the run started: its chunk count is printed; its last line is
missing or a statistic's line holds its label but no readable value).
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from pipeline.bounds import finite
from pipeline.errors import PipelineError, ToolError
from pipeline.fsutil import atomic_output, sha256_file
from pipeline.memory import ModelShape
from pipeline.recipe import EvalSet, scored_tokens
from pipeline.records import EvalBaseRecord, EvalRecord
from pipeline.stagedef import Stage, logits_bytes, mem_mb
from pipeline.stages.eval_sets import LOGITS_HELPER, base_ids_file, resolve_ctx
from pipeline.tools import Toolchain, ToolResult, find_toolchain, helper_sources, run_tool, tail
from pipeline.tools_rerun import LOST_LINES_RETRIES, run_complete, tool_errors

_PPL_RE = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
_CHUNKS_RE = re.compile(r"(?:calculating perplexity|computing) over (\d+) chunks, n_ctx=(\d+)")

# name -> (regex on the statistics section, group) ; all required
_NUM = r"(-?[0-9.]+(?:e[-+]?\d+)?)"
STATISTICS = {
    "ppl_q": rf"^Mean PPL\(Q\)\s*:\s*{_NUM}",
    "ppl_base": rf"^Mean PPL\(base\)\s*:\s*{_NUM}",
    "ln_ppl_ratio": rf"^Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*{_NUM}",
    "ppl_ratio": rf"^Mean PPL\(Q\)/PPL\(base\)\s*:\s*{_NUM}",
    "ppl_diff": rf"^Mean PPL\(Q\)-PPL\(base\)\s*:\s*{_NUM}",
    "kld_mean": rf"^Mean\s+KLD:\s*{_NUM}",
    "kld_max": rf"^Maximum KLD:\s*{_NUM}",
    "kld_p99_9": rf"^99\.9%\s+KLD:\s*{_NUM}",
    "kld_p99": rf"^99\.0%\s+KLD:\s*{_NUM}",
    "kld_p95": rf"^95\.0%\s+KLD:\s*{_NUM}",
    "kld_median": rf"^Median\s+KLD:\s*{_NUM}",
    "kld_min": rf"^Minimum KLD:\s*{_NUM}",
    "rms_dp": rf"^RMS Δp\s*:\s*{_NUM}\s*±\s*[0-9.]+\s*%",
    "same_top_p": rf"^Same top p:\s*{_NUM}\s*±\s*[0-9.]+\s*%",
}
PERCENT = {"rms_dp", "same_top_p"}  # printed in %, stored as fractions
METRICS = {  # gate threshold -> (metric, direction)
    "max_ppl_ratio": ("ppl_ratio", "max"),
    "max_kld_mean": ("kld_mean", "max"),
    "max_kld_p99": ("kld_p99", "max"),
    "min_same_top_p": ("same_top_p", "min"),
}

# One row per chunk of a ``--kl-divergence`` run: the running values over chunks 1..i (perplexity.cpp, kl_divergence:
# "%4d", PPL "%9.4lf ± %9.4lf", ln ratio and KLD "%10.5lf ± %10.5lf", Δp RMS and same top p "%6.3lf ± %6.3lf %%"),
# from the same accumulators as the final statistics: row i equals the statistics of a run over the first i chunks.
_ROW_NUM = r"(-?(?:[0-9.]+|nan|inf))"
_CHUNK_ROW_RE = re.compile(rf"^\s*(\d+)\s+{_ROW_NUM} ± \s*\S+\s+{_ROW_NUM} ± \s*\S+\s+{_ROW_NUM} ± \s*\S+"
                           rf"\s+{_ROW_NUM} ± \s*\S+ %\s+{_ROW_NUM} ± \s*\S+ %\s*$", re.M)
CHUNK_ROW_KEYS = ("ppl_q", "ln_ppl_ratio", "kld_mean", "rms_dp", "same_top_p")


def parse_chunk_rows(output: str) -> list[dict]:
    """The running statistics after each chunk of a ``--kl-divergence`` run, in chunk order (``rms_dp`` and
    ``same_top_p`` as fractions, like :func:`parse_kld_statistics`)."""
    rows = []
    for m in _CHUNK_ROW_RE.finditer(output):
        if int(m.group(1)) != len(rows) + 1:
            raise PipelineError(f"llama-perplexity's chunk rows are out of order at chunk {m.group(1)} (format changed?)")
        vals = [float(v) for v in m.groups()[1:]]
        rows.append({k: round(v / 100.0, 8) if k in PERCENT else v for k, v in zip(CHUNK_ROW_KEYS, vals, strict=True)})
    return rows


def has_final_estimate(output: str) -> bool:
    """The last line a plain or ``--kl-divergence-base`` run prints is there."""
    return _PPL_RE.search(output) is not None


def has_kld_statistics(output: str) -> bool:
    """The last line a ``--kl-divergence`` run prints (``Same top p``) is there, and no statistic's line is torn (its
    label there, its value unreadable). A label that is missing altogether is a format change: no re-run."""
    if re.search(STATISTICS["same_top_p"], output, re.M) is None:
        return False
    return all(re.search(rx, output, re.M) or not re.search(rx[:rx.index(":") + 1], output, re.M)
               for rx in STATISTICS.values())


def run_perplexity(tc: Toolchain, args: list, log: Path | None, complete: Callable[[str], bool],
                   what: str, retries: int = LOST_LINES_RETRIES, tool: str = "llama-perplexity") -> ToolResult:
    """llama-perplexity (or ggufpipe-logits), re-run while its output lost its final lines (pipeline/tools_rerun.py)."""
    return run_complete(tc, tool, args, log, lambda out: _CHUNKS_RE.search(out) is not None, complete, what, retries)


def parse_kld_statistics(output: str) -> dict:
    """All statistics of a ``--kl-divergence`` run; PipelineError if any is missing."""
    if "====== KL divergence statistics ======" not in output:
        raise PipelineError("llama-perplexity printed no KL divergence statistics (format changed or run failed)")
    out = {}
    missing = []
    for key, rx in STATISTICS.items():
        m = re.search(rx, output, re.M)
        if not m:
            missing.append(key)
            continue
        val = float(m.group(1))
        out[key] = round(val / 100.0, 8) if key in PERCENT else val
    if missing:
        raise PipelineError(f"llama-perplexity output lacks {', '.join(missing)} (format changed?)")
    return out


def _check_chunks(output: str, es: EvalSet, what: str) -> None:
    m = _CHUNKS_RE.search(output)
    if not m:
        raise PipelineError(f"{what}: llama-perplexity did not say how many chunks it evaluated: {tail(output)}")
    got, ctx = int(m.group(1)), int(m.group(2))
    if ctx != es.ctx:
        raise PipelineError(f"{what}: llama-perplexity ran with n_ctx={ctx}, expected {es.ctx}")
    if got < es.chunks:
        raise PipelineError(
            f"{what}: eval text {es.text} is too short: it holds {got} chunks of {es.ctx} tokens, "
            f"the eval set asks for {es.chunks}; use a longer text or fewer chunks"
        )


def _common_args(es: EvalSet, threads: int) -> list[str]:
    return ["-c", str(es.ctx), "--chunks", str(es.chunks), "-b", str(es.ctx), "-t", str(threads)]


def _fail_on_tool_errors(res, what: str, tool: str = "llama-perplexity") -> None:
    errors = tool_errors(res.output)
    if errors:
        raise ToolError(tool, res.returncode, None, f"{what}: {tool} failed: {errors[0]}"
                        + (f" ({errors[1]})" if len(errors) > 1 else ""))
    if res.returncode != 0:
        raise ToolError(tool, res.returncode, None, f"{what}: {tool} exited {res.returncode}: {tail(res.output)}")


def check_text(es: EvalSet, what: str) -> str:
    """The eval text's SHA256; refuse a missing file or one whose SHA256 differs from the pin."""
    if not es.text.is_file():
        raise PipelineError(f"{what}: eval text {es.text} does not exist")
    digest = sha256_file(es.text)
    if es.text_sha256 and digest != es.text_sha256:
        raise PipelineError(f"{what}: eval text {es.text} has SHA256 {digest}, the recipe pins {es.text_sha256}")
    return digest


def count_tokens(tc: Toolchain, model: str | Path, text: str | Path, log: Path | None = None) -> int:
    """Tokens of ``text`` under ``model``'s vocabulary (llama-tokenize; loads the vocab only)."""
    res = run_tool(tc, "llama-tokenize", ["-m", model, "-f", text, "--show-count", "--ids", "--log-disable"], None)
    m = re.search(r"Total number of tokens: (\d+)", res.output)
    if not m:
        raise PipelineError(f"llama-tokenize printed no token count for {text}: {tail(res.output)}")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"[{text}: {m.group(1)} tokens]\n")
    return int(m.group(1))


def eval_base(recipe_name: str, es: EvalSet, base_gguf: str | Path, out_logits: str | Path, record: str | Path,
              threads: int = 2, log: str | Path | None = None, tc: Toolchain | None = None) -> dict:
    """Entry function: base logits of the unquantized GGUF on one eval set (run once per set)."""
    tc = tc or find_toolchain()
    what = f"{recipe_name}: eval set {es.name}: base"
    digest = check_text(es, what)
    es = resolve_ctx(es, base_gguf, what)
    render = None
    if es.render == "chat":
        with base_ids_file(tc, base_gguf, es, what, Path(log) if log else None) as (ids, render):
            n_tokens = render["tokens"]
            _check_length(n_tokens, es, what)
            res, m = _write_base_logits(tc, es, base_gguf, out_logits, threads, log, what, ids=ids)
    else:
        # The text's token count (for the record, and a clear "too short" error) comes from llama-tokenize run
        # beside llama-perplexity, on the core that perplexity leaves idle while it loads and tokenizes: run
        # first, it added 0.2-0.4 s to every build. A text too short for the eval set is refused with the
        # count (perplexity's own failure, or the logits it wrote, are then discarded).
        with ThreadPoolExecutor(1, thread_name_prefix="count-tokens") as pool:
            counting = pool.submit(count_tokens, tc, base_gguf, es.text)
            try:
                res, m = _write_base_logits(tc, es, base_gguf, out_logits, threads, log, what,
                                            lambda: _check_length(counting.result(), es, what))
            except PipelineError:
                _check_length(counting.result(), es, what)  # the count's message, when that is why it failed
                raise
        n_tokens = counting.result()
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"[{es.text}: {n_tokens} tokens]\n")
    rec = EvalBaseRecord(eval_set=es.name, text=es.text.name, text_sha256=digest, text_tokens=n_tokens, ctx=es.ctx,
                         chunks=es.chunks, scored_tokens=scored_tokens(es.ctx, es.chunks), threads=threads,
                         ppl=float(m.group(1)), ppl_stderr=float(m.group(2)), seconds=round(res.seconds, 1),
                         **({"render": render} if render else {}))
    rec.write(record)
    return rec.to_dict()


def _check_length(n_tokens: int, es: EvalSet, what: str) -> None:
    need = max(es.ctx * es.chunks, 2 * es.ctx)  # 2 x ctx even for one chunk (tools/perplexity/perplexity.cpp:478)
    if n_tokens < need:
        raise PipelineError(
            f"{what}: eval text {es.text} is too short: {n_tokens} tokens, ctx {es.ctx} x {es.chunks} chunks needs "
            f"{need}; use a longer text or fewer chunks"
        )


def _write_base_logits(tc: Toolchain, es: EvalSet, base_gguf, out_logits, threads: int, log, what: str,
                       check_before_rename: Callable[[], None] | None = None, ids: Path | None = None):
    # ids: a file of token ids (render: chat), which ggufpipe-logits reads where llama-perplexity reads text
    tool = LOGITS_HELPER if ids else "llama-perplexity"
    with atomic_output(out_logits) as tmp:
        res = run_perplexity(tc, ["-m", base_gguf, "-f", ids or es.text, *_common_args(es, threads),
                                  "--kl-divergence-base", tmp], Path(log) if log else None, has_final_estimate, what,
                             tool=tool)
        if check_before_rename:
            check_before_rename()
        _fail_on_tool_errors(res, what, tool)
        _check_chunks(res.output, es, what)
        m = _PPL_RE.search(res.output)
        if not m:
            raise PipelineError(f"{what}: {tool} printed no final estimate: {tail(res.output)}")
    return res, m


def restore_base_logits(tc: Toolchain, es: EvalSet, base_gguf, base_logits, base_record, threads: int, log,
                        what: str) -> bool:
    """Recompute base logits that :func:`pipeline.stages.clean_logits.clean_logits` emptied (a 0-byte stub with the original mtime):
    once, under a lock, with the stub's mtime kept so that Snakemake sees no change; the recomputed
    base PPL must equal the recorded one. False when the logits were there."""
    base_logits = Path(base_logits)
    if base_logits.stat().st_size > 0:
        return False
    if base_gguf is None or not Path(base_gguf).is_file():
        raise PipelineError(f"{what}: base logits {base_logits} were cleaned and the base GGUF {base_gguf} "
                            "to recompute them is missing")
    with open(base_logits.parent / ".base.logits.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        st = base_logits.stat()
        if st.st_size > 0:  # another job restored them meanwhile
            return False
        es = replace(es, ctx=EvalBaseRecord.read(base_record, "eval").ctx)  # ctx: long, as resolved
        with base_ids_file(tc, base_gguf, es, what, Path(log) if log else None) as (ids, _):
            _, m = _write_base_logits(tc, es, base_gguf, base_logits, threads, log, f"{what}: restoring base logits",
                                      ids=ids)
        os.utime(base_logits, ns=(st.st_atime_ns, st.st_mtime_ns))
    want = EvalBaseRecord.read(base_record, "eval").ppl
    if float(m.group(1)) != want:
        raise PipelineError(f"{what}: recomputed base logits give PPL {m.group(1)}, {base_record} says {want}: "
                            "the base GGUF or tools changed; run eval-base again (snakemake -R eval_base)")
    return True


def verdict(metrics: dict, thresholds: dict) -> list[dict]:
    """Failed gates as dicts {threshold, metric, value, limit}; empty when all pass. Fails closed: a metric that is
    missing, NaN or infinite (a run that went wrong) fails its gate, and so does a limit that is not a finite number;
    such a value is stored as None (JSON has no NaN) and ``unreadable`` says what it was."""
    failures = []
    for name, limit in sorted(thresholds.items()):
        metric, direction = METRICS[name]
        value = metrics.get(metric) if isinstance(metrics, dict) else None
        if not (finite(value) and finite(limit)):
            bad = [f"{metric} is {'missing' if value is None else repr(value)}" * (not finite(value)),
                   f"{name} is {limit!r}" * (not finite(limit))]
            failures.append({"threshold": name, "metric": metric, "value": value if finite(value) else None,
                             "limit": limit if finite(limit) else None, "unreadable": ", ".join(filter(None, bad))})
        elif (direction == "max" and value > limit) or (direction == "min" and value < limit):
            failures.append({"threshold": name, "metric": metric, "value": value, "limit": limit})
    return failures


def failure_message(recipe_name: str, quant: str, eval_set: str, f: dict) -> str:
    head = f"gate failed: recipe {recipe_name}, quant {quant}, eval set {eval_set}: "
    if "unreadable" in f:  # fails closed: no number, no pass
        return head + f"{f['unreadable']}: not a finite number, so the gate fails"
    op = ">" if f["threshold"].startswith("max_") else "<"
    return head + f"{f['metric']} = {f['value']:.6g} {op} {f['threshold']} {f['limit']:.6g}"


def eval_quant(recipe_name: str, quant_key: str, es: EvalSet, quant_gguf: str | Path, base_logits: str | Path,
               base_record: str | Path, record: str | Path, threads: int = 2, log: str | Path | None = None,
               tc: Toolchain | None = None, base_gguf: str | Path | None = None) -> dict:
    """Entry function: KL-divergence statistics of one quant vs the base logits (recomputed first from
    ``base_gguf`` when ``ggufpipe clean-logits`` emptied them).

    Thresholds are applied by the publish stage (:func:`verdict`), so changing a threshold re-judges
    without re-running llama-perplexity, and one bad quant does not stop the others."""
    tc = tc or find_toolchain()
    what = f"{recipe_name}: eval set {es.name}: {quant_key}"
    base = EvalBaseRecord.read(base_record, "eval")
    es = replace(es, ctx=base.ctx) if es.long else es  # as eval-base resolved it
    if not Path(base_logits).is_file():
        raise PipelineError(f"{what}: base logits {base_logits} are missing (run eval-base first)")
    check_kv_types(es, quant_gguf, what)  # before any run: nothing is measured half
    restore_base_logits(tc, es, base_gguf, base_logits, base_record, threads, log, what)
    metrics, res = kl_divergence(tc, es, quant_gguf, base_logits, threads, log, what)
    seconds = res.seconds
    kv = {}
    for t in es.kv_extra:  # the same quant with a quantized cache, against the f16-cache base logits
        kv[t], r = kl_divergence(tc, es, quant_gguf, base_logits, threads, log, f"{what}: KV {t}", extra=kv_args(t))
        seconds += r.seconds
    # chunk_rows: the running statistics after each chunk, the slice a device re-measures (pipeline/devices/check.py)
    rec = EvalRecord(eval_set=es.name, text=base.text, text_sha256=base.text_sha256, ctx=es.ctx, chunks=es.chunks,
                     scored_tokens=base.scored_tokens, threads=threads, metrics=metrics,
                     chunk_rows=parse_chunk_rows(res.output), seconds=round(seconds, 1), **({"kv": kv} if kv else {}))
    rec.write(record)
    return rec.to_dict()


# Block size of each quantized KV cache type llama.cpp takes (ggml's QK4_0, QK8_0, ...): a quantized K (V) cache needs
# every layer's K (V) head size to be a multiple of it (src/llama-context.cpp:3851-3871 of b11312)
KV_BLOCK = {"q8_0": 32, "q4_0": 32, "q4_1": 32, "iq4_nl": 32, "q5_0": 32, "q5_1": 32}


def kv_args(kv_type: str) -> list[str]:
    """``-ctk/-ctv`` for a KV cache type. A quantized V cache needs flash attention, which the default ``-fa auto``
    turns on (and ``-fa off`` makes an error): src/llama-context.cpp:3840-3849."""
    return ["-ctk", kv_type, "-ctv", kv_type]


def check_kv_types(es: EvalSet, gguf: str | Path, what: str) -> None:
    """Refuse, in one line naming the field, a KV type of ``es`` whose block does not divide the model's head sizes."""
    if not es.kv_extra:
        return
    s = ModelShape.from_gguf(gguf)
    heads = {h for h in (s.head_k, s.head_v, s.head_k_swa, s.head_v_swa) if h}
    for t in es.kv_extra:
        bad = sorted(h for h in heads if h % KV_BLOCK.get(t, 1))
        if bad:
            raise PipelineError(f"{what}: gates {es.name}.kv_types: {t} has blocks of {KV_BLOCK[t]}, which do not divide "
                                f"the head size {bad[0]} of {Path(gguf).name} (src/llama-context.cpp:3851-3871)")


def kl_divergence(tc: Toolchain, es: EvalSet, gguf: str | Path, base_logits: str | Path, threads: int,
                  log: str | Path | None, what: str, retries: int = LOST_LINES_RETRIES,
                  extra: list[str] = ()) -> tuple[dict, ToolResult]:
    """``llama-perplexity --kl-divergence`` of ``gguf`` against ``base_logits`` (written on ``es``): its statistics;
    ``extra``: more arguments (a KV cache type's)."""
    res = run_perplexity(tc, ["-m", gguf, *_common_args(es, threads), *extra, "--kl-divergence-base", base_logits,
                              "--kl-divergence"], Path(log) if log else None, has_kld_statistics, what, retries)
    _fail_on_tool_errors(res, what)
    _check_chunks(res.output, es, what)
    try:
        return parse_kld_statistics(res.output), res
    except PipelineError as exc:
        raise PipelineError(f"{what}: {exc}") from None


def write_base_logits(tc: Toolchain, es: EvalSet, base_gguf: str | Path, out_logits: str | Path, threads: int,
                      log: str | Path | None, what: str) -> float:
    """``llama-perplexity --kl-divergence-base`` of ``base_gguf`` on ``es`` into ``out_logits``: its PPL."""
    _, m = _write_base_logits(tc, es, base_gguf, out_logits, threads, log, what)
    return float(m.group(1))


def perplexity(tc: Toolchain, model: str | Path, text: str | Path, ctx: int, chunks: int, threads: int = 2,
               log: str | Path | None = None) -> tuple[float, float]:
    """Plain perplexity of ``model`` on ``text`` (used by tests and checks)."""
    args = ["-m", model, "-f", text, "-c", str(ctx), "--chunks", str(chunks), "-t", str(threads), "-b", str(ctx)]
    res = run_perplexity(tc, args, Path(log) if log else None, has_final_estimate, f"perplexity of {model}")
    errors = tool_errors(res.output)
    if errors:
        raise ToolError("llama-perplexity", res.returncode, log, f"llama-perplexity on {model}: {errors[0]}")
    m = _PPL_RE.search(res.output)
    if res.returncode != 0 or not m:
        raise ToolError("llama-perplexity", res.returncode, log, f"llama-perplexity on {model} printed no final estimate "
                        f"(exit {res.returncode}): {tail(res.output)}")
    return float(m.group(1)), float(m.group(2))


def gate_checks(manifest: dict) -> list[dict]:
    """Every failed check of a manifest (``check``, ``message``; ``file`` for a rejected quant's): quant gates, lost
    MTP heads, conformance, draft vocab / acceptance, devices."""
    return ([{"file": e["file"], **f} for e in manifest.get("rejected", []) for f in e.get("failures", [])]
            + [dict(f) for f in manifest.get("failures", [])])


def gate_messages(manifest: dict) -> list[str]:
    """One line per failed check of a manifest: quant gates, lost MTP heads, draft vocab / acceptance."""
    msgs = [c["message"] for c in gate_checks(manifest)]
    return list(dict.fromkeys(msgs))  # once each: a failed conformance rejects every file with one reason


def eval_fields(r, es_name: str, s) -> dict:
    """What an eval set's numbers depend on: the trigger of eval-base, eval and the device slice."""
    e = r.eval_set(es_name)
    # only where set, so that older recipes keep their triggers; a chat set's ids come from the two helpers
    extra = {"render": e.render, "helpers": helper_sources()} if e.render != "text" else {}
    return {"text": str(e.text), "ctx": e.ctx, "chunks": e.chunks, "eval_threads": s.eval_threads,
            "build": s.build_number, "offload": s.offload, **extra, **({"ctx_long": True} if e.long else {})}


def _logits_mb(s) -> int:
    e = s.recipe.eval_set(s.wc["es"])
    return mem_mb(logits_bytes(e.ctx, e.chunks, s.n_vocab("base")) / 2**20, 1.0)


def _run_eval_base(j) -> None:
    eval_base(j.recipe.name, j.recipe.eval_set(j["es"]), j.input["base"], j.output["logits"], j.output["record"],
              threads=j.threads, log=j.log)


def _run_eval(j) -> None:
    i = j.input
    eval_quant(j.recipe.name, j["quant"], j.recipe.eval_set(j["es"]), i["gguf"], i["logits"], i["base_record"],
               j.output["record"], threads=j.threads, log=j.log, base_gguf=i["base"])


EVAL_BASE = Stage(
    "eval_base", "eval-base", order=50, log="eval-{es}-base", wildcards=("es",), threads="eval_threads", capped=True,
    run=_run_eval_base, inputs=lambda r, wc, L: {"base": L.base_gguf(r)},
    outputs=lambda L: {"logits": L.base_logits("{name}", "{es}"), "record": L.base_record("{name}", "{es}")},
    trigger=lambda r, wc, s: eval_fields(r, wc["es"], s),
    resources={"mem_mb": lambda s: mem_mb(s.total, 1.3, 1024), "disk_mb": _logits_mb,
               "runtime": lambda s: int(30 + s.total / 20)},
)
EVAL = Stage(
    "eval", "eval", order=51, log="eval-{es}-{quant}", wildcards=("es", "quant"), threads="eval_threads", capped=True,
    run=_run_eval,
    inputs=lambda r, wc, L: {"gguf": L.quant(r, wc["quant"]), "logits": L.base_logits(r.name, wc["es"]),
                             "base_record": L.base_record(r.name, wc["es"]), "base": L.base_gguf(r)},
    outputs=lambda L: {"record": L.eval_record("{name}", "{es}", "{quant}")},
    trigger=lambda r, wc, s: {**eval_fields(r, wc["es"], s), **r.eval_set(wc["es"]).describe_kv()},
    # the mapped file and, for the types the CPU build repacks (Q4_K on x86-64 AVX2), a second copy: docs/planning.md
    resources={"mem_mb": lambda s: mem_mb(s.mb("gguf"), 2.2, 1024), "disk_mb": 1024,
               "runtime": lambda s: int(30 + s.mb("gguf") / 20)},
)
