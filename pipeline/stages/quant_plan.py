"""What llama-quantize will write per tensor, and the check that it did (issue #19, docs/quantization.md).

Before a quant is written, ``llama-quantize --dry-run`` with the same arguments (tools/quantize/quantize.cpp:447)
runs the same type selection as the real run (src/llama-quant.cpp:1121-1126 calls ``llama_tensor_get_type``:
flags, patterns, the type's heuristics, shape fallback) and prints one line per tensor
(src/llama-quant.cpp:1227-1256) and, earlier, one line per shape fallback (src/llama-quant.cpp:397-440). From
those this module makes the *plan*: each tensor's type, what the recipe asked for it and why they differ; the
recipe's patterns are checked against the base file's tensor names (none may match nothing or be shadowed), and the
file's size is predicted: the output header (:func:`predict_header`) plus, per tensor, its rows times the row size
of its type, padded to the alignment. After the run the written file is read back: every tensor's type must be
the planned one and its size the predicted one, to the byte.
"""

from __future__ import annotations

import re
from collections import Counter

from pipeline.errors import PipelineError
from pipeline.gguf.reader import GGUFHeader
from pipeline.gguf.types import GGML_TYPE_CODES, padded_nbytes

# "[  3/ 272] blk.0.attn_k.weight - [  576,  192,  1,  1], type =    f16, size =  0.21 MiB ->  0.07 MiB (q5_0)";
# a tensor kept as it is ends at "size = 0.002 MiB"
_TENSOR_LINE = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[([\d,\s]+)\], type =\s*(\S+), size =\s*[\d.]+ MiB"
                          r"(?:\s*->\s*[\d.]+ MiB \((\S+)\))?\s*$", re.M)
_FALLBACK_LINE = re.compile(r"^warning: (\S+)\s+- ncols\s+(\d+) not divisible by\s+(\d+) \(required for type\s+(\S+)\) "
                            r"(?:\(WARNING: must use F16 due to unusual shape\) )?-> falling back to\s+(\S+)", re.M)
# llama-quantize keeps these tensors' types whatever a pattern says (src/llama-quant.cpp:287-330, abridged)
_KEPT_REASON = "not quantized: llama-quantize keeps 1-D, norm and a few named tensors as they are (src/llama-quant.cpp:287)"


def _type(name: str) -> str:
    t = name.upper()
    if t not in GGML_TYPE_CODES:
        raise PipelineError(f"llama-quantize --dry-run printed a ggml type this reader does not know: {name}")
    return t


def parse_dry_run(output: str) -> tuple[dict[str, dict], dict[str, dict]]:
    """(tensors, fallbacks) from a ``--dry-run``'s output: name -> {shape, source, type, quantized}; name -> {ncols, block,
    required, fallback}."""
    tensors = {}
    for m in _TENSOR_LINE.finditer(output):
        shape = tuple(int(x) for x in m.group(2).split(","))
        while len(shape) > 1 and shape[-1] == 1:
            shape = shape[:-1]
        src = _type(m.group(3))
        tensors[m.group(1)] = {"shape": shape, "source": src, "type": _type(m.group(4)) if m.group(4) else src,
                               "quantized": m.group(4) is not None}
    fallbacks = {m.group(1): {"ncols": int(m.group(2)), "block": int(m.group(3)), "required": _type(m.group(4)),
                              "fallback": _type(m.group(5))} for m in _FALLBACK_LINE.finditer(output)}
    return tensors, fallbacks


def check_patterns(patterns: list[tuple[str, str, str]], names: list[str], where: str) -> None:
    """Refuse, in one line, a pattern that matches no tensor name or only names an earlier pattern took."""
    taken: set[str] = set()
    for i, (pattern, _, origin) in enumerate(patterns):
        rx = re.compile(pattern)
        hits = [n for n in names if rx.search(n)]
        if not hits:
            raise PipelineError(f"{where}: {origin}: pattern {pattern!r} matches no tensor of the base file")
        if all(n in taken for n in hits):
            earlier = next(o for p, _, o in patterns[:i] if re.search(p, hits[0]))
            raise PipelineError(f"{where}: {origin}: pattern {pattern!r} is shadowed by {earlier} (the first match "
                                f"wins): it would apply to none of its {len(hits)} tensors, e.g. {hits[0]}")
        taken.update(hits)


