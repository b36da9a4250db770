"""Stage split: a model file cut into ``llama-gguf-split`` shards (recipe ``split:``), and the shard checks
shared by the publish stage and ``verify`` (standard library: the GGUF header reader).

The split stage reads the whole file in
``work/<name>/quants/``; it writes ``work/<name>/split/<name>-<KEY>/<name>-<KEY>-0000i-of-0000N.gguf`` (the
tool's own naming, ``llama_split_path``), which the publish stage hard-links into
``artifacts/<name>/<name>-<KEY>/``. llama.cpp loads a split model from its first shard with the others
beside it. The shards are written into a hidden temporary folder, checked, and the folder is renamed
into place: a failed or killed split leaves no folder that looks finished.

``max_size`` is llama-gguf-split's ``--split-max-size``: the most tensor data per shard (the first shard
also carries all the metadata). A shard holds whole tensors, so a tensor larger than ``max_size`` is
refused here with one line naming the recipe field (the tool would write an oversized shard, or fail
without saying why when it is the first tensor). A file smaller than ``max_size`` is one shard,
``-00001-of-00001.gguf``: whether a file is published split depends on the recipe only, never on its size.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.errors import PipelineError, RecipeError, ToolError
from pipeline.fsutil import atomic_output
from pipeline.gguf import GGUFHeader, read_header
from pipeline.stagedef import Stage, mem_mb
from pipeline.tools import find_toolchain, run_tool, tail

SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def shard_name(stem: str, no: int, count: int) -> str:
    """``<stem>-0000<no>-of-0000<count>.gguf`` (``no`` from 1), as llama.cpp's ``llama_split_path``."""
    return f"{stem}-{no:05d}-of-{count:05d}.gguf"


def shard_header(path: str | Path) -> dict:
    """The split keys and tensor count of one shard; raises (one line) on an unreadable or truncated file
    (:func:`pipeline.gguf.read_header`: the checks llama.cpp makes before loading)."""
    h = read_header(path)
    m = h.metadata
    return {"no": m.get("split.no"), "count": m.get("split.count"), "tensors_total": m.get("split.tensors.count"),
            "tensor_count": len(h.tensors), "file_type": m.get("general.file_type"), "header": h}


def check_header(path: Path, h: dict, no: int, count: int, tensors_total: int) -> None:
    """Fail (one line naming the shard) unless its split keys say shard ``no`` (from 1) of ``count`` of a
    model of ``tensors_total`` tensors."""
    got = (h["no"], h["count"], h["tensors_total"])
    if got != (no - 1, count, tensors_total):
        raise PipelineError(f"{path}: split.no/split.count/split.tensors.count say {got[0]}/{got[1]}/{got[2]}, expected "
                            f"{no - 1}/{count}/{tensors_total} (shard {no} of {count} of a {tensors_total}-tensor model)")


