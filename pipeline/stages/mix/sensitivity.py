"""Stage sensitivity: how much each tensor group costs in quality at each candidate type (docs/mixes.md).

For one flavour (base GGUF, with or without the importance matrix) of a recipe's mixes:

1. the plain base file's logits on the recipe's own ``sensitivity.text`` (never a gate text: the recipe loader
   refuses it), ``llama-perplexity --kl-divergence-base``;
2. ``llama-quantize --dry-run`` per candidate and for the floor, with a map putting every quantized tensor at that
   type: the type each tensor is really written as (shape fallback included), hence each group's exact bytes;
3. ``search: exhaustive``: the floor file (every quantized tensor at ``sensitivity.floor``), then for every group and
   candidate a file where only that group is at the candidate: ``llama-quantize --tensor-type-file`` and
   ``llama-perplexity --kl-divergence`` against 1. A candidate that writes a group exactly as the floor or as an
   earlier candidate does is not measured again. ``search: screened``: a few such files calibrate each tensor's
   screened quantization error, which predicts the rest (pipeline/stages/mix/screen.py); ``search: fisher``: the
   same with the error weighted by a diagonal Fisher from one torch pass over the HF checkpoint
   (pipeline/stages/mix/fisher.py) and type probes for every role.

Every measurement is cached under ``work/<name>/mix/<flavour>/runs/`` by the SHA256 of everything that decides it
(base, reference and importance matrix, the map's text, the text, ctx, chunks, threads, tools): adding a candidate
measures only what is new, and the solve stage never measures. The JSON written holds no time (a rebuild reproduces it byte
for byte); seconds and counts go to the stage record.
"""

from __future__ import annotations

import hashlib
import json
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import PipelineError, ToolError
from pipeline.fsutil import atomic_output, sha256_file, write_json_atomic
from pipeline.gguf.reader import GGUFHeader, read_header
from pipeline.gguf.types import padded_nbytes
from pipeline.recipe import EvalSet, Recipe
from pipeline.records import SensitivityRecord
from pipeline.stagedef import Stage, mem_mb
from pipeline.stages.evaluate import check_text, kl_divergence, write_base_logits
from pipeline.stages.imatrix import run_imatrix
from pipeline.stages.mix.fisher import FISHER_VERSION, diagonal_fisher, fisher_key
from pipeline.stages.mix.groups import Group, bands, group_tensors
from pipeline.stages.mix.plan import (
    check_budgets,
    check_expert_candidates,
    dry_run_types,
    header_bytes,
    imatrix_args,
    map_text,
)
from pipeline.stages.mix.screen import (
    FISHER_CHARGE,
    SCREEN_VERSION,
    SEARCH_VERSION,
    column_importance,
    exhaustive_runs,
    screened_cap,
    screened_search,
    weight_errors,
)
from pipeline.stages.quantize import explain_failure
from pipeline.tools import Toolchain, find_toolchain, run_helper, run_tool

VERSION = 1
# llama-quantize's type argument for every measurement: patterns apply only under a quantized type
# (src/llama-quant.cpp:746, `if (ggml_is_quantized(default_type))`), and a map naming every quantized tensor leaves
# its heuristics nothing to choose (line 764).
MEASURE_FTYPE = "Q8_0"
# the statistics kept per measurement
KEPT = ("kld_mean", "kld_p99", "same_top_p", "ppl_ratio")
# Re-runs of a measurement whose output lost its final lines (pipeline/stages/evaluate.py): a sensitivity runs
# llama-perplexity a hundred times and more, and on a small file that exits at once, on a loaded machine, half of
# the runs lost them (measured: 30 of 88 runs of the 2-layer test model while two other builds ran). A re-run of a
# file that small costs a fraction of a second; on the demo (135M) no run lost them.
RETRIES = 20


def written_types(tc, base, names, qtype, imatrix, scratch, log, where) -> dict[str, str]:
    """The type each of ``names`` is written as when a map asks ``qtype`` for all of them."""
    mp = scratch / f"all-{qtype.lower()}.map"
    mp.write_text(map_text(dict.fromkeys(names, qtype)))
    args, cwd = imatrix_args(imatrix)
    tensors = dry_run_types(tc, base, MEASURE_FTYPE, [*args, "--tensor-type-file", str(mp.resolve())], cwd, scratch,
                            log, where)
    return {n: tensors[n]["type"] for n in names}


