"""Facts read back from a GGUF file (light dependencies only: numpy + gguf).

Used by the manifest stage on the build box and by ``verify`` on devices.
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
    path = Path(path)
    r = open_reader(path)
    version = field(r, "GGUF.version")
    n_params = sum(int(t.n_elements) for t in r.tensors)
    n_bytes = sum(int(t.n_bytes) for t in r.tensors)
    size = path.stat().st_size
    if r.tensors:
        end = max(int(t.data_offset) + int(t.n_bytes) for t in r.tensors)
        if end > size:
            raise PipelineError(f"{path}: truncated GGUF: tensor data ends at byte {end}, file has {size}")
    return GGUFFacts(
        file=path.name,
        quant_type=file_type_name(field(r, "general.file_type")),
        sha256=sha256_file(path) if with_sha256 else "",
        size_bytes=size,
        bits_per_weight=round(n_bytes * 8 / n_params, 4) if n_params else 0.0,
        gguf_version=int(version) if version is not None else 0,
        tensor_count=len(r.tensors),
        parameter_count=n_params,
        architecture=str(field(r, "general.architecture", "")),
    )


def general_metadata(path: str | Path) -> dict:
    """The ``general.*`` string keys of a GGUF (name, quantized_by, source url, license...)."""
    r = open_reader(path)
    out = {}
    for key in r.fields:
        if key.startswith("general.") and key not in ("general.file_type", "general.quantization_version"):
            val = field(r, key)
            if isinstance(val, (str, int, float)):
                out[key] = val
    return out
