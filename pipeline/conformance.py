"""Stage conformance: prove that the base GGUF is the Hugging Face model it was converted from (issue #15).

Four checks, each comparing the HF side (transformers on the fetched folder; remote code only when the recipe
opts in) with the llama.cpp side (the ``ggufpipe-conformance`` helper of the pinned build: llama.cpp's own
tokenizer, chat-template engine and EOG set, on the GGUF loaded vocab-only; one process for all requests):

1. **tokenizer parity** on the probes of ``data/conformance/probes.txt``, every added/special token of the HF
   tokenizer (alone, and all of them in running text) and a 2,000-character slice of the first eval text, in
   three modes: (a) no specials added, special text parsed (HF ``add_special_tokens=False``; llama.cpp
   ``add_special=false parse_special=true``): pre-tokenizer, normalizer and merges; (b) each side's defaults
   (``add_special_tokens=True`` / ``add_special=true``): a probe that differs only here is a "BOS/EOS policy
   differs" failure; (c) special text not parsed (HF ``split_special_tokens=True`` / ``parse_special=false``).
2. **logit fidelity**: the HF model in float32 on the token ids of eval-base's ``--kl-divergence-base`` file
   (pipeline/logitsfile.py), first ``chunks`` chunks, BOS substituted at each chunk's first position when the
   GGUF adds one (as llama-perplexity does); per scored position: top-1 agreement, KLD(llama.cpp base || HF)
   with llama.cpp's own rule (only base tokens with log-prob > -16, perplexity.cpp:229), mean and p99, and the
   PPL of both sides over the same positions. FIXED thresholds (:data:`THRESHOLDS`, an F16/BF16 GGUF against
   HF float32), not recipe keys. Run only when 4 x parameters + 2 GiB fits in MemAvailable. With an AWQ-folded
   folder, the same numbers of that folder against the original HF model (recorded, not gated).
3. **chat template**: the conversations of ``data/conformance/conversations.json`` rendered by transformers'
   ``apply_chat_template`` and by llama.cpp's ``common_chat_templates_apply``: identical text after llama.cpp's
   own normalisations (one leading ``bos_token`` text stripped when the vocab adds BOS, one trailing
   ``eos_token`` text when it adds EOS: common/chat.cpp:958-964; a system message merged into the next one for
   a template without a system role, chat.cpp:1016-1030), identical model input ids (HF: the rendered text
   tokenized without specials, what ``apply_chat_template(tokenize=True)`` returns; llama.cpp: its prompt
   tokenized with ``add_special=true parse_special=true``, as llama-server does), no double BOS, no BOS/EOS that
   llama.cpp adds where HF has none; a conversation rejected by one engine must be rejected by both.
4. **end of generation**: every id of HF ``generation_config.json`` ``eos_token_id`` (``config.json``'s when
   that file is absent) and the template's turn-end token must be in llama.cpp's EOG set; a GGUF EOS that HF
   never stops on is a warning.

Dates: both engines get ``date_string`` = the pinned date of conversations.json. llama.cpp b11312's
``strftime_now`` reads the wall clock (common/jinja/value.cpp:422-433: ``std::time(nullptr)`` when the Jinja
context is built) and cannot be given a date; transformers' reads it too (``datetime.now()``), so both render
the same date in the same process environment (same TZ) except across a midnight between the two renders.
The record says which templates call ``strftime_now`` (``now_dependent``).

:func:`run` writes the record (JSON, atomically) and never raises for a measured failure: the record holds
``passed`` and ``failures``, one line each, ``conformance: recipe <name>: <check>: <detail>``. It raises
PipelineError only when it cannot measure (a missing file, an HF folder that does not load, the helper failing).
"""

from __future__ import annotations

import gc
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .errors import PipelineError
from .fsutil import write_json_atomic
from .tools import Toolchain, find_toolchain

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "conformance"
PROBES_FILE = DATA / "probes.txt"
CONVERSATIONS_FILE = DATA / "conversations.json"
HELPER = "ggufpipe-conformance"

# Fixed before measuring (issue #15): an F16/BF16 GGUF against the HF model in float32.
THRESHOLDS = {"min_top1": 0.99, "max_kld_mean": 1e-3, "max_kld_p99": 1e-2, "max_abs_ln_ppl_ratio": 0.005}
DEFAULT_CHUNKS = 4
EVAL_SLICE_CHARS = 2000
GIB = 1 << 30
MAX_LINES_PER_KIND = 5  # failure lines of one kind (a tokenizer mode...); the record keeps them all
MAX_FULL_DIFFS = 50  # tokenizer mismatches whose full id sequences go into the record
TURN_END_MARK = "Conformance-turn-end-probe-7Q"  # the assistant content rendered to find the turn-end token

_MARKER_PREFIX, _MARKER_SUFFIX = "=== probe: ", " ==="


def fail_line(recipe: str, check: str, detail: str) -> str:
    return " ".join(f"conformance: recipe {recipe}: {check}: {detail}".split("\n"))


# --------------------------------------------------------------------------- probes and conversations


def load_probes(path: str | os.PathLike = PROBES_FILE) -> list[tuple[str, str]]:
    """(name, text) of every probe: ``=== probe: NAME ===`` marker lines, a ``json`` suffix for a body that is one
    JSON string literal; the newline before a marker is the marker's."""
    with open(path, encoding="utf-8", newline="") as fh:  # exact text: no newline translation
        text = fh.read()
    out: list[tuple[str, str]] = []
    name, is_json, body = None, False, []

    def close():
        if name is None:
            return
        raw = "\n".join(body)
        if is_json:
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise PipelineError(f"{path}: probe {name}: not a JSON string literal: {exc}") from None
            if not isinstance(value, str):
                raise PipelineError(f"{path}: probe {name}: the json body is not a string")
            raw = value
        if not raw:
            raise PipelineError(f"{path}: probe {name} is empty")
        out.append((name, raw))

    for line in text.split("\n"):
        if line.startswith(_MARKER_PREFIX) and line.endswith(_MARKER_SUFFIX):
            close()
            label = line[len(_MARKER_PREFIX):-len(_MARKER_SUFFIX)].strip()
            is_json = label.endswith(" json")
            name = label[:-len(" json")].strip() if is_json else label
            if any(n == name for n, _ in out):
                raise PipelineError(f"{path}: probe {name} is defined twice")
            body = []
        elif name is not None:
            body.append(line)
    if name is not None:
        if body and body[-1] == "":  # the file's final newline
            body.pop()
        close()
    if not out:
        raise PipelineError(f"{path}: no probe (marker lines `{_MARKER_PREFIX}NAME{_MARKER_SUFFIX}`)")
    return out


def added_token_probes(tok) -> list[tuple[str, str]]:
    """One probe per added/special token of the HF tokenizer (its text alone), and all of them in running
    text (each between words, to see lstrip/rstrip and the text around specials)."""
    added = sorted((int(i), t.content) for i, t in tok.added_tokens_decoder.items())
    for t in getattr(tok, "all_special_tokens", []):
        i = tok.convert_tokens_to_ids(t)
        if isinstance(i, int) and all(t != c for _, c in added):
            added.append((i, t))
    probes = [(f"added-token {i} {content!r}", content) for i, content in added if content]
    if probes:
        probes.append(("added-tokens-in-text", "".join(f"word{n} {c} x{c}y\n" for n, (_, c) in enumerate(added))))
    return probes