def sensitivity(recipe: Recipe, flavour: str, base_gguf: str | Path, ref_gguf: str | Path, out_json: str | Path,
                record: str | Path, scratch: str | Path, imatrix: str | Path | None = None, threads: int = 2,
                log: str | Path | None = None, tc: Toolchain | None = None, hf: str | Path | None = None) -> dict:
    """Entry function: the sensitivity of ``base_gguf`` (flavour ``plain``, ``awq``, ``…-imatrix``) per tensor group
    and candidate, against the logits of ``ref_gguf`` (the plain base file) on ``recipe.sensitivity.text``; ``hf``:
    the checkpoint ``base_gguf`` was converted from (``search: fisher`` only)."""
    tc = tc or find_toolchain()
    s = recipe.sensitivity
    where = f"{recipe.path}: sensitivity {flavour}"
    if s is None:
        raise PipelineError(f"{where}: the recipe has no `sensitivity:` section")
    cands = recipe.mix_candidates(flavour)
    if not cands:
        raise PipelineError(f"{where}: no mix of the recipe is of this flavour")
    base, ref = Path(base_gguf).resolve(), Path(ref_gguf).resolve()
    im = Path(imatrix).resolve() if imatrix else None
    scratch = Path(scratch)
    (scratch / "runs").mkdir(parents=True, exist_ok=True)
    logp = Path(log) if log else None
    es = EvalSet(name="sensitivity", text=s.text, ctx=s.ctx, chunks=s.chunks, text_sha256=s.text_sha256)
    text_sha = check_text(es, where)
    t0 = time.monotonic()

    # 1. the reference logits, reused while the reference file and the text are those they were made from
    ref_sha = sha256_file(ref)
    base_sha = ref_sha if base == ref else sha256_file(base)  # the plain flavour measures the reference itself
    logits = _reference_logits(tc, es, ref, ref_sha, text_sha, threads, scratch, logp, flavour, where)
    # 2. what each candidate writes, per tensor
    plan = _plan(tc, base, im, (s.floor, *cands), s.bands, scratch, logp, where)
    check_expert_candidates(recipe, flavour, plan.types, plan.groups, plan.shapes)
    data = _describe(flavour, base, base_sha, ref, ref_sha, im, es, text_sha, threads, s.floor, cands, s.bands, plan)
    check_budgets(recipe, flavour, data, base, header_bytes(plan.header, im), plan.header.alignment, im, tc, scratch,
                  logp)  # before any measurement
    # 3. the floor, then each group at each candidate
    measure = _Measurer(tc, es, base, im, logits, scratch, threads, logp, where,
                        (base_sha, ref_sha, data["imatrix_sha256"]), text_sha)
    cpu0 = _cpu_seconds()
    n_total = exhaustive_runs(plan.groups, plan.types, s.floor, cands)
    if s.search == "exhaustive":
        floor, out_groups = _measure_all(measure, plan, s.floor, cands, flavour)
    else:
        fisher = s.search == "fisher"
        if fisher and hf is None:
            raise PipelineError(f"{where}: search: fisher needs the HF checkpoint the base file was converted from")
        errors = _screen_errors(measure, plan, s.floor, cands, base, base_sha, es, text_sha, flavour,
                                (Path(hf), recipe.source.trust_remote_code) if fisher else None)
        floor, out_groups, segs, probes = screened_search(measure, plan, s.floor, cands, flavour, errors,
                                                          screened_cap(n_total, FISHER_CHARGE if fisher else 1),
                                                          probe_all=fisher)
        data["segments"] = [sg.describe() for sg in segs]
        data["probes"] = probes
    data["search"] = s.search
    data["floor_kld"] = floor
    data["groups"] = out_groups
    write_json_atomic(out_json, data)
    measure.cost["cpu_seconds"] = _cpu_seconds() - cpu0
    _write_record(record, flavour, data, len(plan.groups), len(cands), n_total, measure.cost, t0, out_json)
    return data


