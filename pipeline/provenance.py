"""Versions of the Python packages that touch the weights (recorded in stage records)."""

from __future__ import annotations

from importlib import metadata

WEIGHT_PACKAGES = ("torch", "transformers", "safetensors", "tokenizers", "huggingface_hub", "numpy", "gguf",
                   "sentencepiece", "autoawq")


def python_versions(packages=WEIGHT_PACKAGES) -> dict:
    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out