def eval_slice_probe(text_path: str | os.PathLike | None) -> list[tuple[str, str]]:
    if text_path is None or not Path(text_path).is_file():
        return []
    with open(text_path, encoding="utf-8", errors="replace") as fh:
        return [(f"eval-text {Path(text_path).name}[:{EVAL_SLICE_CHARS}]", fh.read(EVAL_SLICE_CHARS))]


def load_conversations(path: str | os.PathLike = CONVERSATIONS_FILE) -> dict:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    for c in data["conversations"]:
        if not c.get("name") or not isinstance(c.get("messages"), list):
            raise PipelineError(f"{path}: every conversation needs a name and a list of messages")
    return data


# --------------------------------------------------------------------------- the llama.cpp side


def run_helper(tc: Toolchain, gguf: str | os.PathLike, requests: list[dict], log: Path | None = None) -> list[dict]:
    """Every request in one ``ggufpipe-conformance GGUF < requests.json`` run (pipeline/tools.py); its answers."""
    from .tools import run_helper as _run

    return _run(tc, HELPER, gguf, requests, log)


# --------------------------------------------------------------------------- 1. tokenizer parity

MODES = {
    "a": {"label": "no specials added, special text parsed",
          "hf": {"add_special_tokens": False}, "llama": {"add_special": False, "parse_special": True}},
    "b": {"label": "each side's defaults",
          "hf": {"add_special_tokens": True}, "llama": {"add_special": True, "parse_special": True}},
    "c": {"label": "special text not parsed",
          "hf": {"add_special_tokens": False, "split_special_tokens": True},
          "llama": {"add_special": False, "parse_special": False}},
}


def tokenizer_requests(probes: list[tuple[str, str]]) -> list[dict]:
    return [{"op": "tokenize", "text": text, **MODES[m]["llama"]} for m in MODES for _, text in probes]


def hf_encode(tok, text: str, **kwargs) -> list[int]:
    return list(tok(text, **kwargs)["input_ids"])


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _hf_piece(tok, i: int) -> str:
    try:
        return tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    except Exception:  # an id outside the HF vocabulary
        return "?"


def clean_piece(piece: str) -> str:
    """A helper piece as readable text: the bytes of a piece that ends inside a UTF-8 character come as lone
    surrogates (U+DC80 + the byte, pipeline/native/conformance.cpp); they are written as backslash-x escapes."""
    return piece.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _window(ids: list[int], pieces: list[str], at: int, before: int = 2, after: int = 3) -> str:
    lo, hi = max(0, at - before), min(len(ids), at + after)
    items = [f"{ids[k]} {pieces[k]!r}" for k in range(lo, hi)]
    return "[" + ("... " if lo else "") + ", ".join(items) + (" ..." if hi < len(ids) else "") + "]"


def describe_diff(tok, hf_ids: list[int], llama_ids: list[int], llama_pieces: list[str], at: int) -> str:
    hf_pieces = [_hf_piece(tok, i) if abs(k - at) <= 3 else "" for k, i in enumerate(hf_ids)]
    return (f"first difference at token {at} (HF {len(hf_ids)} tokens, llama.cpp {len(llama_ids)}): "
            f"HF {_window(hf_ids, hf_pieces, at)} vs llama.cpp {_window(llama_ids, llama_pieces, at)}")


def check_tokenizer(recipe_name: str, tok, probes: list[tuple[str, str]], answers: list[dict]) -> dict:
    """Compare the HF tokenizer with llama.cpp's answers to :func:`tokenizer_requests` (same order)."""
    t0 = time.monotonic()
    n = len(probes)
    if len(answers) != n * len(MODES):
        raise PipelineError(f"conformance: {len(answers)} tokenizer answers for {n * len(MODES)} requests")
    diffs: list[dict] = []
    failed: dict[str, list[int]] = {m: [] for m in MODES}
    for mi, m in enumerate(MODES):
        for pi, (name, text) in enumerate(probes):
            ans = answers[mi * n + pi]
            if "error" in ans:
                raise PipelineError(f"{HELPER} could not tokenize probe {name}: {ans['error']}")
            hf_ids = hf_encode(tok, text, **MODES[m]["hf"])
            ll_ids = [int(i) for i in ans["ids"]]
            at = first_difference(hf_ids, ll_ids)
            if at is None:
                continue
            failed[m].append(pi)
            pieces = [clean_piece(p) for p in ans.get("pieces") or ["?"] * len(ll_ids)]
            d = {"mode": m, "probe": name, "position": at, "hf_len": len(hf_ids), "llama_len": len(ll_ids),
                 "detail": describe_diff(tok, hf_ids, ll_ids, pieces, at)}
            if len(diffs) < MAX_FULL_DIFFS:
                d.update(hf_ids=hf_ids, llama_ids=ll_ids, llama_pieces=pieces)
            diffs.append(d)
    failures: list[str] = []
    by_key = {(d["mode"], d["probe"]): d for d in diffs}
    a_failed = set(failed["a"])
    for m in MODES:
        if m == "b":
            # a probe that differs with each side's defaults only: the specials they add differ
            only_b = [pi for pi in failed["b"] if pi not in a_failed]
            if only_b:
                d = by_key[("b", probes[only_b[0]][0])]
                failures.append(fail_line(recipe_name, f"tokenizer parity ({m}: {MODES[m]['label']})",
                                          f"BOS/EOS policy differs on {len(only_b)} of {n} probes (identical "
                                          f"without specials): probe {d['probe']}: {d['detail']}"))
            continue
        pis = failed[m]
        for pi in pis[:MAX_LINES_PER_KIND]:
            d = by_key[(m, probes[pi][0])]
            failures.append(fail_line(recipe_name, f"tokenizer parity ({m}: {MODES[m]['label']})",
                                      f"probe {d['probe']}: {d['detail']}"))
        if len(pis) > MAX_LINES_PER_KIND:
            more = [probes[pi][0] for pi in pis[MAX_LINES_PER_KIND:]]
            failures.append(fail_line(recipe_name, f"tokenizer parity ({m}: {MODES[m]['label']})",
                                      f"{len(more)} more probes differ ({', '.join(more[:8])}"
                                      f"{', ...' if len(more) > 8 else ''}; every diff is in the record)"))
    return {
        "passed": not failures,
        "hf_tokenizer": type(tok).__name__,
        "probes": n,
        "probe_names": [p for p, _ in probes],
        "modes": {m: {"label": MODES[m]["label"], "mismatches": len(failed[m]),
                      "probes_failed": [probes[pi][0] for pi in failed[m]]} for m in MODES},
        "mismatches": sum(len(v) for v in failed.values()),
        "diffs": diffs,
        "failures": failures,
        "warnings": [],
        "seconds": round(time.monotonic() - t0, 3),
    }


# --------------------------------------------------------------------------- 2. logit fidelity


