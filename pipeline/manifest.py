"""Stage manifest: ``artifacts/<name>/manifest.json`` describing every artifact of a recipe.

The manifest is deterministic: identical inputs give byte-identical manifests except for the
``build.timestamp`` field, which is kept apart in its own section. ``build_id`` is derived from the
inputs (recipe file, source commit and file hashes, tool versions), so one set of inputs always
names the same version.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from .errors import PipelineError
from .fsutil import write_json_atomic
from .ggufinfo import general_metadata, read_facts
from .recipe import Recipe

SCHEMA_VERSION = 1


def _load(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise PipelineError(f"manifest: cannot read stage record {path}: {exc}") from None


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def source_files_digest(files: dict) -> str:
    """One SHA256 over the fetched files' names and SHA256s."""
    return hashlib.sha256(_canonical({k: v["sha256"] for k, v in sorted(files.items())})).hexdigest()


def build_id(recipe: Recipe, source: dict, tools: dict) -> str:
    digest = hashlib.sha256(_canonical({"recipe": recipe.sha256, "source": source, "tools": tools})).hexdigest()
    return f"{recipe.name}-{digest[:12]}"


def timestamp() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    t = int(epoch) if epoch and epoch.isdigit() else int(time.time())
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def build_manifest(recipe: Recipe, artifacts_dir: str | Path, fetch_record: str | Path,
                   convert_record: str | Path, quant_records: dict[str, str | Path]) -> dict:
    artifacts_dir = Path(artifacts_dir)
    fetched = _load(Path(fetch_record))
    converted = _load(Path(convert_record))
    source = dict(fetched["source"])
    source["files_sha256"] = source_files_digest(fetched["files"])
    tools = {**converted["toolchain"], "python": converted.get("python", {})}
    tools.pop("origin", None)

    base_path = artifacts_dir / recipe.base_file
    base = read_facts(base_path)
    if base.quant_type != recipe.outtype.upper():
        raise PipelineError(f"{base_path}: general.file_type says {base.quant_type}, recipe asks for {recipe.outtype.upper()}")
    entries = [{**base.as_dict(), "role": "base"}]
    for q in recipe.quants:
        path = artifacts_dir / recipe.file_for(q.key)
        rec = _load(Path(quant_records[q.key]))
        facts = read_facts(path)
        if facts.quant_type != q.type:
            raise PipelineError(f"{path}: general.file_type says {facts.quant_type}, recipe asks for {q.type}")
        entry = {**facts.as_dict(), "role": "quant", "requested": rec["quant"]}
        entries.append(entry)

    manifest = {
        "schema_version": SCHEMA_VERSION,
        "name": recipe.name,
        "build_id": build_id(recipe, source, tools),
        "recipe": {"name": recipe.name, "file": recipe.path.name, "sha256": recipe.sha256},
        "source": source,
        "tools": tools,
        "gguf_metadata": general_metadata(base_path),
        "artifacts": entries,
        "build": {"timestamp": timestamp()},
    }
    return manifest


def write_manifest(recipe: Recipe, artifacts_dir: str | Path, fetch_record: str | Path,
                   convert_record: str | Path, quant_records: dict[str, str | Path], out: str | Path) -> dict:
    """Entry function: build the manifest and write it atomically to ``out``."""
    manifest = build_manifest(recipe, artifacts_dir, fetch_record, convert_record, quant_records)
    write_json_atomic(out, manifest)
    return manifest


def strip_volatile(manifest: dict) -> dict:
    """The manifest without its build timestamp: equal for identical builds."""
    return {k: v for k, v in manifest.items() if k != "build"}
