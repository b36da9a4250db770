"""Stage imatrix: ``llama-imatrix`` over the recipe's calibration text, once per base GGUF.

The importance matrix is computed on the base file the quants are made from (the plain F16, or the
AWQ-scaled one: AWQ's folded scales change the activations the matrix weighs). The calibration
text is handed to the tool under its bare file name (run from a scratch folder), so that the
dataset name the imatrix records, and that llama-quantize copies into every quant
(``quantize.imatrix.dataset``), does not depend on where the build box keeps the recipe.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pipeline.errors import PipelineError, RecipeError, ToolError
from pipeline.fsutil import atomic_output, sha256_file
from pipeline.gguf import read_header
from pipeline.recipe import Recipe
from pipeline.records import ImatrixRecord
from pipeline.stagedef import Stage, mem_mb
from pipeline.stages.eval_sets import render_conversations, tokenize_special
from pipeline.stages.evaluate import count_tokens
from pipeline.stages.imatrix_coverage import coverage, coverage_failures, expert_counts
from pipeline.tools import Toolchain, find_toolchain, helper_sources, run_tool, tail


def imatrix_facts(path: str | Path) -> dict:
    """What an imatrix GGUF says about itself: datasets, chunks, chunk size, entries (tensors)."""
    r = read_header(path)
    datasets = r.get("imatrix.datasets")
    return {
        "datasets": list(datasets) if isinstance(datasets, (list, tuple)) else [datasets] if datasets else [],
        "chunk_count": r.get("imatrix.chunk_count"),
        "chunk_size": r.get("imatrix.chunk_size"),
        "entries": sum(1 for t in r.tensors if t.name.endswith(".in_sum2")),
    }


def run_imatrix(tc: Toolchain, base_gguf: str | Path, text: str | Path, out: Path, ctx: int, chunks: int,
                threads: int, log: Path | None, where: str, cwd: str | Path | None = None, special: bool = False):
    """``llama-imatrix`` of ``base_gguf`` over ``chunks`` x ``ctx`` tokens of ``text`` into ``out`` (GGUF format);
    the tool's result. A failure, or no file written, raises one line starting with ``where``. ``special``: the
    text is chat-rendered, its special tokens are parsed (``--parse-special``, common/arg.cpp:3206-3211)."""
    args = ["-m", base_gguf, "-f", text, "-o", out.resolve(), "--output-format", "gguf", "-c", ctx,
            "--chunks", chunks, "-b", ctx, "-t", max(1, threads), "-ofreq", 1 << 30, *(["--parse-special"] * special)]
    res = run_tool(tc, "llama-imatrix", args, log, check=False, cwd=cwd)
    if res.returncode != 0 or not out.is_file():
        raise ToolError("llama-imatrix", res.returncode, log, f"{where}: llama-imatrix failed: {tail(res.output)}"
                        + (f" [log: {log}]" if log else ""))
    return res


def imatrix(recipe: Recipe, base: str, base_gguf: str | Path, out: str | Path, record: str | Path,
            log: str | Path | None = None, threads: int = 2, tc: Toolchain | None = None) -> dict:
    """Entry function: compute the importance matrix of ``base_gguf`` into ``out`` (GGUF format)."""
    tc = tc or find_toolchain()
    cfg = recipe.imatrix
    if cfg is None:
        raise PipelineError(f"{recipe.path}: imatrix: the recipe has no imatrix section")
    base_gguf, out, record = Path(base_gguf).resolve(), Path(out), Path(record)
    log = Path(log) if log else None
    if not base_gguf.is_file():
        raise PipelineError(f"{recipe.path}: imatrix: {base_gguf} is missing (run convert first)")
    text = cfg.calibration
    if not text.is_file():
        raise RecipeError(recipe.path, "imatrix.calibration", f"{text} does not exist")
    rendered = render = None
    if cfg.render == "chat":  # the conversations as the model's template renders them, specials parsed
        prompts, render, specials = render_conversations(tc, base_gguf, text, f"{recipe.path}: imatrix", log)
        rendered = "".join(prompts)
        (ids,) = tokenize_special(tc, base_gguf, [rendered], add_special=True, log=log)  # as llama-imatrix does
        n_tokens = len(ids)
        render.update(tokens=n_tokens, special_tokens=sum(1 for i in ids if i in specials))
    else:
        n_tokens = count_tokens(tc, base_gguf, text, log)
    need = cfg.ctx * cfg.chunks
    if n_tokens < need:
        raise RecipeError(recipe.path, "imatrix.calibration", f"{text.name} has {n_tokens} tokens, fewer than ctx x "
                          f"chunks = {cfg.ctx} x {cfg.chunks} = {need}; use a longer text or lower imatrix.chunks")
    with tempfile.TemporaryDirectory(prefix="ggufpipe-imatrix-") as scratch, atomic_output(out) as tmp:
        if rendered is None:
            (Path(scratch) / text.name).symlink_to(text)
        else:  # under the conversations' own name: the dataset name the imatrix and every quant record
            (Path(scratch) / text.name).write_text(rendered, encoding="utf-8")
        res = run_imatrix(tc, base_gguf, text.name, tmp, cfg.ctx, cfg.chunks, threads, log,
                          f"{recipe.path}: imatrix ({base})", cwd=scratch, special=rendered is not None)
        facts = imatrix_facts(tmp)
        experts = coverage(expert_counts(tmp), cfg.min_expert_tokens)
        failed = coverage_failures(experts, cfg.min_expert_coverage, cfg.min_expert_tokens,
                                   f"{recipe.path}: imatrix ({base}, {text.name})")
        if failed:  # raised inside the block: the imatrix is not kept
            more = f" (and {len(failed) - 1} more layer(s))" if len(failed) > 1 else ""
            raise PipelineError(failed[0] + more)
    if facts["chunk_count"] != cfg.chunks:
        raise PipelineError(f"{recipe.path}: imatrix ({base}): llama-imatrix processed {facts['chunk_count']} chunks, "
                            f"not the {cfg.chunks} asked for")
    rec = ImatrixRecord(base=base, params=cfg.describe(), calibration_sha256=sha256_file(text),
                        calibration_tokens=n_tokens, sha256=sha256_file(out), facts=facts, tool="llama-imatrix",
                        toolchain=tc.describe(), threads=threads, seconds=round(res.seconds, 1),
                        **({"experts": experts} if experts else {}), **({"render": render} if render else {}))
    rec.write(record)
    return rec.to_dict()


STAGE = Stage(
    "imatrix", "imatrix", order=35, log="imatrix-{base}", wildcards=("base",), threads="calib_threads",
    run=lambda j: imatrix(j.recipe, j["base"], j.input["base"], j.output["imatrix"], j.output["record"], log=j.log,
                          threads=j.threads),
    inputs=lambda r, wc, L: {"base": L.source_gguf(r, wc["base"]), "text": r.imatrix.calibration},
    outputs=lambda L: {"imatrix": L.imatrix("{name}", "{base}"), "record": L.imatrix_record("{name}", "{base}")},
    trigger=lambda r, wc, s: {"imatrix": r.imatrix.describe(), "calib_threads": s.calib_threads,
                              "build": s.build_number, "offload": s.offload,
                              **({"helpers": helper_sources()} if r.imatrix.render != "text" else {})},
    resources={"mem_mb": lambda s: mem_mb(s.total, 1.3, 1024), "disk_mb": 1024,
               "runtime": lambda s: int(30 + s.total / 10)},
)