def mem_available() -> int:
    """MemAvailable of /proc/meminfo in bytes (0 when it cannot be read)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def hf_parameter_count(hf_dir: str | os.PathLike) -> int:
    """Parameters of an HF folder, from its safetensors headers (no tensor is read); pickled weights are
    counted as 2 bytes a parameter."""
    import struct

    hf_dir = Path(hf_dir)
    total = 0
    files = sorted(hf_dir.glob("*.safetensors"))
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for key, info in header.items():
            if key != "__metadata__":
                total += math.prod(info["shape"])
    if not files:
        total = sum(f.stat().st_size for f in hf_dir.glob("*.bin")) // 2
    return total


def _load_hf_model(hf_dir: Path, trust_remote_code: bool, what: str):
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32,
                                                     trust_remote_code=trust_remote_code, low_cpu_mem_usage=True)
    except Exception as exc:  # one line for whatever the loader raises
        raise PipelineError(f"{what}: the HF model in {hf_dir} cannot be loaded in float32: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    model.eval()
    return model


def _scored_logits(model, ids, first: int, n_ctx: int, what: str):
    """float32 logits (n_ctx - 1 - first, vocab) of positions first .. n_ctx-2 for one chunk."""
    import inspect

    import torch

    x = torch.as_tensor(ids, dtype=torch.long)[None]
    kwargs: dict[str, Any] = {"use_cache": False}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = n_ctx - first  # positions first .. n_ctx-1
    try:
        with torch.inference_mode():
            logits = model(input_ids=x, **kwargs).logits[0]
    except (RuntimeError, ValueError, IndexError) as exc:  # e.g. a context longer than the model's positions
        raise PipelineError(f"{what}: the HF model failed on a chunk of {n_ctx} tokens: {type(exc).__name__}: "
                            f"{' '.join(str(exc).split())[:200]}") from None
    return logits[-(n_ctx - first):-1].float()  # with or without logits_to_keep: the last n_ctx - first rows


def percentile(values, fraction: float) -> float:
    """llama-perplexity's percentile (linear interpolation between order statistics, perplexity.cpp:1931-1937)."""
    import numpy as np

    v = np.sort(np.asarray(values, dtype=np.float64))
    if not len(v):
        return float("nan")
    p = fraction * (len(v) - 1)
    i = int(p)
    return float((1 - (p - i)) * v[i] + (p - i) * v[min(i + 1, len(v) - 1)])


def compare_distributions(base_lp, other_logits, targets, floor: float | None = -16.0, block: int = 32) -> dict:
    """Per position: KLD(base || other) over the base tokens with log-prob > ``floor`` (llama.cpp's rule; None:
    all), same top (first argmax of each), and both sides' nll of the target. ``base_lp`` float32/64 log-probs
    (rows, n_vocab); ``other_logits`` a torch tensor of raw logits (rows, >= n_vocab)."""
    import numpy as np
    import torch

    n_rows, n_vocab = base_lp.shape
    kld, nll_other = np.empty(n_rows), np.empty(n_rows)
    for lo in range(0, n_rows, block):  # float64 temporaries of a few rows at a time (a 256k vocabulary...)
        hi = min(lo + block, n_rows)
        other_lp = torch.log_softmax(other_logits[lo:hi].double(), dim=-1)[:, :n_vocab].numpy()
        b = np.asarray(base_lp[lo:hi])
        b64 = b.astype(np.float64)
        terms = np.exp(b64) * (b64 - other_lp)
        if floor is not None:
            terms[b <= np.float32(floor)] = 0.0
        kld[lo:hi] = terms.sum(axis=1)
        nll_other[lo:hi] = -other_lp[np.arange(hi - lo), targets[lo:hi]]
    rows = np.arange(n_rows)
    return {
        "kld": kld,
        "same_top": np.argmax(base_lp, axis=1) == other_logits[:, :n_vocab].argmax(dim=-1).numpy(),
        "nll_base": -np.asarray(base_lp)[rows, targets].astype(np.float64),
        "nll_other": nll_other,
    }


def _summarise(parts: list[dict], clamped) -> dict:
    import numpy as np

    kld = np.concatenate([p["kld"] for p in parts])
    same = np.concatenate([p["same_top"] for p in parts])
    nb = np.concatenate([p["nll_base"] for p in parts])
    no = np.concatenate([p["nll_other"] for p in parts])
    ok = ~clamped if clamped is not None else np.ones_like(nb, dtype=bool)
    out = {
        "positions": int(len(kld)),
        "top1": float(same.mean()),
        "kld_mean": float(kld.mean()),
        "kld_p99": percentile(kld, 0.99),
        "kld_max": float(kld.max()),
        "ppl_base": float(np.exp(nb[ok].mean())),
        "ppl_other": float(np.exp(no[ok].mean())),
        "ln_ppl_ratio": float(no[ok].mean() - nb[ok].mean()),
    }
    if clamped is not None:
        out["clamped_targets"] = int(clamped.sum())
    return out


