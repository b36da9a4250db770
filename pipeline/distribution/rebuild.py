"""``ggufpipe rebuild-check``: rebuild a recipe from its manifest in a scratch folder and compare.

The manifest records what a build depends on: the recipe (file name and SHA256), the source (repo,
revision, resolved commit and one SHA256 over the fetched files, or a local folder), the toolchain
(llama.cpp build and commit, versions of the Python packages that touched the weights), the eval and
calibration texts' SHA256s and the build settings that reach the bytes (``eval_threads``, the
calibration threads and device, ``quantized_by``). This module

1. refuses, one line per difference, when the recipe, a text or the toolchain here is not the recorded
   one, or when the source is not available offline (nothing is built then);
2. runs the real Snakemake workflow (this repo's Snakefile) with ``--directory`` and the artifact and
   work roots in a scratch folder (never the original ``artifacts/`` or ``work/``), offline, with the
   recorded settings and any ``--cores``; first the fetch stage alone, whose source digest must equal
   the recorded one, then the build;
3. compares the SHA256 of every model file the manifest lists (published and rejected quants, the
   base, split shards and the whole files they were cut from), each measured mix's tensor-type map and
   sensitivity measurement, and the manifest itself without its volatile ``build`` section (and the
   sensitivity cost's seconds and cache counts), and prints one table row each.

Exit status 0 only when every row matches; 1 otherwise (a refusal, a failed build, a mismatch).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.demo import hub_cache_dir
from pipeline.distribution.manifest_check import read_manifest
from pipeline.errors import PipelineError
from pipeline.fsutil import sha256_file
from pipeline.layout import Layout
from pipeline.provenance import python_versions, source_files_digest
from pipeline.recipe import load_recipe, naming
from pipeline.records import FetchRecord
from pipeline.stages.fetch import hub_snapshot_dir
from pipeline.stages.publish import artifact_key, strip_volatile
from pipeline.tools import find_toolchain

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_THREADS = 2  # Workflow's eval_threads / calib_threads defaults
# How far a file rebuilt on another llama.cpp backend (pipeline/tools_backend.py) may differ when it need not match
# byte for byte: None until bench/gpu/run.sh has measured CPU against CUDA on a GPU (bench/RESULTS.md, docs/gpu.md).
# While None, a rebuild on another backend is refused; setting it also needs the tolerance comparison in
# rebuild_check (every row is compared by SHA256 today).
CROSS_BACKEND_TOLERANCES = None  # unmeasured


def byte_identical_across_backends(entry: dict) -> bool:
    """Whether a manifest file entry must match byte for byte when rebuilt on another backend: llama-quantize runs
    on the CPU on every backend, so only what a GPU computed can make the bytes differ -- an imatrix
    (llama-imatrix offloads) or AWQ scales (``calibration``), or a measured mix's map (``mix``: its sensitivity is
    llama-perplexity's KL divergence)."""
    calibration = entry.get("calibration") or {}
    return not any(k in calibration for k in ("awq", "imatrix")) and not entry.get("mix")


def backend_refusal(m: dict, here: str) -> str | None:
    """One line when the manifest's ``tools.backend`` (absent in older manifests: cpu) is not ``here`` and no GPU
    measurement backs the tolerances (:data:`CROSS_BACKEND_TOLERANCES`); None otherwise."""
    recorded = m["tools"].get("backend", "cpu")
    if recorded == here or CROSS_BACKEND_TOLERANCES is not None:
        return None
    entries = m["artifacts"] + m.get("rejected", [])
    exact = sum(byte_identical_across_backends(e) for e in entries)
    return (f"toolchain: the {here} backend here, the manifest records {recorded}: the tolerances for the "
            f"{len(entries) - exact} file(s) made with an imatrix, AWQ or a measured mix are not yet backed by a GPU "
            f"measurement (bench/RESULTS.md, docs/gpu.md), and the {exact} made without would have to match byte for "
            f"byte; rebuild with GGUFPIPE_BACKEND={recorded}")


@dataclass
class Row:
    artifact: str
    recorded: str | None
    rebuilt: str | None

    @property
    def match(self) -> bool:
        return self.recorded is not None and self.recorded == self.rebuilt


