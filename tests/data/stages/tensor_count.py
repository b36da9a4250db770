"""A stage added by one file (tests/e2e/test_add_stage.py copies it into pipeline/stages/): the base GGUF's tensor
count and vocabulary size as a record. Everything the workflow needs is the declaration below."""

from __future__ import annotations

import json

from pipeline.fsutil import write_text_atomic
from pipeline.gguf import read_header
from pipeline.stagedef import Stage


def tensor_count(base_gguf: str, record: str) -> dict:
    h = read_header(base_gguf)
    rec = {"tensors": len(h.tensors), "n_vocab": h.metadata["tokenizer.ggml.tokens"].count}
    write_text_atomic(record, json.dumps(rec, indent=1) + "\n")
    return rec


STAGE = Stage(
    "tensor_count", "tensor-count", order=25, log="tensor-count",
    run=lambda j: tensor_count(j.input["base"], j.output["record"]),
    inputs=lambda r, wc, L: {"base": L.base_gguf(r)},
    outputs=lambda L: {"record": L.wrk("{name}", "records", "tensor-count.json")},
    trigger=lambda r, wc, s: {"build": s.build_number},
    resources={"mem_mb": 512, "disk_mb": 64, "runtime": 5},
)