def check_logits(recipe_name: str, hf_dir: str | os.PathLike, logits_file: str | os.PathLike, add_bos: bool,
                 bos_id: int | None, chunks: int = DEFAULT_CHUNKS, trust_remote_code: bool = False,
                 awq_dir: str | os.PathLike | None = None, base_ppl: float | None = None,
                 available: int | None = None, n_tokens: int | None = None) -> dict:
    """HF float32 against the GGUF's base logits (and, with ``awq_dir``, the AWQ-folded folder against the HF
    model: recorded, not gated). See the module doc."""
    import numpy as np

    from .logitsfile import read_logits_file

    t0 = time.monotonic()
    hf_dir = Path(hf_dir)
    check = "logit fidelity"
    what = f"conformance: recipe {recipe_name}: {check}"
    lf = read_logits_file(logits_file)
    # not this GGUF's logits (a stale eval-base): nothing can be measured
    if n_tokens is not None and lf.n_vocab != n_tokens:
        raise PipelineError(f"{what}: the base logits {logits_file} hold distributions over {lf.n_vocab} tokens, the "
                            f"GGUF's vocabulary has {n_tokens}: run eval-base again")
    if add_bos and bos_id is not None and lf.tokens[0] != bos_id:
        raise PipelineError(f"{what}: the base logits {logits_file} start with token {int(lf.tokens[0])}, the GGUF "
                            f"adds BOS {bos_id}: they were made with another vocabulary; run eval-base again")
    n = min(chunks, lf.n_chunk)
    params = hf_parameter_count(hf_dir)
    need = 4 * params + 2 * GIB
    available = mem_available() if available is None else available
    out: dict[str, Any] = {"chunks": n, "chunks_asked": chunks, "n_ctx": lf.n_ctx, "n_vocab": lf.n_vocab, "parameters": params,
                           "needs_bytes": need, "available_bytes": available, "thresholds": dict(THRESHOLDS),
                           "bos_substituted": bool(add_bos and bos_id is not None), "failures": [], "warnings": []}
    if need > available:
        note = (f"not run: needs {need / GIB:.1f} GiB (4 x {params / 1e9:.2f}B parameters + 2 GiB), "
                f"{available / GIB:.1f} GiB available")
        out.update(passed=True, run=False, note=note, seconds=round(time.monotonic() - t0, 3))
        out["warnings"].append(fail_line(recipe_name, check, note))
        return out
    bos = bos_id if add_bos else None
    model = _load_hf_model(hf_dir, trust_remote_code, what)
    out["load_seconds"] = round(time.monotonic() - t0, 3)
    keep_dir = tempfile.TemporaryDirectory(prefix="ggufpipe-conformance-") if awq_dir else None
    try:
        parts, clamped = [], []
        for c in range(n):
            logits = _scored_logits(model, lf.model_input(c, bos), lf.first, lf.n_ctx, what)
            if logits.shape[1] < lf.n_vocab:
                out.update(passed=False, run=False, note=f"the HF model has {logits.shape[1]} logits",
                           seconds=round(time.monotonic() - t0, 3))
                out["failures"].append(fail_line(recipe_name, check, f"the HF model has {logits.shape[1]} logits, "
                                                 f"the GGUF's vocabulary {lf.n_vocab} tokens"))
                return out
            if keep_dir is not None:
                np.save(Path(keep_dir.name) / f"{c}.npy", logits.numpy())
            parts.append(compare_distributions(lf.log_probs(c), logits, lf.targets(c)))
            clamped.append(lf.target_clamped(c))
        out["hf_seconds"] = round(time.monotonic() - t0 - out["load_seconds"], 3)
        del model
        gc.collect()
        m = _summarise(parts, np.concatenate(clamped))
        out.update(run=True, positions=m["positions"], top1=m["top1"], kld_mean=m["kld_mean"], kld_p99=m["kld_p99"],
                   kld_max=m["kld_max"], ppl_llama=m["ppl_base"], ppl_hf=m["ppl_other"],
                   ln_ppl_ratio=m["ln_ppl_ratio"], clamped_targets=m["clamped_targets"],
                   ppl_llama_mean_base=lf.mean_ppl_base(n))
        if base_ppl is not None:
            out["ppl_eval_base_record"] = base_ppl  # llama-perplexity's exact PPL over all the eval set's chunks
        out["failures"] += _logit_failures(recipe_name, check, m, n)
        if awq_dir is not None:
            out["awq"] = _awq_against_hf(Path(awq_dir), Path(keep_dir.name), lf, n, bos, trust_remote_code, what)
    finally:
        if keep_dir is not None:
            keep_dir.cleanup()
    out["passed"] = not out["failures"]
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


def _logit_failures(recipe_name: str, check: str, m: dict, n: int) -> list[str]:
    t = THRESHOLDS
    where = f"HF float32 vs the GGUF on {m['positions']} positions of {n} chunks"
    out = []
    if m["top1"] < t["min_top1"]:
        out.append(fail_line(recipe_name, check, f"top-1 agreement {m['top1']:.4f} < {t['min_top1']} ({where})"))
    if m["kld_mean"] > t["max_kld_mean"]:
        out.append(fail_line(recipe_name, check, f"mean KLD {m['kld_mean']:.3g} > {t['max_kld_mean']:g} ({where})"))
    if m["kld_p99"] > t["max_kld_p99"]:
        out.append(fail_line(recipe_name, check, f"p99 KLD {m['kld_p99']:.3g} > {t['max_kld_p99']:g} ({where})"))
    if abs(m["ln_ppl_ratio"]) > t["max_abs_ln_ppl_ratio"]:
        out.append(fail_line(recipe_name, check, f"|ln(PPL HF / PPL llama.cpp)| = {abs(m['ln_ppl_ratio']):.4g} > "
                             f"{t['max_abs_ln_ppl_ratio']} (PPL HF {m['ppl_other']:.4f}, llama.cpp "
                             f"{m['ppl_base']:.4f}; {where})"))
    return out


def _awq_against_hf(awq_dir: Path, saved: Path, lf, n: int, bos, trust_remote_code: bool, what: str) -> dict:
    """The AWQ-folded folder against the original HF model's logits (saved per chunk): KLD(HF || AWQ) over
    every token, top-1, ln PPL ratio. Recorded, not gated."""
    import numpy as np
    import torch

    t0 = time.monotonic()
    model = _load_hf_model(awq_dir, trust_remote_code, f"{what}: awq")
    parts = []
    for c in range(n):
        hf_logits = torch.from_numpy(np.load(saved / f"{c}.npy"))
        hf_lp = torch.log_softmax(hf_logits.double(), dim=-1)[:, :lf.n_vocab].numpy()
        awq_logits = _scored_logits(model, lf.model_input(c, bos), lf.first, lf.n_ctx, f"{what}: awq")
        parts.append(compare_distributions(hf_lp, awq_logits, lf.targets(c), floor=None))
    del model
    gc.collect()
    m = _summarise(parts, None)
    return {"reference": "the HF model (float32)", "compared": f"{awq_dir.name} (float32)", "gated": False,
            "positions": m["positions"], "top1": m["top1"], "kld_mean": m["kld_mean"], "kld_p99": m["kld_p99"],
            "kld_max": m["kld_max"], "ppl_hf": m["ppl_base"], "ppl_awq": m["ppl_other"],
            "ln_ppl_ratio": m["ln_ppl_ratio"], "seconds": round(time.monotonic() - t0, 3)}


# --------------------------------------------------------------------------- 3. chat template


def _template_sources(tok) -> list[str]:
    t = getattr(tok, "chat_template", None)
    if t is None:
        return []
    if isinstance(t, dict):
        return [str(v) for v in t.values()]
    if isinstance(t, list):
        return [str(x.get("template", "")) for x in t if isinstance(x, dict)]
    return [str(t)]


def _merge_system(messages: list[dict]) -> list[dict]:
    """llama.cpp's workaround for a template without a system role (common/chat.cpp:1016-1030): the first
    (system) message's content, a newline and the next message's content, in the next message."""
    if not messages or messages[0].get("role") != "system":
        return messages
    if len(messages) == 1:
        return []
    second = dict(messages[1])
    second["content"] = f"{messages[0].get('content', '')}\n{second.get('content', '')}"
    return [second, *messages[2:]]


def hf_render(tok, messages: list[dict], add_generation_prompt: bool, tools: list | None, date_string: str) -> dict:
    """transformers' rendering: {"text"} or {"error"}; ``enable_thinking`` defined true, as llama.cpp always
    defines it (common/chat.cpp:914-949), ``date_string`` pinned."""
    kwargs: dict[str, Any] = {"add_generation_prompt": add_generation_prompt, "tokenize": False,
                              "date_string": date_string, "enable_thinking": True}
    if tools:
        kwargs["tools"] = tools
    try:
        return {"text": tok.apply_chat_template(messages, **kwargs)}
    except Exception as exc:  # a template error of any kind is a rejection
        return {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}