def _load_manifest(path: Path) -> dict:
    """The manifest, checked (pipeline/distribution/manifest_check.py) before any build starts: one line naming the
    field when a part used here is missing, mistyped, out of range or a path out of its folder."""
    return read_manifest(path, require=("name", "recipe", "source", "tools", "artifacts"))


def find_recipe(manifest_path: Path, manifest: dict, explicit: str | None) -> Path:
    """The recipe file: ``--recipe``, else ``recipes/<file>`` of the project the manifest sits in
    (``<root>/artifacts/<name>/manifest.json``), else ``recipes/<file>`` here."""
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise PipelineError(f"--recipe: {p} does not exist")
        return p.resolve()
    fname = manifest["recipe"]["file"]
    root = manifest_path.resolve().parent.parent.parent
    for cand in (root / "recipes" / fname, Path.cwd() / "recipes" / fname):
        if cand.is_file():
            return cand.resolve()
    raise PipelineError(f"{manifest_path}: recipe.file: {fname} not found in {root / 'recipes'} or ./recipes; "
                        "pass --recipe PATH")


def find_hub_cache(source: dict, explicit: str | None) -> tuple[Path | None, str | None]:
    """(hub cache holding the recorded commit, None) or (None, why not). Tried in order: ``--hub-cache``,
    ``$HF_HUB_CACHE``, huggingface_hub's default cache, the demo's hub cache."""
    if not source.get("repo"):
        return None, None
    cands = [Path(explicit)] if explicit else []
    if not explicit:
        if os.environ.get("HF_HUB_CACHE"):
            cands.append(Path(os.environ["HF_HUB_CACHE"]))
        hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
        cands.append(hf_home / "hub")
        cands.append(hub_cache_dir())
    for c in cands:
        if hub_snapshot_dir(c.expanduser(), source["repo"], source["commit"]).is_dir():
            return c.expanduser().resolve(), None
    return None, (f"source: {source['repo']}@{source['commit']} is not in the hub cache ("
                  + ", ".join(str(c) for c in cands) + "); rebuild-check works offline: fetch it first or pass "
                  "--hub-cache")


def _recorded_settings(m: dict) -> dict:
    """The workflow config that reaches the bytes, as the manifest records it."""
    recorded = (m.get("build") or {}).get("eval_threads") or {}  # per eval set, as capped by --cores
    eval_threads = max(recorded.values()) if recorded else None
    if eval_threads is None:
        eval_threads = next((es["threads"] for es in m.get("eval_sets", []) if es.get("threads")), None)
    if eval_threads is None:
        eval_threads = next((p["acceptance"]["threads"] for p in (m.get("draft") or {}).get("pairs", [])
                             if (p.get("acceptance") or {}).get("threads")), DEFAULT_THREADS)
    calib = [c[k]["threads"] for e in m["artifacts"] + m.get("rejected", [])
             for c in [e.get("calibration", {})] for k in ("awq", "imatrix") if c.get(k, {}).get("threads")]
    awq = [e["calibration"]["awq"] for e in m["artifacts"] + m.get("rejected", []) if "awq" in e.get("calibration", {})]
    return {"eval_threads": eval_threads, "calib_threads": calib[0] if calib else DEFAULT_THREADS,
            "quantized_by": m.get("gguf_metadata", {}).get("general.quantized_by", "ggufpipe"),
            "awq_device": awq[0].get("device", "cpu") if awq else None}


