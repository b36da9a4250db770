"""Device-side check of a pulled GGUF against its manifest, with the standard library only.

A device install (``pip install '.[device]'``: DVC, no numpy, no gguf, no torch) runs this through
``ggufpipe verify``; the GGUF header is read by :mod:`pipeline.gguf.reader`, whose type table is that of the
pinned llama.cpp.

A split file (recipe ``split:``) is published as a folder ``<name>-<KEY>/`` of llama-gguf-split shards;
``verify`` takes the folder or any shard path and checks the whole set: exactly the shards the manifest
lists (none missing, none extra), each one's size, SHA256, header and ``split.no`` / ``split.count`` /
``split.tensors.count``, the quant type (``general.file_type``, which only the first shard carries) and
the whole model's header facts, summed over the shards.

A measured mix's tensor-type map (``<name>-<KEY>.tensor-types.txt``, manifest ``mix.map``) is checked by its SHA256:
given itself, or beside its GGUF when the GGUF is verified (a map that is there must match; one not pulled is not
required). The device slice (``device-slice.logits``, manifest ``device_check``) given itself is checked by size and
SHA256 (``ggufpipe device-check`` checks it too, docs/device-check.md).

The manifest is read and checked by :mod:`pipeline.distribution.manifest_check` before anything here looks inside it:
every field used below is there with its type and range, and every file name in it is one plain path segment, so
nothing outside the manifest's folder (a shard named ``../x.gguf``) is ever opened or hashed.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.distribution.manifest_check import read_manifest
from pipeline.errors import ArtifactError
from pipeline.fsutil import sha256_file
from pipeline.gguf import file_type_name, read_header
from pipeline.stages.split import SHARD_RE, check_header, shard_header

# Facts of the manifest entry that the header must match besides the quant type (pipeline.gguf.GGUFFacts).
_HEADER_FACTS = ("gguf_version", "tensor_count", "parameter_count", "architecture", "bits_per_weight")


def find_entry(manifest: dict, filename: str) -> dict:
    for entry in manifest.get("artifacts", []):
        if entry.get("file") == filename:
            return entry
    raise ArtifactError(filename, f"{filename} is not listed in the manifest of {manifest.get('name', '?')}")


MAP_SUFFIX = ".tensor-types.txt"  # pipeline/stages/publish.py MAP_SUFFIX


def _map_entry(manifest: dict, filename: str) -> dict | None:
    """The artifact entry whose mix map is ``filename``."""
    return next((e for e in manifest.get("artifacts", []) if (e.get("mix") or {}).get("map", {}).get("file") == filename),
                None)


def _check_map(path: Path, entry: dict) -> str:
    """Raise unless ``path`` (a mix's map) has the SHA256 the manifest names for it; returns its digest."""
    want = entry["mix"]["map"]["sha256"]
    if not path.is_file():
        raise ArtifactError(path, f"{path}: missing (not pulled?)")
    digest = sha256_file(path)
    if digest != want:
        raise ArtifactError(path, f"{path}: SHA256 {digest} does not match the manifest's {want} (the map of "
                                  f"{entry['file']}): file altered")
    return digest


def _map_beside(folder: Path, entry: dict) -> str:
    """`` · map …`` when a mix's map sits beside its GGUF and matches (raise when it differs); else ``""``."""
    m = (entry.get("mix") or {}).get("map")
    if not m or not (folder / m["file"]).is_file():
        return ""
    _check_map(folder / m["file"], entry)
    return f"; map {m['file']} matches"


def check_slice_file(path: Path, dc: dict) -> str:
    """Raise unless ``path`` (the device slice) has the size and SHA256 the manifest's ``device_check`` names; returns
    its digest."""
    if not path.is_file():
        raise ArtifactError(path, f"{path}: missing: pull it with `dvc pull {path}` (the slice is DVC-tracked, not on the Hub)")
    size = path.stat().st_size
    if size != dc["size_bytes"]:
        raise ArtifactError(path, f"{path}: {size} bytes, the manifest's device_check.size_bytes says {dc['size_bytes']}: "
                                  "truncated or wrong file")
    digest = sha256_file(path)
    if digest != dc["sha256"]:
        raise ArtifactError(path, f"{path}: SHA256 {digest} does not match the manifest's device_check.sha256 "
                                  f"{dc['sha256']}: file altered")
    return digest


def _shard_of(path: Path) -> bool:
    """``path`` looks like a shard inside its split folder (``<folder>/<folder>-0000i-of-0000N.gguf``)."""
    m = SHARD_RE.match(path.name)
    return bool(m) and m["stem"] == path.parent.name


VERIFY_SECTIONS = ("name", "build_id", "artifacts", "device_check")


def locate(path: str | Path, manifest: str | Path | None = None) -> tuple[Path, Path, dict]:
    """(the path to check -- a shard stands for its split file's folder --, the manifest's path, the manifest): the
    manifest given, else the one beside the file or split folder (for a shard, beside its folder)."""
    path = Path(path)
    shard = _shard_of(path)
    if manifest is not None:
        if not str(manifest):  # an explicit empty path is a mistake, not "the manifest beside the file"
            raise ArtifactError(manifest, "--manifest: an empty path")
        mpath = Path(manifest)
    else:
        mpath = path.parent / "manifest.json"
        if shard and not mpath.is_file():
            mpath = path.parent.parent / "manifest.json"
    if not mpath.exists():
        raise ArtifactError(mpath, f"{path}: no manifest at {mpath}")
    # one line naming the field when a part used below is missing, mistyped or a path; the rest is not looked at, so
    # that a manifest of an older build verifies as long as these parts do
    data = read_manifest(mpath, use=VERIFY_SECTIONS)
    names = {e["file"] for e in data["artifacts"]}
    if shard and path.name not in names and path.parent.name in names:
        path = path.parent  # a shard stands for its split file: every shard is checked
    return path, mpath, data


def verify(path: str | Path, manifest: str | Path | None = None) -> str:
    """Check a file (or a split file's folder or shard) against the manifest; return a one-line OK or raise."""
    path, _mpath, data = locate(path, manifest)
    return verify_located(path, data)


def verify_located(path: Path, data: dict) -> str:
    """:func:`verify` of a file :func:`locate` found, against its manifest ``data``."""
    if path.name.endswith(MAP_SUFFIX) and (owner := _map_entry(data, path.name)) is not None:
        digest = _check_map(path, owner)
        return f"OK  {path} (tensor-type map of {owner['file']}, sha256 {digest[:16]}…, build {data.get('build_id')})"
    dc = data.get("device_check") or {}
    if dc and path.name == dc.get("file"):
        digest = check_slice_file(path, dc)
        return (f"OK  {path} (device slice: {dc['chunks']} chunk(s) of {dc['eval_set']}, sha256 {digest[:16]}…, "
                f"build {data.get('build_id')})")
    entry = find_entry(data, path.name)
    if entry.get("split"):
        return _verify_split(path, entry, data)
    if not path.is_file():
        raise ArtifactError(path, f"{path}: missing (not pulled?)")
    size = path.stat().st_size
    if size != entry["size_bytes"]:
        raise ArtifactError(path, f"{path}: size {size} bytes, manifest says {entry['size_bytes']}: truncated or wrong file")
    digest = sha256_file(path)
    if digest != entry["sha256"]:
        raise ArtifactError(path, f"{path}: SHA256 {digest} does not match the manifest's {entry['sha256']}: file altered")
    facts = read_header(path).facts()
    if facts.quant_type != entry["quant_type"]:
        raise ArtifactError(path, f"{path}: GGUF says {facts.quant_type}, manifest says {entry['quant_type']}")
    for key in _HEADER_FACTS:  # the manifest's other header facts, where it has them
        if key in entry and getattr(facts, key) != entry[key]:
            raise ArtifactError(path, f"{path}: GGUF header says {key} {getattr(facts, key)!r}, manifest says {entry[key]!r}")
    return (f"OK  {path} ({entry['quant_type']}, {size} bytes, sha256 {digest[:16]}…, build {data.get('build_id')}"
            f"{_map_beside(path.parent, entry)})")


def _verify_split(folder: Path, entry: dict, data: dict) -> str:
    """Every shard of a split file: the exact set, sizes, SHA256s, headers and split keys, quant type,
    and the whole model's header facts summed over the shards."""
    shards = entry["split"]["shards"]
    n = len(shards)
    if not folder.is_dir():
        raise ArtifactError(folder, f"{folder}: missing (not pulled?): the manifest lists a folder of {n} shard(s)")
    for i, s in enumerate(shards, 1):  # cheap checks first: presence and size of every shard
        p = folder / s["file"]
        if not p.is_file():
            raise ArtifactError(p, f"{p}: shard {i} of {n} missing (not pulled?)")
    listed = {s["file"] for s in shards}
    extra = sorted(p.name for p in folder.iterdir() if p.name not in listed)
    if extra:
        raise ArtifactError(folder / extra[0], f"{folder / extra[0]}: not a shard the manifest lists ({n} shard(s): "
                                               f"{shards[0]['file']} ...): remove it or re-pull the folder")
    for i, s in enumerate(shards, 1):
        p = folder / s["file"]
        size = p.stat().st_size
        if size != s["size_bytes"]:
            raise ArtifactError(p, f"{p}: shard {i} of {n}: size {size} bytes, manifest says {s['size_bytes']}: "
                                   "truncated or wrong file")
    headers = []
    for i, s in enumerate(shards, 1):
        p = folder / s["file"]
        digest = sha256_file(p)
        if digest != s["sha256"]:
            raise ArtifactError(p, f"{p}: shard {i} of {n}: SHA256 {digest} does not match the manifest's {s['sha256']}: "
                                   "file altered")
        h = shard_header(p)
        check_header(p, h, i, n, entry["tensor_count"])
        if h["tensor_count"] != s["tensor_count"]:
            raise ArtifactError(p, f"{p}: shard {i} of {n}: {h['tensor_count']} tensors, manifest says {s['tensor_count']}")
        headers.append(h["header"])
    first = folder / shards[0]["file"]
    qt = file_type_name(headers[0].metadata.get("general.file_type"))
    if qt != entry["quant_type"]:
        raise ArtifactError(first, f"{first}: GGUF says {qt}, manifest says {entry['quant_type']}")
    tensors = [t for h in headers for t in h.tensors]
    n_params, n_bytes = sum(t.n_elements for t in tensors), sum(t.n_bytes for t in tensors)
    arch = headers[0].metadata.get("general.architecture", "")
    facts = {"gguf_version": headers[0].version, "tensor_count": len(tensors), "parameter_count": n_params,
             "architecture": arch if isinstance(arch, str) else str(arch),
             "bits_per_weight": round(n_bytes * 8 / n_params, 4) if n_params else 0.0}
    for key in _HEADER_FACTS:
        if key in entry and facts[key] != entry[key]:
            raise ArtifactError(folder, f"{folder}: the shards' GGUF headers say {key} {facts[key]!r} in all, manifest says "
                                        f"{entry[key]!r}")
    return (f"OK  {folder} ({entry['quant_type']}, {n} shard(s), {entry['size_bytes']} bytes, every SHA256 matches, "
            f"build {data.get('build_id')}{_map_beside(folder.parent, entry)})")