def _variants(text: str, bos_text: str | None, eos_text: str | None) -> dict[tuple[bool, bool], str]:
    """The HF text as llama.cpp would normalise it for each (add_bos, add_eos) of the vocab (chat.cpp:958-964)."""
    out = {}
    for add_bos in (False, True):
        for add_eos in (False, True):
            t = text
            if add_bos and bos_text and t.startswith(bos_text):
                t = t[len(bos_text):]
            if add_eos and eos_text and t.endswith(eos_text):
                t = t[:-len(eos_text)]
            out[(add_bos, add_eos)] = t
    return out


def plan_chat_template(tok, gguf_template: str | None, conversations: dict) -> dict:
    """The HF renders and the helper requests of the chat-template check (run before the helper: llama.cpp's
    normalisation depends on the vocab's add_bos/add_eos, so each HF text is tokenized in each variant)."""
    t0 = time.monotonic()
    sources = _template_sources(tok)
    plan: dict[str, Any] = {"hf_template": bool(sources), "gguf_template": gguf_template is not None,
                            "items": [], "requests": []}
    if not sources or gguf_template is None:
        plan["seconds"] = time.monotonic() - t0
        return plan
    uses_tools = any("tools" in s for s in sources)
    plan["uses_tools"] = uses_tools
    plan["now_dependent"] = any("strftime_now" in s for s in [*sources, gguf_template])
    date = conversations.get("date_string", "26 Jul 2024")
    bos_text, eos_text = getattr(tok, "bos_token", None), getattr(tok, "eos_token", None)
    for conv in conversations["conversations"]:
        item: dict[str, Any] = {"name": conv["name"], "add_generation_prompt": bool(conv.get("add_generation_prompt"))}
        if conv.get("tools") and not uses_tools:
            item["skipped"] = "the HF template does not use tools"
            plan["items"].append(item)
            continue
        tools = conversations.get("tools") if conv.get("tools") else None
        messages = conv["messages"]
        hf = hf_render(tok, messages, item["add_generation_prompt"], tools, date)
        if "error" in hf and messages and messages[0].get("role") == "system" and "system" in hf["error"].lower():
            merged = hf_render(tok, _merge_system(messages), item["add_generation_prompt"], tools, date)
            if "text" in merged:
                hf, item["hf_normalisation"] = merged, "system message merged into the next (chat.cpp:1016-1030)"
        item["hf"] = hf
        req: dict[str, Any] = {"op": "render", "messages": messages, "add_generation_prompt": item["add_generation_prompt"],
                               "chat_template_kwargs": {"date_string": date}}
        if tools:
            req["tools"] = tools
        item["render_request"] = len(plan["requests"])
        plan["requests"].append(req)
        if "text" in hf:
            hf["ids"] = hf_encode(tok, hf["text"], add_special_tokens=False)  # = apply_chat_template(tokenize=True)
            item["variants"] = {}
            for flags, text in _variants(hf["text"], bos_text, eos_text).items():
                item["variants"][flags] = (text, len(plan["requests"]))
                plan["requests"].append({"op": "tokenize", "text": text, "add_special": True, "parse_special": True})
        plan["items"].append(item)
    plan["seconds"] = time.monotonic() - t0
    return plan


def _text_diff(a: str, b: str) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return (f"first difference at character {i} (HF {len(a)}, llama.cpp {len(b)}): "
            f"HF {a[max(0, i - 20):i + 30]!r} vs llama.cpp {b[max(0, i - 20):i + 30]!r}")


def check_chat_template(recipe_name: str, tok, plan: dict, answers: list[dict], vocab: dict) -> dict:
    """Judge the renders of :func:`plan_chat_template` with the helper's ``answers`` to ``plan["requests"]``."""
    t0 = time.monotonic()
    check = "chat template"
    failures: list[str] = []
    warnings: list[str] = []
    out: dict[str, Any] = {"hf_template": plan["hf_template"], "gguf_template": plan["gguf_template"]}
    if not plan["hf_template"] and not plan["gguf_template"]:
        out.update(passed=True, note="no chat template", conversations=[], failures=[], warnings=[], seconds=0.0)
        return out
    if not plan["gguf_template"]:
        out["note"] = "the GGUF has no chat template"
        failures.append(fail_line(recipe_name, check, "the HF tokenizer has a chat template, the GGUF has no "
                                  "tokenizer.chat_template (llama.cpp would render ChatML): set "
                                  "chat_template_override"))
    if not plan["hf_template"]:
        out["note"] = "not compared: the HF tokenizer has no chat template"
        warnings.append(fail_line(recipe_name, check, "the GGUF has a chat template, the HF tokenizer none: "
                                  "nothing to compare it with"))
    add_bos, add_eos = bool(vocab.get("add_bos")), bool(vocab.get("add_eos"))
    bos, eos = vocab.get("bos"), vocab.get("eos")
    rendered = 0
    results = []
    bos_written: list[str] = []
    bos_text = getattr(tok, "bos_token", None)
    for item in plan["items"]:
        res: dict[str, Any] = {"name": item["name"], "add_generation_prompt": item["add_generation_prompt"]}
        results.append(res)
        if "skipped" in item:
            res["skipped"] = item["skipped"]
            continue
        where = f"conversation {item['name']}"
        hf = item["hf"]
        ll = answers[item["render_request"]]
        res["hf_error"], res["llama_error"] = hf.get("error"), ll.get("error")
        if item.get("hf_normalisation"):
            res["hf_normalisation"] = item["hf_normalisation"]
        if "error" in hf or "error" in ll:
            if "error" in hf and "error" in ll:
                res["verdict"] = "rejected by both"
                continue
            who, msg = ("HF", hf["error"]) if "error" in hf else ("llama.cpp", ll["error"])
            failures.append(fail_line(recipe_name, check, f"{where}: rejected by {who} only ({msg[:160]})"))
            res["verdict"] = f"rejected by {who} only"
            continue
        rendered += 1
        text, idx = item["variants"][(add_bos, add_eos)]
        prompt = clean_piece(ll.get("prompt", ""))
        res.update(hf_text=hf["text"], llama_prompt=prompt, hf_ids=hf["ids"])
        if add_bos and bos is not None and bos_text and hf["text"].startswith(bos_text):
            bos_written.append(item["name"])
        if text != prompt:
            res["verdict"] = "text differs"
            norm = (" (HF's text with llama.cpp's normalisation: its leading BOS / trailing EOS text stripped, "
                    "chat.cpp:958-964)") if text != hf["text"] else ""
            failures.append(fail_line(recipe_name, check, f"{where}: rendered text differs{norm}: "
                                      f"{_text_diff(text, prompt)}"))
            continue
        tk = answers[idx]
        if "error" in tk:
            raise PipelineError(f"{HELPER} could not tokenize the prompt of {where}: {tk['error']}")
        ll_ids, hf_ids = [int(i) for i in tk["ids"]], hf["ids"]
        res["llama_ids"] = ll_ids
        problems = []
        if bos is not None and len(ll_ids) >= 2 and ll_ids[0] == ll_ids[1] == bos:
            both = " (HF's ids too: the template writes it twice)" if hf_ids[:2] == [bos, bos] else ""
            problems.append(f"double BOS at the start of llama.cpp's input ids ({ll_ids[:3]}){both}")
        elif bos is not None and ll_ids[:1] == [bos] and hf_ids[:1] != [bos]:
            problems.append(f"llama.cpp adds BOS {bos} where HF has none (HF starts {hf_ids[:3]})")
        if eos is not None and add_eos and ll_ids[-1:] == [eos] and hf_ids[-1:] != [eos]:
            problems.append(f"llama.cpp adds EOS {eos} where HF has none")
        if not problems and ll_ids != hf_ids:
            at = first_difference(hf_ids, ll_ids)
            pieces = [clean_piece(p) for p in tk.get("pieces") or ["?"] * len(ll_ids)]
            problems.append("input ids differ: " + describe_diff(tok, hf_ids, ll_ids, pieces, at))
        if problems:
            res["verdict"] = "; ".join(problems)
            failures.extend(fail_line(recipe_name, check, f"{where}: {p}") for p in problems)
        else:
            res["verdict"] = "identical"
    if bos_written:
        warnings.append(fail_line(recipe_name, check, f"the template writes the BOS text {bos_text!r} and the GGUF "
                                  f"adds BOS ({len(bos_written)} conversations, {bos_written[0]} first): llama.cpp's "
                                  "chat path strips it (chat.cpp:958-964), a client that renders the template itself "
                                  "and tokenizes the text with specials gets BOS twice"))
    out.update(passed=not failures, conversations=results, rendered=rendered,
               compared=sum(1 for r in results if "skipped" not in r), uses_tools=plan.get("uses_tools"),
               now_dependent=plan.get("now_dependent"), failures=failures, warnings=warnings,
               seconds=round(plan.get("seconds", 0.0) + time.monotonic() - t0, 3))
    return out