def read_shards(folder: str | Path, stem: str, tensor_count: int) -> list[tuple[Path, dict]]:
    """The shards of ``stem`` in ``folder``, checked as a set: exactly ``<stem>-0000i-of-0000N.gguf`` for
    i = 1..N and nothing else (hidden files aside: Snakemake marks a folder output with
    ``.snakemake_timestamp``), each a readable GGUF whose split keys agree, with ``tensor_count`` tensors
    in all. Returns ``[(path, header)]`` in shard order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PipelineError(f"{folder}: missing (no shards)")
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    counts = {int(m["count"]) for n in names if (m := SHARD_RE.match(n)) and m["stem"] == stem}
    if len(counts) != 1:
        raise PipelineError(f"{folder}: expected the shards {stem}-0000i-of-0000N.gguf of one split, found "
                            f"{', '.join(names) or 'nothing'}")
    count = counts.pop()
    want = [shard_name(stem, i, count) for i in range(1, count + 1)]
    if names != want:
        odd = sorted(set(names) ^ set(want))
        raise PipelineError(f"{folder}: shards of {stem} do not match a {count}-shard split ({', '.join(odd[:3])} "
                            "missing or unexpected)")
    out, total = [], 0
    for i, name in enumerate(want, 1):
        path = folder / name
        h = shard_header(path)
        check_header(path, h, i, count, tensor_count)
        total += h["tensor_count"]
        out.append((path, h))
    if total != tensor_count:
        raise PipelineError(f"{folder}: the shards hold {total} tensors, the whole file {tensor_count}")
    return out


def oversized_tensor(h: GGUFHeader, max_bytes: int) -> tuple[str, int] | None:
    """The first tensor whose (aligned) data exceeds ``max_bytes``: no shard could hold it."""
    for t in h.tensors:
        n = -(-t.n_bytes // h.alignment) * h.alignment
        if n > max_bytes:
            return t.name, n
    return None


def split(recipe, key: str, in_gguf: str | Path, out_dir: str | Path, log: str | Path | None = None, tc=None) -> list[dict]:
    """Entry function: cut ``in_gguf`` (file ``key`` of ``recipe``) into shards in the folder ``out_dir``
    with llama-gguf-split, as ``recipe.split_for(key)`` says. Returns ``[{file, size_bytes, tensor_count}]``."""
    cfg = recipe.split_for(key)
    if cfg is None:
        raise PipelineError(f"{recipe.path}: {recipe.file_for(key)} is not split by this recipe (no `split:` for {key})")
    in_gguf, out_dir = Path(in_gguf).resolve(), Path(out_dir)
    if not in_gguf.is_file():
        raise PipelineError(f"{recipe.path}: split {key}: {in_gguf} is missing (build it first)")
    whole = read_header(in_gguf)
    big = oversized_tensor(whole, cfg.max_bytes)
    if big:
        raise RecipeError(recipe.path, f"{cfg.where}.max_size", f"{cfg.max_size} ({cfg.max_bytes} bytes) is smaller than "
                          f"tensor {big[0]} of {in_gguf.name} ({big[1]} bytes); a shard holds whole tensors: raise max_size")
    tensor_count = len(whole.tensors)
    stem = in_gguf.name[: -len(".gguf")]
    tc = tc or find_toolchain()
    with atomic_output(out_dir) as tmp:
        tmp.mkdir()
        res = run_tool(tc, "llama-gguf-split", [*cfg.args(), in_gguf, tmp.resolve() / stem],
                       Path(log) if log else None, check=False)
        if res.returncode != 0:
            raise ToolError("llama-gguf-split", res.returncode, log, f"{recipe.path}: split {key}: llama-gguf-split failed "
                            f"(exit {res.returncode}): {tail(res.output)}" + (f" [log: {log}]" if log else ""))
        shards = read_shards(tmp, stem, tensor_count)
        out = [{"file": p.name, "size_bytes": p.stat().st_size, "tensor_count": h["tensor_count"]} for p, h in shards]
    return out


def model_path(entry: dict) -> str:
    """What llama.cpp is given for a manifest artifact, relative to the artifact folder: the file, or the
    first shard of a split file (llama.cpp finds the others beside it)."""
    s = entry.get("split")
    return f"{entry['file']}/{s['shards'][0]['file']}" if s else entry["file"]


def _trigger(r, wc, s) -> dict:
    sp = r.split_for(wc["skey"])
    return {"split": sp.args() if sp else None, "build": s.build_number, "commit": s.commit}


STAGE = Stage(
    "split", "split", order=47, log="split-{skey}", wildcards=("skey",), directories=("shards",),
    run=lambda j: split(j.recipe, j["skey"], j.input["gguf"], j.output["shards"], log=j.log),
    inputs=lambda r, wc, L: {"gguf": L.gguf(r.name, wc["skey"])},
    outputs=lambda L: {"shards": L.split_dir("{name}", "{skey}")}, trigger=_trigger,
    resources={"mem_mb": 1024, "disk_mb": lambda s: mem_mb(s.total, 1.0), "runtime": lambda s: int(10 + s.total / 200)},
)