def _cpu_seconds() -> float:
    """CPU seconds of this process and of the tools it ran and waited for."""
    own, tools = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + tools.ru_utime + tools.ru_stime


def _screen_errors(measure: _Measurer, plan: _Plan, floor_type: str, cands: tuple[str, ...], base: Path,
                   base_sha: str, es: EvalSet, text_sha: str, flavour: str,
                   fisher_from: tuple[Path, bool] | None = None) -> dict[str, dict[str, float]]:
    """type -> tensor -> screened error (pipeline/stages/mix/screen.py): weighted by the importance from one
    llama-imatrix pass on the sensitivity text, or with ``fisher_from`` (HF checkpoint, trust_remote_code) by a
    diagonal Fisher (pipeline/stages/mix/fisher.py); then one whole-model quantize per distinct written form. The
    importance matrix and each type's errors are cached by their keys; the Fisher estimate (a float per weight) is
    recomputed when a type's errors are not."""
    folder = measure.scratch / "screen"
    folder.mkdir(exist_ok=True)
    tools = [measure.tc.build_number, measure.tc.commit]
    weights: dict = {}
    if fisher_from is None:
        w_key = hashlib.sha256(json.dumps([base_sha, text_sha, es.ctx, es.chunks, measure.threads, *tools])
                               .encode()).hexdigest()
        im = folder / f"{w_key[:16]}.imatrix"
        if not im.is_file():
            print(f"[sensitivity {flavour}] screen: llama-imatrix on {es.text.name} ({es.chunks} x {es.ctx})",
                  flush=True)
            with atomic_output(im) as tmp:
                run_imatrix(measure.tc, base, es.text, tmp, es.ctx, es.chunks, measure.threads, measure.logp,
                            f"{measure.where}: screen")
            measure.cost["imatrix_passes"] += 1
        weights["importance"] = column_importance(im)
    else:
        w_key = ["fisher", fisher_key(base_sha, text_sha, es.ctx, es.chunks, measure.threads)]
        measure.cost.update(fisher_passes=0, fisher_seconds=0.0)

    def fisher() -> dict:
        if "fisher" not in weights:
            print(f"[sensitivity {flavour}] screen: Fisher pass of {fisher_from[0]} on {es.text.name} "
                  f"({es.chunks} x {es.ctx})", flush=True)
            t = time.monotonic()
            ids, bos = _perplexity_tokens(measure.tc, base, es.text.read_text(encoding="utf-8"), measure.logp)
            weights["fisher"] = diagonal_fisher(fisher_from[0], base, plan.quantized, ids, bos, es.ctx, es.chunks,
                                                measure.threads, fisher_from[1], f"{measure.where}: fisher")
            measure.cost["fisher_seconds"] += time.monotonic() - t
            measure.cost["fisher_passes"] += 1
        return weights["fisher"]

    out: dict[str, dict[str, float]] = {}
    by_form: dict[tuple, dict[str, float]] = {}
    for c in (floor_type, *cands):
        form = tuple(plan.types[c][n] for n in plan.quantized)
        if form in by_form:  # written exactly as another type: the same tensors, the same errors
            out[c] = by_form[form]
            continue
        text = map_text(dict.fromkeys(plan.quantized, c))
        key = hashlib.sha256(json.dumps([*measure.shas, w_key, text, MEASURE_FTYPE, *tools, SCREEN_VERSION])
                             .encode()).hexdigest()
        cached = folder / f"{key[:16]}.json"
        if cached.is_file():
            errs = json.loads(cached.read_text())
        else:
            f = fisher() if fisher_from is not None else None
            print(f"[sensitivity {flavour}] screen: every tensor at {c}", flush=True)
            gguf = measure.quantize(f"screen at {c}", text)
            t = time.monotonic()
            errs = weight_errors(base, gguf, plan.quantized, weights.get("importance", {}), measure.threads, f)
            measure.cost["screen_seconds"] += time.monotonic() - t
            gguf.unlink()
            measure.cost["screens"] += 1
            write_json_atomic(cached, errs)
        out[c] = by_form[form] = errs
    return out