def plan(q, output: str, where: str) -> dict:
    """The plan of quant ``q`` from its dry run's ``output``: per tensor the type llama-quantize will write and what
    the recipe asked, the histogram, and the tensors whose type differs from what was asked, with the reason."""
    tensors, fallbacks = parse_dry_run(output)
    if not tensors:
        raise PipelineError(f"{where}: llama-quantize --dry-run listed no tensor (its output format changed?)")
    patterns = [(p, t, o, re.compile(p)) for p, t, o in q.tensor_patterns()]
    flags = {"token_embd.weight": ("token_embedding_type", q.token_embedding_type),
             "per_layer_token_embd.weight": ("token_embedding_type", q.token_embedding_type),
             "output.weight": ("output_tensor_type", q.output_tensor_type)}
    groups: dict[tuple, dict] = {}  # the differing tensors by cause: (asked, asked_by, written, reason)
    for name, t in tensors.items():
        written, fb = t["type"], fallbacks.get(name)
        hit = next(((typ, origin) for _, typ, origin, rx in patterns if rx.search(name)), None)
        flag_key, flag_type = flags.get(name, ("", None))
        if hit and flag_type and not (name == "per_layer_token_embd.weight" and flag_key == "token_embedding_type"):
            asked, by, reason = hit[0], hit[1], f"flag precedence: {flag_key} {flag_type} applies before any pattern"
        elif hit:
            asked, by, reason = hit[0], hit[1], ""
        elif flag_type:
            asked, by, reason = flag_type.upper(), flag_key, ""
        else:
            asked, by, reason = (fb["required"] if fb else written), q.type, ""
        if fb and not reason:
            if fb["fallback"] != written:
                raise PipelineError(f"{where}: llama-quantize --dry-run: {name} falls back to {fb['fallback']} but "
                                    f"is listed as {written}")
            reason = (f"shape fallback: row length {fb['ncols']} is not a multiple of {fb['block']} "
                      f"(the block of {fb['required']})")
            if fb["required"] != asked:
                reason += f"; {asked} became {fb['required']} by the {q.type} heuristics first"
        if not reason and written != asked:
            if written == t["source"]:
                reason = _KEPT_REASON
            else:
                raise PipelineError(f"{where}: llama-quantize will write {name} as {written}, the recipe asks {asked} "
                                    f"({by}) and no reason is known: refusing to build a quant that does not do "
                                    "what its recipe says")
        if written != asked:
            groups.setdefault((asked, by, written, reason), {"asked": asked, "asked_by": by, "written": written,
                                                              "reason": reason, "tensors": []})["tensors"].append(name)
    return {
        "tensors": {n: {"shape": list(t["shape"]), "type": t["type"]} for n, t in tensors.items()},
        "histogram": dict(sorted(Counter(t["type"] for t in tensors.values()).items())),
        # one entry per cause, in the order of its first tensor; every differing tensor in exactly one
        "differs": list(groups.values()),
    }


def differs_by_tensor(groups: list[dict]) -> dict[str, dict]:
    """tensor name -> its entry (``tensor``, ``asked``, ``asked_by``, ``written``, ``reason``) of grouped
    ``differs``."""
    return {t: {"tensor": t, **{k: v for k, v in g.items() if k != "tensors"}} for g in groups for t in g["tensors"]}


def _kv_bytes(key: str, value_bytes: int) -> int:
    return 8 + len(key.encode()) + 4 + value_bytes  # key (u64 length + bytes), value type (u32), value


def predict_header(base: GGUFHeader, imatrix_file: str | None = None, imatrix: GGUFHeader | None = None) -> int:
    """The output header's bytes, as llama-quantize makes it (src/llama-quant.cpp:1021-1049): the base file's
    key/values, ``general.quantization_version`` and ``general.file_type`` set (u32), the split keys removed, and
    with an importance matrix the four ``quantize.imatrix.*`` keys (tools/quantize/quantize.cpp:508-539: the file
    name as given and the first dataset, each cut to 127 bytes); then the tensor infos (ggml/src/gguf.cpp: name,
    n_dims, ne, type, offset), padded to the alignment."""
    spans = base.kv_spans
    kv = {k: end - start for k, (start, end) in spans.items()}
    for k in ("split.no", "split.count", "split.tensors.count"):
        kv.pop(k, None)
    for k in ("general.quantization_version", "general.file_type"):
        kv[k] = _kv_bytes(k, 4)
    if imatrix_file is not None:
        kv["quantize.imatrix.file"] = _kv_bytes("quantize.imatrix.file", 8 + len(imatrix_file.encode()[:127]))
        datasets = imatrix.get("imatrix.datasets") if imatrix is not None else None
        if datasets:
            kv["quantize.imatrix.dataset"] = _kv_bytes("quantize.imatrix.dataset", 8 + len(str(datasets[0]).encode()[:127]))
        for k in ("quantize.imatrix.entries_count", "quantize.imatrix.chunks_count"):
            kv[k] = _kv_bytes(k, 4)
    size = 4 + 4 + 8 + 8 + sum(kv.values())
    for t in base.tensors:
        dims = list(t.shape)
        while len(dims) > 1 and dims[-1] == 1:  # ggml_n_dims
            dims.pop()
        size += 8 + len(t.name.encode()) + 4 + 8 * len(dims) + 4 + 8
    return (size + base.alignment - 1) // base.alignment * base.alignment


def predicted_bytes(planned: dict, header_bytes: int, alignment: int) -> int:
    """Σ align(rows × row_size(type, ne0)) over the planned tensors, plus the output header's bytes."""
    return header_bytes + sum(padded_nbytes(t["type"], t["shape"], alignment) for t in planned["tensors"].values())


def check_written(planned: dict, header_bytes: int, written: GGUFHeader, where: str) -> dict:
    """Compare the written file with the plan: every tensor's type read back, and its size to the byte
    (``header_bytes``: :func:`predict_header`). Returns the record's ``bytes`` section (predicted = written)."""
    got = {t.name: t.type_name for t in written.tensors}
    want = {n: t["type"] for n, t in planned["tensors"].items()}
    if set(got) != set(want):
        odd = sorted(set(got) ^ set(want))
        raise PipelineError(f"{where}: {written.path.name} holds other tensors than llama-quantize --dry-run listed "
                            f"({len(odd)} differ, e.g. {odd[0]})")
    wrong = [n for n in want if got[n] != want[n]]
    if wrong:
        raise PipelineError(f"{where}: {written.path.name}: {len(wrong)} tensor(s) written as another type than the "
                            f"dry run said, e.g. {wrong[0]}: {got[wrong[0]]}, planned {want[wrong[0]]}")
    predicted = predicted_bytes(planned, header_bytes, written.alignment)
    if (predicted, header_bytes) != (written.file_size, written.data_offset):
        raise PipelineError(f"{where}: {written.path.name} is {written.file_size} bytes (header {written.data_offset}), "
                            f"the plan predicts {predicted} (header {header_bytes})")
    return {"header": header_bytes, "tensor_data": predicted - header_bytes, "predicted": predicted,
            "written": written.file_size}