def rebuild_preflight(m: dict, recipe_path: Path, hub_cache: str | None) -> tuple[list[str], object, Path | None]:
    """(refusals, the recipe, hub cache): every way the inputs here differ from the recorded ones."""
    errors: list[str] = []
    tc = find_toolchain()
    want = m["tools"]
    if (tc.build_number, tc.commit) != (want.get("llama_cpp_build"), want.get("llama_cpp_commit")):
        errors.append(f"toolchain: llama.cpp b{tc.build_number} (commit {tc.commit}) here, the manifest records "
                      f"b{want.get('llama_cpp_build')} (commit {want.get('llama_cpp_commit')})")
    refusal = backend_refusal(m, tc.backend)
    if refusal:
        errors.append(refusal)
    for env, recorded in sorted(want.get("python", {}).items()):
        try:
            here = python_versions(tuple(recorded), env=env)
        except PipelineError as exc:  # an environment not installed here
            errors.append(f"toolchain: {exc}")
            continue
        for pkg, ver in sorted(recorded.items()):
            if here.get(pkg) != ver:
                errors.append(f"toolchain: Python package {pkg} {here.get(pkg, 'not installed')} in the {env} "
                              f"environment here, the manifest records {ver}")

    src = m["source"]
    cache = None
    if src.get("repo"):
        cache, why = find_hub_cache(src, hub_cache)
        if why:
            errors.append(why)
    elif src.get("path") and not Path(src["path"]).is_dir():
        errors.append(f"source: the recorded local folder {src['path']} does not exist")

    sha = sha256_file(recipe_path)
    if sha != m["recipe"]["sha256"]:
        errors.append(f"recipe: {recipe_path} has SHA256 {sha[:16]}…, the manifest records "
                      f"{m['recipe']['sha256'][:16]}… (edited since the build)")
        return errors, None, cache  # its texts and settings cannot be compared with an edited recipe's
    if recipe_path.name != m["recipe"]["file"]:
        errors.append(f"recipe: {recipe_path} is named {recipe_path.name}, the manifest records {m['recipe']['file']}")
    recipe = load_recipe(recipe_path, str(tc.tool("llama-quantize")))
    if m["name"] != recipe.name:
        recipe = recipe.draft_recipe() if recipe.draft_recipe() and m["name"] == recipe.draft_name else None
        if recipe is None:
            errors.append(f"recipe: {recipe_path} defines no recipe named {m['name']!r}")
            return errors, None, cache

    for es in m.get("eval_sets", []):
        try:
            path = recipe.eval_set(es["name"]).text
        except PipelineError:
            errors.append(f"eval set {es['name']}: not in {recipe_path}")
            continue
        if sha256_file(path) != es["text_sha256"]:
            errors.append(f"eval set {es['name']}: {path} differs from the recorded text (SHA256 "
                          f"{es['text_sha256'][:16]}…)")
    seen = set()
    for e in m["artifacts"] + m.get("rejected", []):
        for kind in ("awq", "imatrix"):  # the kinds the manifest check vouches for: no other key is looked up
            c = e.get("calibration", {}).get(kind)
            cfg = getattr(recipe, kind, None)
            if c is None or kind in seen or cfg is None:
                continue
            seen.add(kind)
            if sha256_file(cfg.calibration) != c["calibration_sha256"]:
                errors.append(f"{kind}.calibration: {cfg.calibration} differs from the recorded text (SHA256 "
                              f"{c['calibration_sha256'][:16]}…)")
            if kind == "awq" and c.get("device", "cpu") == "cuda":
                import torch

                if not torch.cuda.is_available():
                    errors.append("awq: the manifest's AWQ ran on CUDA and torch sees no GPU here (AWQ on CUDA and "
                                  "on the CPU give different weights)")
    maps = {q.key: q.tensor_types_file for q in recipe.quants if q.tensor_types_file}
    for e in m["artifacts"] + m.get("rejected", []):
        rec, key = e.get("tensor_types_file"), e.get("requested", {}).get("variant")
        key = naming.quant_label(e.get("requested", {}).get("type", ""), key)
        if rec and key in maps and sha256_file(maps[key]) != rec["sha256"]:
            errors.append(f"quant {key}: tensor_types_file {maps[key]} differs from the recorded map (SHA256 "
                          f"{rec['sha256'][:16]}…)")

    sens = m.get("sensitivity") or {}
    if sens and recipe.sensitivity is None:
        errors.append(f"sensitivity: not in {recipe_path} (the manifest records measured mixes)")
    elif sens:
        text = recipe.sensitivity.text
        recorded = sorted({s["text_sha256"] for s in sens.values()})
        if [sha256_file(text)] != recorded:
            errors.append(f"sensitivity.text: {text} differs from the recorded text (SHA256 {recorded[0][:16]}…)")

    return errors, recipe, cache


