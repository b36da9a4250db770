"""``ggufpipe device-check FILE --draft DRAFT`` (or ``--mtp``): the speed-up a published draft gives on this device,
measured the way the build box measured it (pipeline/stages/speedup.py) with the device's own ``llama-server``.

The pair must be one the manifest declares (its ``draft.pairs``), the draft file is verified against its own manifest,
and the draft length (with any p-min/n-min the build kept) is the one the build chose (``build.draft_speedup``, else
the acceptance stage's). The prompts are token ids from the device slice already checked (``device-slice.logits``
stores each chunk's tokens after its 20-byte header: tools/perplexity/perplexity.cpp), so the device needs no text
and no tokenizer: ``llama-server`` takes a prompt as a list of ids (tools/server/server-common.cpp:807-872). Greedy,
one slot, alternating rounds with and without the draft; the result is the median and min-max interval of the
per-round ratios, as on the build box.
"""

from __future__ import annotations

import struct
from pathlib import Path

from pipeline.distribution.verify import find_entry, locate, verify_located
from pipeline.errors import PipelineError
from pipeline.stages.speedup import alternate, condition, measure, server_args, servers, verdict

ROUNDS, PROMPTS, N_PREDICT, PROMPT_TOKENS = 3, 2, 48, 150
CTX = 1024  # a prompt of PROMPT_TOKENS and N_PREDICT tokens: small enough for any device that runs the model


def slice_prompts(path: Path, n: int, length: int) -> list[list[int]]:
    """The first ``length`` token ids of the slice's first ``n`` chunks (standard library: a device install)."""
    with open(path, "rb") as fh:
        magic, n_ctx, _n_vocab, n_chunk = struct.unpack("<8siii", fh.read(20))
        if magic != b"_logits_" or n_ctx < 1 or n_chunk < 1:
            raise PipelineError(f"{path}: not a llama-perplexity --kl-divergence-base file")
        k = min(n, n_chunk)
        ids = struct.unpack(f"<{k * n_ctx}i", fh.read(4 * k * n_ctx))
    return [list(ids[c * n_ctx:c * n_ctx + min(length, n_ctx)]) for c in range(k)]


def find_pair(mpath: Path, data: dict, main_file: str, draft_file: str | None) -> dict:
    """The manifest's declared pair of ``main_file`` and ``draft_file`` (None: the MTP heads inside the main file)."""
    d = data.get("draft")
    if not d:
        raise PipelineError(f"{mpath}: no draft section: the build declares no draft for {main_file}")
    want = draft_file or main_file
    pairs = d.get("pairs", [])
    pair = next((p for p in pairs if p.get("main") == main_file and p.get("draft") == want), None)
    if pair is None:
        have = ", ".join(f"{p.get('main')} + {p.get('draft')}" for p in pairs) or "none"
        raise PipelineError(f"{mpath}: {main_file} + {want} is not a pair the build declares (draft.pairs: {have})")
    if not pair.get("compatible") or "acceptance" not in pair:
        raise PipelineError(f"{mpath}: the pair {main_file} + {want} was not measured on the build box "
                            f"({pair.get('reason') or 'not published'})")
    return pair


def draft_model(draft: str | Path) -> tuple[Path, str]:
    """(what llama.cpp loads, the published file name) of a draft file verified against the manifest beside it."""
    path, _mpath, ddata = locate(draft)
    verify_located(path, ddata)
    entry = find_entry(ddata, path.name)
    model = path / entry["split"]["shards"][0]["file"] if entry.get("split") else path
    return model, entry["file"]


def prepare(mpath: Path, data: dict, entry: dict, draft: str | Path | None) -> dict:
    """Everything the measurement needs, checked before any work: the draft verified, the pair declared and measured
    on the build box, its draft length and speculative type."""
    dmodel, dfile = draft_model(draft) if draft is not None else (None, None)
    pair = find_pair(mpath, data, entry["file"], dfile)
    label = f"{pair['main']} + {pair['draft']}"
    built = ((data.get("build") or {}).get("draft_speedup") or {}).get(label) or {}
    return {"draft_model": dmodel, "pair": label, "built": built, "flags": tuple(built.get("best_flags", [])),
            "n_max": built.get("best_n_max") or pair["acceptance"]["best_n_max"],
            "spec_type": data["draft"].get("spec_type") or pair["acceptance"].get("spec_type") or "draft-simple"}


def draft_speedup(tc, model: Path, spec: dict, slice_path: Path, threads: int, label: str) -> dict:
    """The result's ``speedup`` (``spec``: :func:`prepare`'s): the pair, its draft length, the per-round rates, the
    median and interval, and the build box's figures for comparison."""
    n_max, prompts = spec["n_max"], slice_prompts(slice_path, PROMPTS, PROMPT_TOKENS)
    what = f"device speed-up of {spec['pair']}"

    def args(n):
        return server_args(model, spec["draft_model"], spec["spec_type"], n, threads, 1, ctx=CTX, flags=spec["flags"])

    with servers(tc, {None: args(None), n_max: args(n_max)}, None, what) as urls:
        got = alternate([None, n_max], ROUNDS, lambda n, i: measure(
            urls[n], prompts, N_PREDICT, f"{what} ({'baseline' if n is None else f'n_max {n}'}, round {i + 1})"))
    c = condition([(g[n_max], g[None]) for g in got])
    helps, line = verdict(c["speedup"], c["interval"], n_max, label)
    out = {"pair": spec["pair"], "n_max": n_max, "flags": list(spec["flags"]), "spec_type": spec["spec_type"],
           "rounds": ROUNDS, "prompts": len(prompts), "prompt_tokens": PROMPT_TOKENS, "n_predict": N_PREDICT, **c,
           "helps": helps, "verdict": line}
    if "speedup" in spec["built"]:
        out["build_box"] = {k: spec["built"][k] for k in ("speedup", "interval", "box")}
    return out
