"""Stage fetch: a recipe's HF weights at a pinned revision into ``work/<name>/hf``.

Safety rules: by default only safetensors weights plus config, generation config, tokenizer files
and chat template are fetched; pickled weights (``*.bin``, ``*.pt``...) and custom code (``*.py``,
``auto_map`` in the config) are refused unless the recipe opts in. ``HF_TOKEN`` is read from the
environment by huggingface_hub itself and is never written anywhere by this stage.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from pathlib import Path

from pipeline.errors import PipelineError, RecipeError
from pipeline.fsutil import atomic_output, hashing_ahead, read_input, sha256_file
from pipeline.recipe import Recipe
from pipeline.recipe.model import REPO_RE
from pipeline.records import FetchRecord
from pipeline.stagedef import FETCH_UNKNOWN_MB, Stage, mem_mb

SAFE_PATTERNS = ["*.safetensors", "*.safetensors.index.json", "*.json", "*.model", "*.jinja", "*.txt",
                 "*.tiktoken", "README.md", "LICENSE*"]
PICKLE_PATTERNS = ["*.bin", "*.bin.index.json", "*.pt", "*.pth", "*.ckpt", "*.pkl"]
CODE_PATTERNS = ["*.py"]


def allow_patterns(recipe: Recipe) -> list[str]:
    pats = list(SAFE_PATTERNS)
    if recipe.source.allow_pickle:
        pats += PICKLE_PATTERNS
    if recipe.source.trust_remote_code:
        pats += CODE_PATTERNS
    return pats


def _wanted(rel: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(Path(rel).name, p) for p in patterns)


def _env_offline() -> bool:
    """HF_HUB_OFFLINE as set now (huggingface_hub reads it once, at import)."""
    return any(os.environ.get(k, "").upper() in ("1", "ON", "YES", "TRUE") for k in ("HF_HUB_OFFLINE",
                                                                                    "TRANSFORMERS_OFFLINE"))


def _snapshot(recipe: Recipe, hub_cache: str | None) -> Path:
    # huggingface_hub (slow): only a Hub download needs it
    import httpx  # huggingface_hub 1.x's HTTP client: its connection errors are not OSErrors
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    src = recipe.source
    where = f"{recipe.path}: source: {src.repo}@{src.revision}"
    try:
        path = snapshot_download(
            repo_id=src.repo,
            revision=src.revision,
            allow_patterns=allow_patterns(recipe),
            cache_dir=hub_cache,
            # huggingface_hub 1.x lists a commit's files on the Hub even offline unless told to stay local
            local_files_only=constants.is_offline_mode() or _env_offline(),
        )
    except GatedRepoError:
        raise PipelineError(f"{where}: the repo is gated: accept its terms on the Hub and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise PipelineError(f"{where}: repo not found (or private: set HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise PipelineError(f"{where}: revision not found in the repo") from None
    except LocalEntryNotFoundError:
        offline = _env_offline()
        hint = "HF_HUB_OFFLINE is set and it is not in the local hub cache" if offline else "the Hub cannot be reached and it is not in the local hub cache"
        raise PipelineError(f"{where}: cannot fetch: {hint}") from None
    except (OSError, httpx.HTTPError) as exc:
        raise PipelineError(f"{where}: download failed: {type(exc).__name__}: {' '.join(str(exc).split())}") from None
    # huggingface_hub joins a cached ref's text under snapshots/ unchecked: a planted refs/<revision> holding
    # "../.." would hand over a folder outside the cache, recorded as this repo's commit
    snapshots = repo_folder(Path(hub_cache or constants.HF_HUB_CACHE).expanduser(), src.repo) / "snapshots"
    rel = os.path.relpath(Path(path).resolve(), snapshots.resolve())
    return confined(snapshots, rel, f"{src.repo}@{src.revision}: the snapshot")


def _local_source(recipe: Recipe) -> Path:
    path = Path(recipe.source.path).expanduser()
    if not path.is_dir():
        raise RecipeError(recipe.path, "source.path", f"{path} is not a folder")
    return path


def read_config(folder: Path, files: list[str], where: str) -> dict:
    """A Hugging Face folder's config.json as a mapping; one line naming the folder when it is missing or broken."""
    if "config.json" not in files:
        raise PipelineError(f"{where}: {folder} has no config.json: not a Hugging Face model folder")
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PipelineError(f"{where}: config.json is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise PipelineError(f"{where}: config.json is not a JSON object")
    return config


def check_folder(folder: Path, recipe: Recipe, files: list[str]) -> None:
    """Refuse folders without usable weights, with pickled weights or custom code not opted in."""
    where = f"{recipe.path}: source"
    config = read_config(folder, files, where)
    if "auto_map" in config and not recipe.source.trust_remote_code:
        raise PipelineError(
            f"{where}: config.json needs custom code (auto_map); set source.trust_remote_code: true only if you trust it"
        )
    weights = [f for f in files if f.endswith(".safetensors")]
    pickles = [f for f in files if _wanted(f, PICKLE_PATTERNS) and not f.endswith(".json")]
    if pickles and not recipe.source.allow_pickle:
        raise PipelineError(
            f"{where}: {pickles[0]} holds pickled weights, which can run code when loaded; "
            "set source.allow_pickle: true only if you trust it"
        )
    if not weights and not pickles:
        raise PipelineError(
            f"{where}: no *.safetensors weights found (a repo with only pickled *.bin weights needs source.allow_pickle: true)"
        )
    for f in weights:
        check_safetensors(folder / f, where)
    if not any(f in files for f in ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")):
        raise PipelineError(f"{where}: no tokenizer files (tokenizer.json / tokenizer.model) in {folder}")


def check_safetensors(path: Path, where: str) -> dict:
    """Refuse a truncated or corrupt safetensors file from its header, before anything loads it; return the header."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n <= 1 or n > min(size - 8, 100 << 20):
            raise PipelineError(f"{where}: {path.name} is not a valid safetensors file (bad header length): corrupt or truncated")
        try:
            header = json.loads(fh.read(n))
        except (ValueError, UnicodeDecodeError):
            raise PipelineError(f"{where}: {path.name} has an unreadable safetensors header: corrupt") from None
    if not isinstance(header, dict):
        raise PipelineError(f"{where}: {path.name} has an unreadable safetensors header: corrupt")
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)
            and isinstance(t.get("data_offsets"), list) and len(t["data_offsets"]) == 2]
    need = 8 + n + max(ends, default=0)
    if need > size:
        raise PipelineError(f"{where}: {path.name} is truncated: its header needs {need} bytes, the file has {size}")
    return header


def _place(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    real = src.resolve()
    try:
        os.link(real, dst)
    except OSError:
        shutil.copyfile(real, dst)


def fetch(recipe: Recipe, out_dir: str | Path, record: str | Path, hub_cache: str | None = None) -> dict:
    """Entry function: put the recipe's HF folder at ``out_dir`` and write ``record`` (JSON).

    The record names the resolved commit (repo sources) and the SHA256 of every fetched file.
    """
    out_dir, record = Path(out_dir), Path(record)
    # the files' SHA256s start in a helper thread while huggingface_hub is imported and resolves the snapshot
    # (0.3 s each for the demo): the fetched files are hard links of these, and a hash is reused only for
    # the very same inode, size and mtime (fsutil.hashing_ahead)
    with hashing_ahead(_likely_files(recipe, hub_cache)):
        return _fetch(recipe, out_dir, record, hub_cache)


def _likely_files(recipe: Recipe, hub_cache: str | None) -> list[Path]:
    """The files a fetch will most likely place, found without huggingface_hub: the local source folder, or
    the pinned commit's snapshot folder in the hub cache when it is there. Only a hint (see fetch)."""
    if recipe.source.repo:
        home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
        cache = Path(hub_cache or os.environ.get("HF_HUB_CACHE") or home / "hub")
        folder = hub_snapshot_dir(cache, recipe.source.repo, recipe.source.revision or "main")
    else:
        folder = Path(recipe.source.path).expanduser()
    patterns = allow_patterns(recipe)
    try:
        return [p for p in folder.rglob("*") if _wanted(str(p.relative_to(folder)), patterns) and p.is_file()]
    except OSError:
        return []


def repo_folder(cache: Path, repo: str) -> Path:
    """The folder of ``repo`` in the hub cache ``cache`` (``models--org--name``); ``repo`` may come from a manifest."""
    if not isinstance(repo, str) or not REPO_RE.fullmatch(repo):
        raise PipelineError(f"{repo!r} is not a Hugging Face repo id (org/name): no folder of the hub cache {cache}")
    return cache / ("models--" + repo.replace("/", "--"))


def confined(base: Path, rel: str, what: str) -> Path:
    """``base / rel`` when ``rel`` is a relative path without ``..`` that resolves inside ``base`` (no symlink out);
    else one line naming it. ``rel`` comes from outside (a recipe, a manifest, a cached ref file)."""
    parts = rel.split("/")
    if not rel or "\\" in rel or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        raise PipelineError(f"{base}: {what} {rel!r} is not a relative path inside it (an empty, '.' or '..' "
                            "segment, a '/' at the start or a backslash): refused")
    path = base.joinpath(*parts)
    root = base.resolve()
    if not path.resolve().is_relative_to(root):
        raise PipelineError(f"{path}: {what} resolves to {path.resolve()}, outside {root} (a symlink out): refused")
    return path


REF_MAX_BYTES = 4096  # a ref file holds a 40-hex commit


def hub_snapshot_dir(cache: Path, repo: str, revision: str) -> Path:
    """Where the hub cache ``cache`` keeps ``repo`` at ``revision`` (a commit, or a branch or tag that its
    ``refs/`` resolves); it may not exist. Both the revision and a ref's text are confined to their folders."""
    repo_dir = repo_folder(cache, repo)
    if not isinstance(revision, str) or not revision.isprintable():
        raise PipelineError(f"{repo}@{revision!r}: not a git revision (a control character or not a string): refused")
    ref = confined(repo_dir / "refs", revision, f"{repo}@{revision}: the ref")
    name = revision
    if ref.is_file():
        try:
            name = read_input(ref, REF_MAX_BYTES).decode("ascii").strip()
        except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            raise PipelineError(f"{ref}: cannot read the cached ref of {repo}@{revision}: {exc}") from None
    return confined(repo_dir / "snapshots", name, f"{repo}@{revision}: the snapshot")


def _fetch(recipe: Recipe, out_dir: Path, record: Path, hub_cache: str | None) -> dict:
    if recipe.source.repo:
        snap = _snapshot(recipe, hub_cache)
        commit = snap.name
        origin = {"repo": recipe.source.repo, "revision": recipe.source.revision, "commit": commit}
    else:
        snap = _local_source(recipe)
        origin = {"path": str(recipe.source.path)}
    patterns = allow_patterns(recipe)
    if recipe.source.repo:
        files = sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file() or p.is_symlink())
    else:
        files = sorted(str(p.relative_to(snap)) for p in snap.rglob("*")
                       if p.is_file() and not any(part.startswith(".") for part in p.relative_to(snap).parts))
    # Local folders are checked for pickles before filtering, so that a refusal is explained.
    check_folder(snap, recipe, files)
    files = [f for f in files if _wanted(f, patterns)]
    listing = {}
    with atomic_output(out_dir) as tmp:
        tmp.mkdir()
        for rel in files:
            _place(snap / rel, tmp / rel)
            listing[rel] = {"sha256": sha256_file(tmp / rel), "size": (tmp / rel).stat().st_size}
    FetchRecord(source=origin, files=listing).write(record)
    print(f"[fetch] {recipe.name}: {len(listing)} files from {origin.get('repo', origin.get('path'))}"
          + (f"@{origin['commit']}" if "commit" in origin else ""), flush=True)
    return {"source": origin, "files": listing}


def _disk_mb(s) -> int:
    src = s.source_mb()
    return mem_mb(src, 2.0) if src else FETCH_UNKNOWN_MB


STAGE = Stage(
    "fetch", "fetch", order=10, log="fetch", output="log", options=("hub_cache",), directories=("hf",),
    run=lambda j: fetch(j.recipe, j.output["hf"], j.output["record"], hub_cache=j.options.get("hub_cache") or None),
    outputs=lambda L: {"hf": L.hf("{name}"), "record": L.fetch_record("{name}")},
    trigger=lambda r, wc, s: {"source": r.source.describe(), "allow_pickle": r.source.allow_pickle,
                              "trust_remote_code": r.source.trust_remote_code},
    resources={"mem_mb": 1024, "disk_mb": _disk_mb,
               "runtime": lambda s: int(30 + s.source_mb() / 100) if s.source_mb() else 120},
)
