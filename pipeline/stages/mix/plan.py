"""What a mix's files are made of, before anything is measured or written: tensor-type maps naming every tensor,
llama-quantize's dry run (the type each tensor is really written as), the output header and the budgets
(docs/mixes.md). Shared by the sensitivity and solve stages."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.errors import PipelineError, RecipeError, ToolError
from pipeline.gguf.reader import GGUFHeader, read_header
from pipeline.gguf.types import padded_nbytes
from pipeline.recipe import Recipe
from pipeline.stages.quant_plan import parse_dry_run, predict_header
from pipeline.stages.quantize import explain_failure
from pipeline.tools import Toolchain, run_tool

_NAME = re.compile(r"^[a-z0-9_.]+$")


def map_text(types: dict[str, str]) -> str:
    """A tensor-type map naming every tensor exactly (anchored, dots escaped), in the order given."""
    lines = []
    for name, qtype in types.items():
        if not _NAME.match(name):
            raise PipelineError(f"tensor name {name!r} has characters a map cannot name exactly")
        lines.append("^" + name.replace(".", "\\.") + "$=" + qtype.lower())
    return "\n".join(lines) + "\n"


def imatrix_args(imatrix: Path | None) -> tuple[list[str], Path | None]:
    """llama-quantize's importance-matrix arguments and the folder it runs in (the file named bare, as quantize does)."""
    if imatrix is None:
        return [], None
    return ["--imatrix", imatrix.name], imatrix.parent


def dry_run_types(tc: Toolchain, base: Path, ftype: str, args: list[str], cwd: Path | None, scratch: Path,
                  log: Path | None, where: str) -> dict[str, dict]:
    """name -> {shape, source, type, quantized} from ``llama-quantize --dry-run`` (it writes no file)."""
    res = run_tool(tc, "llama-quantize", ["--dry-run", *args, base, scratch / "dry-run.gguf", ftype, "1"], log,
                   check=False, cwd=cwd)
    if res.returncode != 0:
        raise ToolError("llama-quantize", res.returncode, log,
                        f"{where}: llama-quantize --dry-run failed: {explain_failure(res.output)}")
    tensors, _ = parse_dry_run(res.output)
    if not tensors:
        raise PipelineError(f"{where}: llama-quantize --dry-run listed no tensor (its output format changed?)")
    return tensors


def header_bytes(base: GGUFHeader, imatrix: Path | None) -> int:
    return predict_header(base, imatrix.name if imatrix else None,
                          read_header(imatrix) if imatrix else None)


def budget_bytes(q, data: dict, base: Path, header: int, alignment: int, imatrix: Path | None, tc: Toolchain,
                 scratch: Path, log, where: str) -> int:
    """The largest file (bytes) quant ``q``'s budget allows (``header``: the output header's bytes, :func:`header_bytes`;
    ``alignment``: the base file's)."""
    kind, value = q.mix.budget
    if kind == "max_mb":
        return int(value * 1_000_000)
    if kind == "bpw":
        return header + int(value * data["n_weights"] / 8)
    args, cwd = imatrix_args(imatrix)
    tensors = dry_run_types(tc, base, value, args, cwd, scratch, log, f"{where}: budget size_of {value}")
    return header + sum(padded_nbytes(t["type"], t["shape"], alignment) for t in tensors.values())


def check_budgets(recipe: Recipe, flavour: str, data: dict, base: Path, header: int, alignment: int,
                  imatrix: Path | None, tc: Toolchain, scratch: Path, log) -> None:
    """Refuse, before anything is measured, a mix whose budget is below its all-smallest file."""
    for q in recipe.quants:
        if not (q.mix and q.flavour == flavour and q.mix.budget):
            continue
        where = f"{recipe.path}: quant {q.key}"
        smallest = header + data["kept_bytes"] + sum(
            min(padded_nbytes(t["types"][c], t["shape"], alignment) for c in (data["floor"], *q.mix.candidates))
            for t in data["tensors"].values())
        limit = budget_bytes(q, data, base, header, alignment, imatrix, tc, scratch, log, where)
        if limit < smallest:
            kind, value = q.mix.budget
            raise PipelineError(f"{where}: budget {kind} {value} allows {limit} bytes, below the smallest mix of its "
                                f"candidates ({smallest} bytes, every group at its smallest type)")


def check_expert_candidates(recipe: Recipe, flavour: str, types: dict[str, dict[str, str]], groups,
                            shapes: dict[str, list[int]]) -> None:
    """Refuse, before anything is measured, a mix candidate llama-quantize cannot write for a group of routed experts
    (``*_exps``): rows its block does not divide fall back to another type (src/llama-quant.cpp:400-440), and the
    experts being most of a mixture's bytes, the mix would not choose what its candidates name."""
    for i, q in enumerate(recipe.quants):
        if not (q.mix and q.flavour == flavour):
            continue
        for c in q.mix.candidates:
            for g in groups:
                if not g.role.endswith("_exps") or any(types[c][n] == c for n in g.tensors):
                    continue
                n = g.tensors[0]
                raise RecipeError(recipe.path, f"quants[{i}].candidates", f"{c} cannot be written for the expert "
                                  f"tensors: llama-quantize writes {n} (rows of {shapes[n][0]}) as {types[c][n]} "
                                  f"(shape fallback, src/llama-quant.cpp:400-440); leave {c} out of the candidates")