def _perplexity_tokens(tc: Toolchain, base_gguf: str | Path, text: str,
                       log: Path | None) -> tuple[list[int], int | None]:
    """The text's tokens as llama-perplexity makes them (common_tokenize with special tokens added, none parsed:
    tools/perplexity/perplexity.cpp:305-312; the KL divergence base file keeps them) and the BOS it puts first in
    each chunk (None: the vocabulary adds none), from the conformance helper (pipeline/native/conformance.cpp)."""
    vocab, toks = run_helper(tc, "ggufpipe-conformance", base_gguf, [
        {"op": "vocab"}, {"op": "tokenize", "text": text, "add_special": True, "parse_special": False}], log)
    for a in (vocab, toks):
        if "error" in a:
            raise PipelineError(f"ggufpipe-conformance on {Path(base_gguf).name}: {a['error']}")
    return toks["ids"], (vocab["bos"] if vocab["add_bos"] else None)


def _reference_logits(tc: Toolchain, es: EvalSet, ref: Path, ref_sha: str, text_sha: str, threads: int,
                      scratch: Path, logp: Path | None, flavour: str, where: str) -> Path:
    """``scratch/base.logits``, remade only when its key (reference, text, ctx, chunks, threads, tools) changed."""
    logits = scratch / "base.logits"
    ref_key = hashlib.sha256(json.dumps([ref_sha, text_sha, es.ctx, es.chunks, threads, tc.build_number, tc.commit])
                             .encode()).hexdigest()
    stamp = scratch / "base.logits.key"
    if not (logits.is_file() and stamp.is_file() and stamp.read_text() == ref_key):
        print(f"[sensitivity {flavour}] reference logits of {ref.name} on {es.text.name} ({es.chunks} x {es.ctx})",
              flush=True)
        write_base_logits(tc, es, ref, logits, threads, logp, f"{where}: reference logits")
        stamp.write_text(ref_key)
    return logits


@dataclass
class _Plan:
    """What the dry runs say of the base file: its tensors, the quantized ones' groups and written types."""
    header: GGUFHeader
    listed: dict[str, dict]  # every tensor, as dry_run_types gives it
    quantized: list[str]
    types: dict[str, dict[str, str]]  # floor or candidate -> tensor -> type written
    groups: list[Group]
    shapes: dict[str, list[int]]

    def group_bytes(self, g: Group, c: str) -> int:
        return sum(padded_nbytes(self.types[c][n], self.shapes[n], self.header.alignment) for n in g.tensors)


def _plan(tc: Toolchain, base: Path, im: Path | None, qtypes: tuple[str, ...], n_bands: int, scratch: Path,
          logp: Path | None, where: str) -> _Plan:
    """Dry runs of ``base``: once at MEASURE_FTYPE, then with every quantized tensor at each of ``qtypes``."""
    header = read_header(base)
    args, cwd = imatrix_args(im)
    listed = dry_run_types(tc, base, MEASURE_FTYPE, args, cwd, scratch, logp, where)
    quantized = [n for n, t in listed.items() if t["quantized"]]
    if not quantized:
        raise PipelineError(f"{where}: llama-quantize would quantize no tensor of {base.name}")
    types = {c: written_types(tc, base, quantized, c, im, scratch, logp, where) for c in qtypes}
    groups = group_tensors(quantized, n_bands)
    shapes = {n: list(t["shape"]) for n, t in listed.items()}
    return _Plan(header, listed, quantized, types, groups, shapes)


