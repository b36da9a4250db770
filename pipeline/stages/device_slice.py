"""Stage device-slice: the eval slice a device re-measures with ``ggufpipe device-check`` (pipeline/devices/check.py).

The slice is the first ``device_slice`` chunks (1 or 2) of the recipe's first eval set, published as their base logits
(``device-slice.logits``: llama-perplexity's ``--kl-divergence-base`` file, which carries the chunks' tokens, so a
device needs no text and no tokenizer). It is cut from the eval set's base logits (:func:`write_slice`): a
``--kl-divergence-base`` run evaluates each chunk alone, so the first N chunks of a 16-chunk file are the file a run
over N chunks writes (tests/e2e/test_device_check.py compares the bytes).

The build box's slice values come from runs it makes anyway: each quant's eval row N (the running statistics after
chunk N, :func:`pipeline.stages.evaluate.parse_chunk_rows`, the same accumulators a run over N chunks ends with); the
base file's own value (its KLD against its own logits: not 0, the logits are stored as 16-bit steps) from one run
here, which also proves llama-perplexity reads the slice.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.fsutil import atomic_output, sha256_file
from pipeline.recipe import EvalSet, scored_tokens
from pipeline.records import DeviceSliceRecord, EvalBaseRecord
from pipeline.stagedef import Stage, mem_mb
from pipeline.stages.evaluate import eval_fields, kl_divergence, restore_base_logits
from pipeline.tools import Toolchain, find_toolchain


def write_slice(src: str | Path, dst: str | Path, chunks: int) -> dict:
    """The first ``chunks`` chunks of the base-logits file ``src`` (read and checked by
    :func:`pipeline.stages.logitsfile.read_logits_file`) as a base-logits file of their own, written atomically to
    ``dst``: the header with ``n_chunk = chunks``, their tokens, their records. Returns its facts."""
    # logitsfile loads numpy: only cutting the slice needs it
    from pipeline.stages.logitsfile import expected_size, read_logits_file, write_header

    src, dst = Path(src), Path(dst)
    f = read_logits_file(src)
    if not 1 <= chunks <= f.n_chunk:
        raise PipelineError(f"{src}: holds {f.n_chunk} chunks, the slice asks for {chunks}")
    with atomic_output(dst) as tmp, open(tmp, "wb") as fout:
        write_header(fout, f.n_ctx, f.n_vocab, chunks)
        f.tokens[:chunks * f.n_ctx].tofile(fout)
        f.records[:chunks].tofile(fout)  # from the memory map, chunk-major: no copy in memory
    want = expected_size(f.n_ctx, f.n_vocab, chunks)
    if dst.stat().st_size != want:
        raise PipelineError(f"{dst}: written with {dst.stat().st_size} bytes, expected {want}")
    return {"n_ctx": f.n_ctx, "n_vocab": f.n_vocab, "chunks": chunks}


def device_slice(recipe_name: str, es: EvalSet, chunks: int, base_gguf: str | Path, base_logits: str | Path,
                 base_record: str | Path, out_logits: str | Path, record: str | Path, threads: int = 2,
                 log: str | Path | None = None, tc: Toolchain | None = None) -> dict:
    """Entry function: cut the slice from the eval set's base logits (recomputed first when ``ggufpipe clean-logits``
    emptied them) and measure the base file on it."""
    tc = tc or find_toolchain()
    what = f"{recipe_name}: device slice ({chunks} chunk(s) of eval set {es.name})"
    base = EvalBaseRecord.read(base_record, "device_slice")
    restore_base_logits(tc, es, base_gguf, base_logits, base_record, threads, log, what)
    facts = write_slice(base_logits, out_logits, chunks)
    if facts["n_ctx"] != es.ctx:
        raise PipelineError(f"{what}: {base_logits} was written at n_ctx {facts['n_ctx']}, the eval set has ctx {es.ctx}")
    metrics, res = kl_divergence(tc, dataclasses.replace(es, chunks=chunks), base_gguf, out_logits, threads, log, what)
    rec = DeviceSliceRecord(eval_set=es.name, text=base.text, text_sha256=base.text_sha256, ctx=es.ctx, chunks=chunks,
                            scored_tokens=scored_tokens(es.ctx, chunks), n_vocab=facts["n_vocab"],
                            file=Path(out_logits).name, sha256=sha256_file(out_logits),
                            size_bytes=Path(out_logits).stat().st_size, threads=threads, base_metrics=metrics,
                            seconds=round(res.seconds, 1))
    rec.write(record)
    return rec.to_dict()


def _run(j) -> None:
    r, i = j.recipe, j.input
    device_slice(r.name, r.first_eval_set, r.device_slice, i["base"], i["logits"], i["base_record"], j.output["logits"],
                 j.output["record"], threads=j.threads, log=j.log)


def _inputs(r, wc, L) -> dict:
    es = r.first_eval_set.name
    return {"base": L.base_gguf(r), "logits": L.base_logits(r.name, es), "base_record": L.base_record(r.name, es)}


def _trigger(r, wc, s) -> dict:
    return {"chunks": r.device_slice, "eval": eval_fields(r, r.first_eval_set.name, s), "commit": s.commit}


STAGE = Stage(
    "device_slice", "device-slice", order=52, log="device-slice", threads="eval_threads", capped=True, run=_run,
    inputs=_inputs, outputs=lambda L: {"logits": L.device_slice("{name}"), "record": L.device_slice_record("{name}")},
    trigger=_trigger,
    # the slice of the base logits (at most their size) and one llama-perplexity run of the base file on it
    resources={"mem_mb": lambda s: mem_mb(s.mb("base"), 1.3, 1024), "disk_mb": lambda s: mem_mb(s.mb("logits"), 1.0, 64),
               "runtime": lambda s: int(30 + s.mb("base") / 100)},
)