# --------------------------------------------------------------------------- 4. end of generation


def hf_eos_ids(hf_dir: str | os.PathLike) -> tuple[list[int], str]:
    """HF's ``eos_token_id`` as a list, and where it came from (generation_config.json, else config.json)."""
    hf_dir = Path(hf_dir)
    for name in ("generation_config.json", "config.json"):
        p = hf_dir / name
        if not p.is_file():
            continue
        data = json.loads(p.read_text(encoding="utf-8"))
        v = data.get("eos_token_id")
        if v is None and name == "config.json":
            v = (data.get("text_config") or {}).get("eos_token_id")
        if v is None and name == "generation_config.json":
            continue
        ids = [v] if isinstance(v, int) else list(v or [])
        return [int(i) for i in ids], name
    return [], "none"


def turn_end_token(tok, date_string: str) -> dict:
    """The special token the template writes right after an assistant message's content (rendering
    [user, assistant TURN_END_MARK]): {"text", "id"}, or {"note"} when there is none."""
    hf = hf_render(tok, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": TURN_END_MARK}],
                   False, None, date_string)
    if "error" in hf:
        return {"note": f"the template rejects [user, assistant]: {hf['error'][:160]}"}
    text = hf["text"]
    at = text.rfind(TURN_END_MARK)
    if at < 0:
        return {"note": "the template does not write the assistant's content"}
    after = text[at + len(TURN_END_MARK):]
    rest = after.lstrip(" \n")
    specials = {t.content for t in tok.added_tokens_decoder.values() if t.special}
    specials |= set(getattr(tok, "all_special_tokens", []))
    hit = max((s for s in specials if s and rest.startswith(s)), key=len, default=None)
    if hit is None:  # a marker that is an ordinary token of the vocabulary (<end_of_turn>, [/INST]...)
        m = re.match(r"<\|[^|\s]{1,40}\|>|<[^<>\s]{1,40}>|\[/?[A-Z_]{1,40}\]", rest)
        if m and m.group(0) in tok.get_vocab():
            hit = m.group(0)
    if hit is None:
        return {"note": f"no special token after the assistant content (then {after[:40]!r})"}
    return {"text": hit, "id": int(tok.convert_tokens_to_ids(hit))}


def check_eog(recipe_name: str, tok, hf_dir: str | os.PathLike, vocab: dict, turn_end: dict | None) -> dict:
    t0 = time.monotonic()
    check = "end of generation"
    eog = [int(i) for i in vocab.get("eog", [])]
    eog_set = set(eog)
    failures, warnings = [], []
    eos_ids, source = hf_eos_ids(hf_dir)

    def label(i: int) -> str:
        return f"{i} {_hf_piece(tok, i)!r}"

    eog_text = ", ".join(label(i) for i in eog[:8]) + (", ..." if len(eog) > 8 else "")
    for i in eos_ids:
        if i not in eog_set:
            failures.append(fail_line(recipe_name, check, f"HF {source} eos_token_id {label(i)} is not an "
                                      f"end-of-generation token of the GGUF (EOG: {eog_text}): llama.cpp would not "
                                      "stop on it; set eos_token_ids"))
    out: dict[str, Any] = {"eog": eog, "hf_eos_ids": eos_ids, "hf_eos_source": source, "gguf_eos": vocab.get("eos"),
                           "gguf_eot": vocab.get("eot")}
    if turn_end is not None:
        out["turn_end"] = turn_end
        if "id" in turn_end and turn_end["id"] not in eog_set:
            failures.append(fail_line(recipe_name, check, f"the template ends an assistant turn with "
                                      f"{turn_end['text']!r} (id {turn_end['id']}), not an end-of-generation token "
                                      f"of the GGUF (EOG: {eog_text})"))
        elif "note" in turn_end:
            warnings.append(fail_line(recipe_name, check, f"turn-end token not found: {turn_end['note']}"))
    gguf_eos = vocab.get("eos")
    if gguf_eos is not None and gguf_eos >= 0 and eos_ids and gguf_eos not in eos_ids:
        warnings.append(fail_line(recipe_name, check, f"the GGUF's EOS {label(gguf_eos)} is not among HF's "
                                  f"eos_token_id {eos_ids} ({source}): llama.cpp stops on a token HF never stops on"))
    out.update(passed=not failures, failures=failures, warnings=warnings, seconds=round(time.monotonic() - t0, 3))
    return out


# --------------------------------------------------------------------------- the stage


def _settings(recipe) -> dict | None:
    """The recipe's ``conformance`` setting (pipeline/recipe.py ``Conformance``): None when it opts out."""
    conf = getattr(recipe, "conformance", None)
    if conf is False or (conf is not None and getattr(conf, "enabled", True) is False):
        return None
    if isinstance(conf, dict):
        return {"chunks": int(conf.get("chunks", DEFAULT_CHUNKS)), "text": conf.get("text")}
    return {"chunks": int(getattr(conf, "chunks", DEFAULT_CHUNKS)), "text": getattr(conf, "text", None)}


def _log(log: Path | None, line: str) -> None:
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(line.rstrip("\n") + "\n")


def load_hf_tokenizer(hf_dir: Path, trust_remote_code: bool, what: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(hf_dir), trust_remote_code=trust_remote_code)
    except Exception as exc:  # one line for whatever the loader raises
        first = exc
    # a folder without tokenizer.json whose fast tokenizer must be converted from the slow one, and the conversion
    # fails here (transformers 4.56's sentencepiece protobuf wants a newer protobuf than the pinned one): the slow
    # tokenizer is HF's reference implementation as well
    try:
        return AutoTokenizer.from_pretrained(str(hf_dir), trust_remote_code=trust_remote_code, use_fast=False)
    except Exception:
        raise PipelineError(f"{what}: the HF tokenizer in {hf_dir} cannot be loaded: {type(first).__name__}: "
                            f"{' '.join(str(first).split())[:300]}") from None