def _describe(flavour: str, base: Path, base_sha: str, ref: Path, ref_sha: str, im: Path | None, es: EvalSet,
              text_sha: str, threads: int, floor: str, cands: tuple[str, ...], n_bands: int, plan: _Plan) -> dict:
    """The sensitivity file's head, everything but the measurements (its key order is the file's)."""
    alignment = plan.header.alignment
    return {
        "version": VERSION,
        "flavour": flavour,
        "base": {"file": base.name, "sha256": base_sha},
        "reference": {"file": ref.name, "sha256": ref_sha},
        "imatrix_sha256": sha256_file(im) if im else None,
        "text": es.text.name, "text_sha256": text_sha, "ctx": es.ctx, "chunks": es.chunks, "threads": threads,
        "floor": floor, "candidates": list(cands),
        "bands": [list(b) for b in bands(1 + max((g.band[1] for g in plan.groups if g.band), default=0), n_bands)],
        "tensors": {n: {"shape": plan.shapes[n], "types": {c: plan.types[c][n] for c in (floor, *cands)}}
                    for n in plan.quantized},
        "kept_bytes": sum(padded_nbytes(t["type"], t["shape"], alignment) for n, t in plan.listed.items()
                          if not t["quantized"]),
        "n_weights": sum(_elements(t["shape"]) for t in plan.listed.values()),
    }


@dataclass
class _Measurer:
    """Measures one map against the reference logits, or reads it back from ``scratch/runs`` by its key."""
    tc: Toolchain
    es: EvalSet
    base: Path
    im: Path | None
    logits: Path
    scratch: Path
    threads: int
    logp: Path | None
    where: str
    shas: tuple[str, str, str | None]  # base, reference, importance matrix
    text_sha: str
    cost: dict = field(default_factory=lambda: {"runs": 0, "reused": 0, "skipped": 0, "duplicates": 0, "screens": 0,
                                                "imatrix_passes": 0, "quantize_seconds": 0.0, "eval_seconds": 0.0,
                                                "screen_seconds": 0.0})

    def __call__(self, label: str, assign: dict[str, str]) -> dict:
        text = map_text(assign)
        key = hashlib.sha256(json.dumps([*self.shas, text, MEASURE_FTYPE, self.text_sha, self.es.ctx, self.es.chunks,
                                         self.threads, self.tc.build_number, self.tc.commit]).encode()).hexdigest()
        cached = self.scratch / "runs" / f"{key}.json"
        if cached.is_file():
            self.cost["reused"] += 1
            # in KEPT order, as a fresh measurement returns it: the file is written with sorted keys, and the
            # sensitivity JSON must not depend on whether a figure came from the cache
            got = json.loads(cached.read_text())
            return {k: got[k] for k in KEPT}
        kept = self._run(label, text)
        with atomic_output(cached) as tmp:
            tmp.write_text(json.dumps(kept, sort_keys=True) + "\n")
        return kept

    def quantize(self, label: str, text: str) -> Path:
        """``base`` quantized with the map ``text``, as ``scratch/measure.gguf``."""
        mp = self.scratch / "measure.map"
        mp.write_text(text)
        out = self.scratch / "measure.gguf"
        args, cwd = imatrix_args(self.im)
        t = time.monotonic()
        res = run_tool(self.tc, "llama-quantize", [*args, "--tensor-type-file", str(mp.resolve()), self.base,
                                                   out.resolve(), MEASURE_FTYPE, str(max(1, self.threads))],
                       self.logp, check=False, cwd=cwd)
        if res.returncode != 0 or not out.is_file():
            raise ToolError("llama-quantize", res.returncode, self.logp,
                            f"{self.where}: {label}: llama-quantize failed: {explain_failure(res.output, out)}")
        self.cost["quantize_seconds"] += time.monotonic() - t
        return out

    def _run(self, label: str, text: str) -> dict:
        """Quantizes ``base`` with the map ``text``, then the KL divergence of that file: the KEPT statistics."""
        out = self.quantize(label, text)
        t = time.monotonic()
        metrics, _ = kl_divergence(self.tc, self.es, out, self.logits, self.threads, self.logp,
                                   f"{self.where}: {label}", RETRIES)
        self.cost["eval_seconds"] += time.monotonic() - t
        out.unlink()
        self.cost["runs"] += 1
        return {k: metrics[k] for k in KEPT}


