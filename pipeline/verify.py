"""Device-side check of a pulled GGUF against its manifest, with the standard library only.

A device install (``pip install '.[device]'``: DVC, no numpy, no gguf, no torch) runs this through
``ggufpipe verify``; the GGUF header is read by :mod:`pipeline.ggufheader`, whose type tables are those of the
pinned llama.cpp.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import PipelineError
from .fsutil import sha256_file
from .ggufheader import read_header

# Facts of the manifest entry that the header must match besides the quant type (pipeline.ggufinfo.GGUFFacts).
_HEADER_FACTS = ("gguf_version", "tensor_count", "parameter_count", "architecture", "bits_per_weight")


def find_entry(manifest: dict, filename: str) -> dict:
    for entry in manifest.get("artifacts", []):
        if entry.get("file") == filename:
            return entry
    raise PipelineError(f"{filename} is not listed in the manifest of {manifest.get('name', '?')}")


def verify(path: str | Path, manifest: str | Path | None = None) -> str:
    """Check size, SHA256, GGUF header and quant type; return a one-line OK or raise."""
    path = Path(path)
    mpath = Path(manifest) if manifest else path.parent / "manifest.json"
    try:
        data = json.loads(mpath.read_text())
    except OSError:
        raise PipelineError(f"{path}: no manifest at {mpath}") from None
    except ValueError as exc:
        raise PipelineError(f"{mpath}: not valid JSON: {exc}") from None
    entry = find_entry(data, path.name)
    if not path.is_file():
        raise PipelineError(f"{path}: missing (not pulled?)")
    size = path.stat().st_size
    if size != entry["size_bytes"]:
        raise PipelineError(f"{path}: size {size} bytes, manifest says {entry['size_bytes']}: truncated or wrong file")
    digest = sha256_file(path)
    if digest != entry["sha256"]:
        raise PipelineError(f"{path}: SHA256 {digest} does not match the manifest's {entry['sha256']}: file altered")
    facts = read_header(path).facts()
    if facts.quant_type != entry["quant_type"]:
        raise PipelineError(f"{path}: GGUF says {facts.quant_type}, manifest says {entry['quant_type']}")
    for key in _HEADER_FACTS:  # the manifest's other header facts, where it has them
        if key in entry and getattr(facts, key) != entry[key]:
            raise PipelineError(f"{path}: GGUF header says {key} {getattr(facts, key)!r}, manifest says {entry[key]!r}")
    return f"OK  {path} ({entry['quant_type']}, {size} bytes, sha256 {digest[:16]}…, build {data.get('build_id')})"