def _sig(x: float | None, digits: int = 6) -> float | None:
    """``x`` to ``digits`` significant digits: the record's compact numbers do not change with the last bits of a
    float32 sum (threads); the exact values are in ``details``."""
    if x is None or not math.isfinite(x) or x == 0:
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def compact(name: str, c: dict) -> dict:
    """What the manifest and the report show of one check: verdict, one-line ``summary``, the numbers, and
    ``not_run`` (the reason) for a check that could not run. Stable across rebuilds (no seconds, no diffs)."""
    out: dict[str, Any] = {"passed": c["passed"]}
    if name == "tokenizer":
        mm = {m: v["mismatches"] for m, v in c["modes"].items()}
        out.update(probes=c["probes"], mismatches=mm, hf_tokenizer=c["hf_tokenizer"],
                   summary=f"{c['probes']} probes x {len(mm)} modes: "
                           + ", ".join(f"({m}) {v} mismatch{'es' if v != 1 else ''}" for m, v in mm.items()))
    elif name == "logits":
        if not c.get("run"):
            out["not_run"] = c.get("note", "not run")
        else:
            keys = ("top1", "kld_mean", "kld_p99", "kld_max", "ln_ppl_ratio", "ppl_hf", "ppl_llama")
            out.update({k: _sig(c[k]) for k in keys}, positions=c["positions"], chunks=c["chunks"],
                       clamped_targets=c["clamped_targets"], thresholds=dict(THRESHOLDS))
            out["summary"] = (f"top-1 {c['top1']:.4f}, mean KLD {c['kld_mean']:.3g}, p99 KLD {c['kld_p99']:.3g}, "
                              f"ln(PPL HF / PPL llama.cpp) {c['ln_ppl_ratio']:+.2g} on {c['positions']} positions "
                              f"of {c['chunks']} chunks (HF float32 vs the GGUF)")
            if "awq" in c:
                a = c["awq"]
                out["awq"] = {k: _sig(a[k]) for k in ("top1", "kld_mean", "kld_p99", "ln_ppl_ratio")}
                out["awq"]["gated"] = False
                out["summary"] += (f"; AWQ-folded vs HF (not gated): top-1 {a['top1']:.4f}, mean KLD "
                                   f"{a['kld_mean']:.3g}, p99 KLD {a['kld_p99']:.3g}")
    elif name == "chat_template":
        if c.get("note"):
            out["not_run"] = c["note"]
        else:
            convs = c.get("conversations", [])
            counts = {k: sum(1 for r in convs if pred(r)) for k, pred in (
                ("identical", lambda r: r.get("verdict") == "identical"),
                ("rejected_by_both", lambda r: r.get("verdict") == "rejected by both"),
                ("skipped", lambda r: "skipped" in r))}
            out.update(conversations=len(convs), **counts, now_dependent=bool(c.get("now_dependent")))
            out["summary"] = (f"{len(convs)} conversations: {counts['identical']} identical (text and ids)"
                              + (f", {counts['rejected_by_both']} rejected by both" if counts["rejected_by_both"] else "")
                              + (f", {counts['skipped']} skipped (no tools in the HF template)" if counts["skipped"] else "")
                              + (f", {len(convs) - sum(counts.values())} differ" if len(convs) > sum(counts.values()) else ""))
    elif name == "eog":
        te = c.get("turn_end") or {}
        out.update(eog=c["eog"], hf_eos_ids=c["hf_eos_ids"], hf_eos_source=c["hf_eos_source"],
                   gguf_eos=c.get("gguf_eos"), turn_end=te.get("text"), turn_end_id=te.get("id"))
        out["summary"] = (f"EOG {c['eog']}; HF eos_token_id {c['hf_eos_ids']} ({c['hf_eos_source']})"
                          + (f"; turn end {te['text']!r} ({te['id']})" if "id" in te else ""))
    return out


def _not_run(note: str) -> dict:
    return {"passed": True, "run": False, "note": note, "failures": [], "warnings": [], "seconds": 0.0}


