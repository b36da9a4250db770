"""Stage convert: HF folder -> F16/BF16 GGUF with llama.cpp's ``convert_hf_to_gguf.py``.

The converter runs as a subprocess of the pinned (or user-provided) llama.cpp tree, with the gguf-py
vendored beside it. Its well-known failures become one clear line saying what to do.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from .errors import PipelineError
from .fsutil import atomic_output, write_json_atomic
from .provenance import python_versions
from .recipe import Recipe
from .tools import Toolchain, find_toolchain, run_converter, tail

# (pattern in the converter's output, message); the first match wins.
KNOWN_FAILURES = [
    (re.compile(r"BPE pre-tokenizer was not recognized"),
     "the tokenizer's BPE pre-tokenizer is unknown to llama.cpp b{build}; point LLAMA_CPP_DIR at a newer llama.cpp build"),
    (re.compile(r"Model (\S+) is not supported"),
     "architecture {0} is not supported by llama.cpp b{build}'s converter; point LLAMA_CPP_DIR at a newer llama.cpp build"),
    (re.compile(r"(?:SafetensorError|Error while deserializing header|incomplete metadata|header too large|"
                r"MetadataIncompleteBuffer|InvalidHeader\w*|Could not read complete metadata|"
                r"mmap length is greater than file size)"),
     "a safetensors file is corrupt or truncated ({0}); fetch the source again"),
    (re.compile(r"No such file or directory: '([^']*tokenizer[^']*)'|Can't load tokenizer|"
                r"tokenizer\.model not found|Error loading tokenizer"),
     "the tokenizer could not be loaded: check the source's tokenizer files"),
    (re.compile(r"No space left on device"), "no space left on device while writing the GGUF"),
]


def explain_failure(output: str, build: int) -> str:
    for rx, msg in KNOWN_FAILURES:
        m = rx.search(output)
        if m:
            groups = [g for g in m.groups() if g] or [m.group(0)]
            return msg.format(*groups, build=build)
    return f"convert_hf_to_gguf.py failed: {tail(output)}"


def gguf_metadata(recipe: Recipe, quantized_by: str) -> dict:
    """general.* keys written into the GGUF (and inherited by every quant)."""
    meta = {"general.quantized_by": quantized_by}
    src = recipe.source
    if src.repo:
        meta["general.name"] = src.repo.split("/", 1)[1]
        meta["general.source.url"] = f"https://huggingface.co/{src.repo}"
        meta["general.source.huggingface.repository"] = src.repo
    else:
        meta["general.name"] = recipe.name
    return meta


def _model_view(hf_dir: Path, view: Path, license: str | None) -> Path:
    """The folder the converter reads: ``hf_dir`` itself, or (when the recipe sets ``license``) a view
    of symlinks to its files with a model card whose front matter carries that license. The
    converter takes ``general.license`` only from the model card, not from --metadata."""
    if not license:
        return hf_dir
    import yaml

    view.mkdir()
    for item in hf_dir.iterdir():
        if item.name != "README.md" and not item.name.startswith("."):
            (view / item.name).symlink_to(item.resolve())
    card = hf_dir / "README.md"
    body = card.read_text(encoding="utf-8", errors="replace") if card.is_file() else ""
    front: dict = {}
    if body.startswith("---\n") and "\n---" in body[4:]:
        head, _, rest = body[4:].partition("\n---")
        try:
            loaded = yaml.safe_load(head)
        except yaml.YAMLError:
            loaded = None
        if isinstance(loaded, dict):
            front, body = loaded, rest.split("\n", 1)[1] if "\n" in rest else ""
    front["license"] = license
    (view / "README.md").write_text("---\n" + yaml.safe_dump(front, sort_keys=True) + "---\n" + body, encoding="utf-8")
    return view


def convert(recipe: Recipe, hf_dir: str | Path, out_gguf: str | Path, record: str | Path,
            log: str | Path | None = None, quantized_by: str = "ggufpipe", tc: Toolchain | None = None) -> dict:
    """Entry function: convert ``hf_dir`` to ``out_gguf`` (recipe.outtype); write ``record``."""
    tc = tc or find_toolchain()
    hf_dir, out_gguf, record = Path(hf_dir), Path(out_gguf), Path(record)
    log = Path(log) if log else None
    if not (hf_dir / "config.json").is_file():
        raise PipelineError(f"{recipe.path}: convert: {hf_dir} has no config.json (run the fetch stage first)")
    meta = gguf_metadata(recipe, quantized_by)
    with tempfile.TemporaryDirectory(prefix="ggufpipe-convert-") as tmpd, atomic_output(out_gguf) as tmp:
        meta_file = Path(tmpd) / "metadata.json"
        meta_file.write_text(json.dumps(meta))
        model_dir = _model_view(hf_dir, Path(tmpd) / "model", recipe.license)
        args = [str(model_dir), "--outfile", str(tmp), "--outtype", recipe.outtype, "--metadata", str(meta_file)]
        res = run_converter(tc, args, log)
        if res.returncode != 0 or not tmp.is_file():
            raise PipelineError(f"{recipe.path}: convert: {explain_failure(res.output, tc.build_number)}"
                                + (f" [log: {log}]" if log else ""))
    rec = {
        "outtype": recipe.outtype,
        "tool": "convert_hf_to_gguf.py",
        "toolchain": tc.describe(),
        "python": python_versions(),
        "gguf_metadata": meta,
        "seconds": round(res.seconds, 1),
    }
    write_json_atomic(record, rec)
    return rec
