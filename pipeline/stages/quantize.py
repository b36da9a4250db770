"""Stage quantize: one ``llama-quantize`` run per requested quant, from the F16/BF16 GGUF."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

from pipeline.errors import PipelineError, RecipeError, ToolError
from pipeline.fsutil import atomic_output, sha256_file
from pipeline.gguf.reader import read_header
from pipeline.recipe import Recipe
from pipeline.recipe.tensor_map import read_map
from pipeline.records import MixLayoutRecord, QuantRecord
from pipeline.stagedef import Stage, mem_mb
from pipeline.stages.imatrix_coverage import imatrix_mismatch
from pipeline.stages.quant_plan import check_patterns, check_written, parse_dry_run, plan, predict_header
from pipeline.tools import Toolchain, find_toolchain, run_tool, tail

# Free space below which a failed write is taken for a full disk (writes fail only once it is all but gone).
FULL_DISK_BYTES = 16 << 20


def free_bytes(folder: Path) -> int:
    try:
        st = os.statvfs(folder)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


def explain_failure(output: str, out_gguf: Path | None = None) -> str:
    if "requires an importance matrix" in output or "requires an imatrix" in output:
        return "this quant type needs an importance matrix (add an imatrix to the recipe)"
    # llama-quantize writes with std::ofstream: a full disk shows as "basic_ios::clear: iostream error"
    write_failed = re.search(r"No space left on device|failed to write|write error|iostream error", output, re.I)
    if write_failed and out_gguf is not None:
        free = free_bytes(out_gguf.parent)
        if "No space left" in output or 0 <= free < FULL_DISK_BYTES:
            return (f"no space left on device writing {out_gguf} ({free} bytes free in {out_gguf.parent}); "
                    "free some space or put work/ on a larger disk")
        return f"cannot write {out_gguf}: {write_failed.group(0)}"
    if write_failed:
        return "no space left on device while writing the quant"
    m = re.search(r"invalid (?:output tensor|token embedding|tensor) type[^\n]*|[^\n]*unknown ggml type[^\n]*", output, re.I)
    if m:
        return m.group(0).strip()
    return tail(output)


def dry_run(tc: Toolchain, q, args: list[str], base_gguf: Path, out_gguf: Path, threads: int, log, cwd,
            where: str) -> dict:
    """``llama-quantize --dry-run`` with the real run's arguments (it writes nothing): the recipe's patterns
    checked against the base file's tensors, and the plan (pipeline/stages/quant_plan.py)."""
    res = run_tool(tc, "llama-quantize", ["--dry-run", *args, base_gguf, out_gguf, q.type, str(max(1, threads))],
                   Path(log) if log else None, check=False, cwd=cwd)
    if res.returncode != 0:
        raise ToolError("llama-quantize", res.returncode, log, f"{where}: llama-quantize --dry-run failed: "
                        f"{explain_failure(res.output)}" + (f" [log: {log}]" if log else ""))
    tensors, _ = parse_dry_run(res.output)
    check_patterns(q.tensor_patterns(), list(tensors), where)
    return plan(q, res.output, where)


def _with_map(recipe: Recipe, key: str, q, map_path: Path, layout_path: Path):
    """A mix as the quant its solved map makes it (``tensor_types_file``), and its layout record."""
    where = f"{recipe.path}: quantize {key}"
    try:
        entries = read_map(map_path)
        layout = MixLayoutRecord.parse(layout_path).to_dict()
    except (OSError, ValueError) as exc:
        raise PipelineError(f"{where}: the solved map or layout is unreadable (run solve again): {exc}") from None
    if layout.get("map_sha256") != sha256_file(map_path):
        raise PipelineError(f"{where}: {map_path.name} is not the map {layout_path.name} records (run solve again)")
    return replace(q, tensor_types_file=map_path, tensor_map=entries), layout