def run(recipe, base_gguf, hf_dir, logits_file, base_record, out_record, log=None, tc: Toolchain | None = None,
        awq_base=None) -> dict:
    """Entry function: every check of the base GGUF ``base_gguf`` against the HF folder ``hf_dir``; writes
    ``out_record`` (JSON, atomically) and returns it. ``logits_file``/``base_record``: eval-base's logits and
    record of the first eval set (None: no logit check). ``awq_base``: the AWQ-folded HF folder, measured against
    ``hf_dir`` (recorded, not gated).

    The record: ``passed``, ``failures`` and ``warnings`` (one line each), ``checks`` (per check: ``passed``, a
    one-line ``summary`` or ``not_run``, the numbers; what the manifest shows), ``details`` (per check: every
    number, the full tokenizer diffs, both renders and id sequences of every conversation, MemAvailable: bulky, and
    not for the manifest), ``seconds`` (per check and in all: volatile), ``thresholds``, ``vocab`` (llama.cpp's
    view of the GGUF), ``toolchain``, ``python``."""
    from .provenance import python_versions

    t0 = time.monotonic()
    name = recipe.name
    what = f"{recipe.path}: conformance"
    log = Path(log) if log else None
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
    settings = _settings(recipe)
    if settings is None:
        rec = {"recipe": name, "passed": True, "skipped": "the recipe opts out (conformance: false)", "failures": [],
               "warnings": [], "checks": {}}
        write_json_atomic(out_record, rec)
        _log(log, f"[conformance] {name}: skipped: the recipe opts out")
        return rec
    base_gguf, hf_dir = Path(base_gguf), Path(hf_dir)
    for p, label in ((base_gguf, "base GGUF"), (hf_dir / "config.json", "HF folder's config.json")):
        if not p.is_file():
            raise PipelineError(f"{what}: the {label} {p} is missing")
    for p, label in ((logits_file, "base logits"), (base_record, "eval-base record")):
        if p is not None and not Path(p).is_file():
            raise PipelineError(f"{what}: the {label} {p} is missing (run eval-base first)")
    if awq_base is not None and not (Path(awq_base) / "config.json").is_file():
        raise PipelineError(f"{what}: the AWQ-folded folder {awq_base} has no config.json")
    tc = tc or find_toolchain()
    trust = bool(recipe.source.trust_remote_code)

    # HF side first: the tokenizer once, the probes, the renders (their texts go to the helper to tokenize)
    t = time.monotonic()
    tok = load_hf_tokenizer(hf_dir, trust, what)
    override = getattr(recipe, "chat_template_override", None)
    if override is not None:  # the fix path: the recipe's template is the model's, on both sides
        tok.chat_template = Path(override).read_text(encoding="utf-8")
    eval_sets = getattr(recipe, "eval_sets", ())
    eval_text = eval_sets[0].text if eval_sets else settings.get("text")
    probes = load_probes() + added_token_probes(tok) + eval_slice_probe(eval_text)
    conversations = load_conversations()
    from .gguf import read_header

    gguf_template = read_header(base_gguf).metadata.get("tokenizer.chat_template")
    plan = plan_chat_template(tok, gguf_template if isinstance(gguf_template, str) else None, conversations)
    turn_end = turn_end_token(tok, conversations.get("date_string", "")) if plan["hf_template"] else None
    hf_side = time.monotonic() - t

    # llama.cpp side: one helper process for every request
    tok_reqs = tokenizer_requests(probes)
    requests = [{"op": "vocab"}, *tok_reqs, *plan["requests"]]
    t = time.monotonic()
    answers = run_helper(tc, base_gguf, requests, log)
    helper_seconds = time.monotonic() - t
    vocab = answers[0]
    if "error" in vocab or "eog" not in vocab:
        raise PipelineError(f"{what}: {HELPER} gave no vocabulary facts for {base_gguf}: {vocab}")

    details: dict[str, dict] = {}
    details["tokenizer"] = check_tokenizer(name, tok, probes, answers[1:1 + len(tok_reqs)])
    details["chat_template"] = check_chat_template(name, tok, plan, answers[1 + len(tok_reqs):], vocab)
    details["eog"] = check_eog(name, tok, hf_dir, vocab, turn_end)
    if logits_file is None:
        details["logits"] = _not_run("not run: the recipe has no eval text")
    else:
        base_ppl = json.loads(Path(base_record).read_text()).get("ppl") if base_record else None
        details["logits"] = check_logits(name, hf_dir, logits_file, bool(vocab.get("add_bos")), vocab.get("bos"),
                                         settings["chunks"], trust, awq_base, base_ppl,
                                         n_tokens=vocab.get("n_tokens"))
    failures = [f for c in details.values() for f in c["failures"]]
    warnings = [w for c in details.values() for w in c.get("warnings", [])]
    seconds = {k: c.get("seconds", 0.0) for k, c in details.items()}
    lg = details["logits"]
    for key in ("load_seconds", "hf_seconds"):  # volatile numbers stay out of the details
        if key in lg:
            seconds[f"logits_{key.removesuffix('_seconds')}"] = lg.pop(key)
    if "awq" in lg:
        seconds["logits_awq"] = lg["awq"].pop("seconds", 0.0)
    seconds.update(hf_side=round(hf_side, 3), helper=round(helper_seconds, 3), total=round(time.monotonic() - t0, 3))
    rec = {
        "recipe": name,
        "passed": not failures,
        "failures": failures,
        "warnings": warnings,
        "checks": {k: compact(k, c) for k, c in details.items()},
        "thresholds": dict(THRESHOLDS),
        "chunks": settings["chunks"],
        # torch's threads: the float32 sums of the HF side depend on them (the stage fixes them: eval_threads)
        "threads": sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None,
        "gguf": base_gguf.name,
        "vocab": {k: vocab.get(k) for k in ("type", "n_tokens", "bos", "eos", "eot", "eom", "add_bos", "add_eos",
                                            "eog")},
        "helper_requests": len(requests),
        "toolchain": tc.describe(),
        "python": python_versions(),
        "details": {k: {kk: vv for kk, vv in c.items() if kk not in ("failures", "warnings", "seconds")}
                    for k, c in details.items()},
        "seconds": seconds,
    }
    write_json_atomic(out_record, rec)
    for line in failures:
        _log(log, line)
    for line in warnings:
        _log(log, f"warning: {line}")
    for k, c in rec["checks"].items():
        _log(log, f"[conformance] {name}: {k}: {'pass' if c['passed'] else 'FAIL'}: "
                  f"{c.get('summary') or c.get('not_run', '')} ({seconds[k]:.2f}s)")
    _log(log, f"[conformance] {name}: {'passed' if rec['passed'] else 'FAILED'} ({seconds['total']:.1f}s, "
              f"helper {seconds['helper']:.2f}s for {len(requests)} requests)")
    return rec


def run_stage(recipe, layout, threads: int = 2, tc: Toolchain | None = None, log: str | os.PathLike | None = None) -> dict:
    """The Snakemake stage (``ggufpipe stage conformance``): :func:`run` on the recipe's paths. The base logits are
    eval-base's of the first eval set (recomputed first when ``ggufpipe clean-logits`` emptied them); a recipe
    without eval sets (a built draft) gets its own, from ``conformance.text`` at ctx 512, in its scratch folder,
    removed afterwards. ``log``: the job log (default ``layout.log(name, "conformance")``)."""
    import shutil

    from .evaluate import eval_base, restore_base_logits
    from .recipe import EvalSet

    name = recipe.name
    log = Path(log or layout.log(name, "conformance"))
    log.parent.mkdir(parents=True, exist_ok=True)
    record = layout.conformance_record(name)
    settings = _settings(recipe)
    if settings is None:
        return run(recipe, layout.base_gguf(recipe), layout.hf(name), None, None, record, log, tc)
    tc = tc or find_toolchain()
    import torch

    torch.set_num_threads(threads)  # fixed (eval_threads), not --cores: the numbers stay bit-identical
    base = layout.base_gguf(recipe)
    awq = layout.hf_awq(name) if "awq" in recipe.bases else None
    if recipe.eval_sets:
        es = recipe.eval_sets[0]
        logits, base_record = layout.base_logits(name, es.name), layout.base_record(name, es.name)
        if Path(logits).is_file():
            restore_base_logits(tc, es, base, logits, base_record, threads, log, f"{name}: conformance")
        return run(recipe, base, layout.hf(name), logits, base_record, record, log, tc, awq)
    text = settings.get("text")
    if text is None:
        return run(recipe, base, layout.hf(name), None, None, record, log, tc, awq)
    scratch = Path(layout.conformance_dir(name))
    es = EvalSet(name="conformance", text=Path(text), ctx=512, chunks=settings["chunks"])
    try:
        eval_base(name, es, base, scratch / "base.logits", scratch / "base.json", threads, log, tc)
        return run(recipe, base, layout.hf(name), scratch / "base.logits", scratch / "base.json", record, log, tc,
                   awq)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.conformance RECIPE BASE_GGUF HF_DIR OUT [--logits F --base-record R]``: one run by hand."""
    import argparse

    from .recipe import load_recipe

    ap = argparse.ArgumentParser(prog="python -m pipeline.conformance", description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("base_gguf")
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--logits")
    ap.add_argument("--base-record")
    ap.add_argument("--awq")
    ap.add_argument("--log")
    args = ap.parse_args(argv)
    try:
        rec = run(load_recipe(args.recipe), args.base_gguf, args.hf_dir, args.logits, args.base_record, args.out,
                  args.log, awq_base=args.awq)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in rec["failures"]:
        print(line)
    for k, c in rec["checks"].items():
        print(f"{k}: {'pass' if c['passed'] else 'FAIL'}: {c.get('summary') or c.get('not_run', '')}")
    return 0 if rec["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