def _measure_all(measure: _Measurer, plan: _Plan, floor_type: str, cands: tuple[str, ...],
                 flavour: str) -> tuple[dict, list[dict]]:
    """The exhaustive search: the floor, then every group at every candidate, in that order; a candidate that writes
    the group exactly as the floor or as an earlier candidate does takes that one's figures, unmeasured."""
    floor_map = dict.fromkeys(plan.quantized, floor_type)
    n_total = 1 + len(plan.groups) * len(cands)
    floor = measure("floor", floor_map)
    print(f"[sensitivity {flavour}] 1/{n_total} floor {floor_type}: mean KLD {floor['kld_mean']:.6f}", flush=True)
    out_groups = []
    done = 1
    for g in plan.groups:
        entry = {"group": g.name, "role": g.role, "band": list(g.band) if g.band else None, "tensors": list(g.tensors),
                 "bytes": {c: plan.group_bytes(g, c) for c in (floor_type, *cands)}, "kld": {}}
        seen = {tuple(plan.types[floor_type][n] for n in g.tensors): floor}
        for c in cands:
            done += 1
            form = tuple(plan.types[c][n] for n in g.tensors)
            if form in seen:
                measure.cost["skipped" if seen[form] is floor else "duplicates"] += 1
                entry["kld"][c] = dict(seen[form])
                continue
            entry["kld"][c] = seen[form] = measure(f"{g.name} at {c}", {**floor_map, **dict.fromkeys(g.tensors, c)})
            print(f"[sensitivity {flavour}] {done}/{n_total} {g.name} at {c}: mean KLD "
                  f"{entry['kld'][c]['kld_mean']:.6f}", flush=True)
        out_groups.append(entry)
    return floor, out_groups


def _write_record(record: str | Path, flavour: str, data: dict, n_groups: int, n_cands: int, n_total: int,
                  cost: dict, t0: float, out_json: str | Path) -> None:
    """The stage record: counts, seconds (rounded) and the SHA256 of the file written."""
    SensitivityRecord(flavour=flavour, search=data["search"], groups=n_groups, candidates=n_cands,
                      n_layers=len(data["bands"]) and data["bands"][-1][1] + 1,
                      measurements=1 + n_groups * n_cands, exhaustive_runs=n_total,
                      **{**cost, **{k: round(cost[k], 1) for k in ("quantize_seconds", "eval_seconds", "screen_seconds",
                                                                    "cpu_seconds", "fisher_seconds") if k in cost}},
                      seconds=round(time.monotonic() - t0, 1), sensitivity_sha256=sha256_file(out_json)).write(record)


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _run(j) -> None:
    r, i, f = j.recipe, j.input, j["flavour"]
    sensitivity(r, f, i["base"], i["ref"], j.output["json"], j.output["record"], j.layout.sensitivity_dir(r.name, f),
                imatrix=i.get("imatrix"), threads=j.threads, log=j.log, hf=i.get("hf"))


STAGE = Stage(
    "sensitivity", "sensitivity", order=40, log="sensitivity-{flavour}", wildcards=("flavour",),
    threads="eval_threads", run=_run, inputs=lambda r, wc, L: L.sensitivity_inputs(r, wc["flavour"]),
    outputs=lambda L: {"json": L.sensitivity("{name}", "{flavour}"), "record": L.sensitivity_record("{name}", "{flavour}")},
    # not the budgets or targets: changing those re-solves, never re-measures
    trigger=lambda r, wc, s: {"sensitivity": r.sensitivity.describe(), "candidates": r.mix_candidates(wc["flavour"]),
                              "eval_threads": s.eval_threads, "build": s.build_number, "commit": s.commit,
                              "offload": s.offload,
                              **({"search_version": SEARCH_VERSION} if r.sensitivity.search != "exhaustive" else {}),
                              **({"fisher_version": FISHER_VERSION} if r.sensitivity.search == "fisher" else {})},
    # the Fisher search holds the checkpoint in float32 and a float32 Fisher per weight: up to four times its BF16 size
    resources={"mem_mb": lambda s: mem_mb(s.total + (3 * s.mb("hf") if s.recipe.sensitivity.search == "fisher" else 0),
                                          1.3, 1024),
               "disk_mb": lambda s: mem_mb(s.mb("base"), 1.0, 1024),
               "runtime": lambda s: int(60 + s.total)},
)
