"""Facts read back from a GGUF file: the manifest's per-file facts and ``general.*`` metadata (parsed by the
stdlib header reader, pipeline.ggufheader), and gguf-py's GGUFReader (``open_reader``) for the few callers
that need decoded arrays or tensor data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import PipelineError
from .fsutil import sha256_file

GGUF_MAGIC = b"GGUF"


@dataclass
class GGUFFacts:
    file: str
    quant_type: str
    sha256: str
    size_bytes: int
    bits_per_weight: float
    gguf_version: int
    tensor_count: int
    parameter_count: int
    architecture: str

    def as_dict(self) -> dict:
        return asdict(self)


def file_type_name(value: int | None) -> str:
    """``general.file_type`` number -> llama-quantize type name (e.g. 15 -> Q4_K_M)."""
    import gguf

    if value is None:
        return "UNKNOWN"
    try:
        name = gguf.LlamaFileType(int(value)).name
    except ValueError:
        return f"UNKNOWN({int(value)})"
    if name.startswith("MOSTLY_"):
        return name[len("MOSTLY_"):]
    return {"ALL_F32": "F32"}.get(name, name)


def open_reader(path: str | Path):
    """A GGUFReader for ``path``, or a PipelineError saying plainly why it cannot be read."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise PipelineError(f"{path}: cannot read: {exc.strerror}") from None
    if magic != GGUF_MAGIC:
        raise PipelineError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except ValueError as exc:
        msg = str(exc)
        if "GGMLQuantizationType" in msg or "is not a valid" in msg:
            raise PipelineError(
                f"{path}: the installed gguf package does not know a tensor type in this file ({msg}); "
                "install the gguf-py of the pinned llama.cpp"
            ) from None
        raise PipelineError(f"{path}: unreadable GGUF ({msg or type(exc).__name__}): truncated or corrupt") from None
    except (OSError, IndexError, KeyError, EOFError, MemoryError, OverflowError) as exc:
        raise PipelineError(f"{path}: unreadable GGUF ({type(exc).__name__}: {exc}): truncated or corrupt") from None


def field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except (ValueError, IndexError):
        return default


def read_facts(path: str | Path, with_sha256: bool = True) -> GGUFFacts:
    """What the manifest records of a GGUF. Parsed by the stdlib header reader (pipeline.ggufheader):
    gguf-py's GGUFReader decodes every vocabulary entry into numpy views and took 4 s per file on the demo's
    49k-token vocabulary (a publish opened nine: 23 s of a 121 s demo build); tests/integration/test_device.py checks both
    give the same facts on real files."""
    from .ggufheader import read_header

    path = Path(path)
    return read_header(path).facts(sha256_file(path) if with_sha256 else "")


def general_metadata(path: str | Path) -> dict:
    """The ``general.*`` scalar and string keys of a GGUF (name, quantized_by, source url, license...)."""
    from .ggufheader import read_header

    return {k: v for k, v in read_header(path).metadata.items()
            if k.startswith("general.") and k not in ("general.file_type", "general.quantization_version")
            and isinstance(v, (str, int, float))}