def quantize(recipe: Recipe, key: str, base_gguf: str | Path, out_gguf: str | Path, record: str | Path,
             log: str | Path | None = None, threads: int = 1, tc: Toolchain | None = None,
             imatrix: str | Path | None = None, mix: tuple[str | Path, str | Path] | None = None) -> dict:
    """Entry function: quantize ``base_gguf`` to ``out_gguf`` as the recipe's quant ``key``
    (with the importance matrix ``imatrix`` when the quant uses one; a mix with its solved ``(map, layout)``)."""
    tc = tc or find_toolchain()
    q = recipe.quant(key)
    layout = None
    if q.mix:
        if mix is None:
            raise PipelineError(f"{recipe.path}: quantize {key}: this quant is a mix, its solved map was not given")
        q, layout = _with_map(recipe, key, q, Path(mix[0]), Path(mix[1]))
    base_gguf, out_gguf, record = Path(base_gguf).resolve(), Path(out_gguf), Path(record)
    if q.tensor_types_file:  # llama-quantize may run beside the matrix: no path relative to the build folder
        q = replace(q, tensor_types_file=Path(q.tensor_types_file).resolve())
    if not base_gguf.is_file():
        raise PipelineError(f"{recipe.path}: quantize {key}: {base_gguf} is missing (run convert first)")
    if q.imatrix and imatrix is None:
        raise PipelineError(f"{recipe.path}: quantize {key}: this quant uses the importance matrix, none was given")
    args = q.quantize_args()
    cwd = None
    base_header, im_header = read_header(base_gguf), None
    if q.imatrix:
        imatrix = Path(imatrix).resolve()
        if not imatrix.is_file():
            raise PipelineError(f"{recipe.path}: quantize {key}: importance matrix {imatrix} is missing (run imatrix first)")
        # run beside the matrix and name it bare: llama-quantize records the name it was given in the
        # GGUF (quantize.imatrix.file), which must not depend on the build folder
        args += ["--imatrix", imatrix.name]
        cwd = imatrix.parent
        im_header = read_header(imatrix)
        problem = imatrix_mismatch(base_header, im_header)
        if problem:
            index = next((i for i, x in enumerate(recipe.quants) if x.key == key), key)
            raise RecipeError(recipe.path, f"quants[{index}].imatrix", f"{imatrix.name} is not an importance matrix "
                              f"of {base_gguf.name}: {problem}")
    where = f"{recipe.path}: quantize {key}"
    planned = dry_run(tc, q, args, base_gguf, out_gguf, threads, log, cwd, where)
    header = predict_header(base_header, imatrix.name if q.imatrix else None, im_header)
    with atomic_output(out_gguf) as tmp:
        res = run_tool(tc, "llama-quantize", [*args, base_gguf, tmp.resolve(), q.type, str(max(1, threads))],
                       Path(log) if log else None, check=False, cwd=cwd)
        if res.returncode != 0 or not tmp.is_file():
            raise ToolError("llama-quantize", res.returncode, log, f"{where}: llama-quantize failed: "
                            f"{explain_failure(res.output, out_gguf)}" + (f" [log: {log}]" if log else ""))
        size = check_written(planned, header, read_header(tmp), where)  # a file unlike its plan is never renamed
        if layout and size["written"] != layout["predicted"]["bytes"]:
            raise PipelineError(f"{where}: {size['written']} bytes written, the solve predicted "
                                f"{layout['predicted']['bytes']}")
    rec = QuantRecord(quant=q.describe(), base=q.base, tool="llama-quantize", toolchain=tc.describe(),
                      seconds=round(res.seconds, 1),
                      tensor_types={"histogram": planned["histogram"], "differs": planned["differs"], "bytes": size})
    if q.tensor_types_file:
        rec.tensor_types_file = {"file": q.tensor_types_file.name, "sha256": sha256_file(q.tensor_types_file)}
    if q.imatrix:
        rec.imatrix_sha256 = sha256_file(imatrix)
    if layout:
        rec.mix = layout
    rec.write(record)
    return rec.to_dict()


def _run(j) -> None:
    i = j.input
    quantize(j.recipe, j["quant"], i["base"], j.output["gguf"], j.output["record"], log=j.log, threads=j.threads,
             imatrix=i.get("imatrix"), mix=(i["map"], i["layout"]) if "map" in i else None)


def _trigger(r, wc, s) -> dict:
    q = r.quant(wc["quant"])
    return {"type": q.type, "args": q.quantize_args(), "build": s.build_number, "commit": s.commit, "base": q.base,
            "imatrix": q.imatrix, "map": sha256_file(q.tensor_types_file) if q.tensor_types_file else None}


STAGE = Stage(
    "quantize", "quantize", order=45, log="quantize-{quant}", wildcards=("quant",), threads="threads", capped=True,
    run=_run, inputs=lambda r, wc, L: L.quant_inputs(r, wc["quant"]),
    outputs=lambda L: {"gguf": L.gguf("{name}", "{quant}"), "record": L.quant_record("{name}", "{quant}")},
    trigger=_trigger,
    resources={"mem_mb": lambda s: mem_mb(s.total, 1.2), "disk_mb": lambda s: mem_mb(s.total, 1.0),
               "runtime": lambda s: int(20 + s.total / 200)},
)