def _mix_rows(entries: list[dict], m: dict, name: str, layout) -> list[Row]:
    """One row per mix map of ``entries`` and per sensitivity measurement they were solved from (all of the manifest's
    when every entry is compared)."""
    def sha(p: Path) -> str | None:
        return sha256_file(p) if p.is_file() else None

    rows, flavours = [], []
    for e in entries:
        mix = e.get("mix")
        if mix:
            rows.append(Row(mix["map"]["file"], mix["map"]["sha256"],
                            sha(layout.mix_map(name, artifact_key(name, e["file"])))))
            flavours.append(mix["flavour"])
    for flavour, s in (m.get("sensitivity") or {}).items():
        if flavour in flavours:
            rows.append(Row(layout.sensitivity(name, flavour).name, s["sha256"], sha(layout.sensitivity(name, flavour))))
    return rows


def _snakemake(recipe_path: Path, scratch: Path, cores: str, settings: dict, targets: list[Path],
               hub_cache: Path | None, log: Path) -> int:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(scratch),
           "--cores", str(cores), "--keep-going", "--config", f"recipes={recipe_path}",
           f"artifacts={scratch / 'artifacts'}", f"work={scratch / 'work'}",
           f"eval_threads={settings['eval_threads']}", f"calib_threads={settings['calib_threads']}",
           f"quantized_by={settings['quantized_by']}", "--", *map(str, targets)]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if settings["awq_device"] == "cpu":  # AWQ ran on the CPU: so it does here, GPU or not
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.pop("HF_HUB_CACHE", None)
    if hub_cache:
        env["HF_HUB_CACHE"] = str(hub_cache)
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        return subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=scratch)


def _rows_for(entry: dict, name: str, layout) -> list[Row]:
    """One row per file of a manifest entry: the GGUF, or each shard and the whole file of a split one."""
    def sha(p: Path) -> str | None:
        return sha256_file(p) if p.is_file() else None

    s = entry.get("split")
    if not s:
        return [Row(entry["file"], entry.get("sha256"), sha(layout.built(name, entry["file"])))]
    folder = layout.split_dir(name, artifact_key(name, entry["file"]))
    rows = [Row(f"{entry['file']}/{sh['file']}", sh["sha256"], sha(folder / sh["file"])) for sh in s["shards"]]
    extra = sorted(p.name for p in folder.glob("*.gguf") if p.name not in {sh["file"] for sh in s["shards"]}) \
        if folder.is_dir() else []
    rows += [Row(f"{entry['file']}/{f}", None, sha(folder / f)) for f in extra]
    u = s["unsplit"]
    rows.append(Row(f"{u['file']} (unsplit)", u["sha256"], sha(layout.built(name, u["file"]))))
    return rows


