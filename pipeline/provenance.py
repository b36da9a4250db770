"""Versions of the Python packages that touch the weights (recorded in stage records), and the digest of the
fetched source files (manifest, hub, rebuild-check)."""

from __future__ import annotations

import hashlib
import json

from pipeline.envs import current, env_versions

WEIGHT_PACKAGES = ("torch", "transformers", "safetensors", "tokenizers", "huggingface_hub", "numpy", "gguf",
                   "sentencepiece", "protobuf", "autoawq", "llmcompressor", "compressed-tensors")


def python_versions(packages=WEIGHT_PACKAGES, env: str | None = None) -> dict:
    """The installed versions of ``packages`` (those installed) in environment ``env`` (pipeline/envs.py; this
    process's own by default)."""
    if env is not None and env != current():
        return env_versions(env, tuple(packages))
    from importlib import metadata  # 15 ms (the email package): every stage process loads this module, few call this

    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def source_files_digest(files: dict) -> str:
    """One SHA256 over the fetched files' names and SHA256s."""
    canonical = json.dumps({k: v["sha256"] for k, v in sorted(files.items())}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