def _canonical_sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def json_diff(a, b, path: str = "") -> list[str]:
    """Paths where two JSON values differ (``recorded -> rebuilt``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in a:
                out.append(f"{p}: only in the rebuilt manifest")
            elif k not in b:
                out.append(f"{p}: missing from the rebuilt manifest")
            else:
                out += json_diff(a[k], b[k], p)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in json_diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {json.dumps(a)[:80]} -> {json.dumps(b)[:80]}"]


def format_table(rows: list[Row]) -> str:
    w = max([len("artifact")] + [len(r.artifact) for r in rows])
    lines = [f"{'artifact':<{w}}  {'recorded sha256':<17}  {'rebuilt sha256':<17}  match"]
    for r in rows:
        rec = (r.recorded[:16] + "…") if r.recorded else "(not recorded)"
        reb = (r.rebuilt[:16] + "…") if r.rebuilt else "(not built)"
        lines.append(f"{r.artifact:<{w}}  {rec:<17}  {reb:<17}  {'yes' if r.match else 'NO'}")
    return "\n".join(lines)


def rebuild_check(manifest_path: str | Path, recipe: str | None = None, cores: str = "all", keep: str | None = None,
                  only: list[str] | None = None, hub_cache: str | None = None, out=print) -> int:
    """Entry function of ``ggufpipe rebuild-check``; returns the exit status (0: everything matches)."""
    manifest_path = Path(manifest_path)
    m = _load_manifest(manifest_path)
    name = m["name"]
    recipe_path = find_recipe(manifest_path, m, recipe)
    entries = m["artifacts"] + m.get("rejected", [])
    keys = {artifact_key(name, e["file"]): e for e in entries}
    if only:
        unknown = [k for k in only if k not in keys]
        if unknown:
            raise PipelineError(f"--only: {', '.join(unknown)} not in {manifest_path} (it lists: {', '.join(keys)})")
        entries = [keys[k] for k in only]

    errors, _recipe, cache = rebuild_preflight(m, recipe_path, hub_cache)
    if errors:  # every difference, in the one error line (the CLI prints it on stderr)
        raise PipelineError(f"cannot rebuild {manifest_path}: " + "; ".join(errors))

    original = {manifest_path.resolve().parent.parent, manifest_path.resolve().parent.parent.parent / "work"}
    if keep:
        scratch = Path(keep).resolve()
        if scratch.exists() and any(scratch.iterdir()):
            raise PipelineError(f"--keep: {scratch} is not empty (the rebuild needs a fresh folder)")
        if any(scratch == o or o in scratch.parents for o in original):
            raise PipelineError(f"--keep: {scratch} is inside the original build's artifacts/ or work/ folder")
        scratch.mkdir(parents=True, exist_ok=True)
    else:
        scratch = Path(tempfile.mkdtemp(prefix="ggufpipe-rebuild-"))
    settings = _recorded_settings(m)
    L = Layout(scratch / "artifacts", scratch / "work")
    log = scratch / "rebuild.log"
    out(f"rebuilding {name} from {recipe_path} in {scratch} (--cores {cores}, eval_threads "
        f"{settings['eval_threads']}, calib_threads {settings['calib_threads']}; log: {log})")
    try:
        # 1. the source alone: it must be the recorded one before anything is built from it
        if _snakemake(recipe_path, scratch, cores, settings, [L.fetch_record(name)], cache, log) != 0:
            raise PipelineError(f"cannot rebuild {manifest_path}: the fetch stage failed: {_tail(log)}"
                                + ("" if keep else " (--keep DIR keeps the folder and its logs)"))
        fetched = FetchRecord.read(L.fetch_record(name), "rebuild")
        src = {**fetched.source, "files_sha256": source_files_digest(fetched.files)}
        bad = [k for k in sorted(set(src) | set(m["source"])) if src.get(k) != m["source"].get(k)]
        if bad:
            raise PipelineError(f"cannot rebuild {manifest_path}: " + "; ".join(
                f"source: {k} is {src.get(k)} here, the manifest records {m['source'].get(k)}" for k in bad))
        # 2. the build: the manifest (publish pulls in every stage, drafts included), or --only files
        if only:
            targets = [L.split_dir(name, artifact_key(name, e["file"])) if e.get("split")
                       else L.built(name, e["file"]) for e in entries]
        else:
            targets = [L.manifest(name)]
        code = _snakemake(recipe_path, scratch, cores, settings, targets, cache, log)
        rows = [row for e in entries for row in _rows_for(e, name, L)] + _mix_rows(entries, m, name, L)
        if not only:
            rebuilt = L.manifest(name)
            try:
                m2 = read_manifest(rebuilt) if rebuilt.is_file() else None
            except PipelineError as exc:  # the rebuild's own output: shown, and the manifest row does not match
                out(f"error: {exc}")
                m2 = None
            rows.append(Row("manifest.json (without build)", _canonical_sha(strip_volatile(m)),
                            _canonical_sha(strip_volatile(m2)) if m2 is not None else None))
        out(format_table(rows))
        if code != 0:
            out(f"error: the rebuild failed: {_tail(log)}" + ("" if keep else " (--keep DIR keeps the folder and its logs)"))
        if not only and m2 is not None and not rows[-1].match:
            diffs = json_diff(strip_volatile(m), strip_volatile(m2))
            out("manifest differs at: " + "; ".join(diffs[:10]) + (f" (+{len(diffs) - 10} more)" if len(diffs) > 10
                                                                     else ""))
        bad_rows = [r_.artifact for r_ in rows if not r_.match]
        if bad_rows:
            out(f"MISMATCH: {len(bad_rows)} of {len(rows)}: {', '.join(bad_rows)}")
            return 1
        if code != 0:
            return 1
        out(f"OK: {len(rows)} of {len(rows)} identical" + (" (--only: manifest not compared)" if only else ""))
        return 0
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)


def _tail(log: Path) -> str:
    """The last error-looking line of the Snakemake log (or its last line)."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    errs = [ln for ln in lines if ln.startswith("error:") or "Error" in ln]
    return (errs[-1] if errs else lines[-1] if lines else "(empty log)")[:300]
