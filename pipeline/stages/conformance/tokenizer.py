"""Check 1, tokenizer parity, each mismatch with its cause. (see pipeline/stages/conformance/__init__.py)."""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.stages.conformance.causes import (
    BOS_EOS,
    CONTROL_TYPED,
    IGNORE_MERGES,
    UNEXPLAINED,
    Normalizer,
    encode_variant,
    is_limitation,
    text_share,
)
from pipeline.stages.conformance.common import (
    HELPER,
    MAX_FULL_DIFFS,
    MAX_LINES_PER_KIND,
    MODES,
    clean_piece,
    describe_diff,
    fail_line,
    first_difference,
    hf_encode,
)


def residual_requests(norm: Normalizer | None, probes: list[tuple[str, str]]) -> tuple[list[int], list[dict]]:
    """The probes the residual normalizer changes (their indices) and llama.cpp requests for their normalized
    text, mode by mode as :func:`tokenizer_requests` orders them."""
    fn = norm.residual_fn if norm else None
    if fn is None:
        return [], []
    changed = [(pi, fn(text)) for pi, (_, text) in enumerate(probes)]
    changed = [(pi, t) for pi, t in changed if t != probes[pi][1]]
    return [pi for pi, _ in changed], [{"op": "tokenize", "text": t, **MODES[m]["llama"]} for m in MODES
                                       for _, t in changed]


_WHY = {
    IGNORE_MERGES: "HF's BPE looks whole words up before merging (ignore_merges) and the GGUF's pre-tokenizer type "
                   "does not: HF with ignore_merges off gives llama.cpp's ids",
    CONTROL_TYPED: "identical with special text parsed; HF matches an added token it keeps plain that the converter "
                   "typed CONTROL (conversion/base.py does_token_look_special), which llama.cpp matches only with "
                   "special parsing on (src/llama-vocab.cpp:3261)",
}


def cause_status(cause: str, accept: tuple[str, ...], strict: bool) -> str:
    if is_limitation(cause):
        return "defect (strict)" if strict else "known limitation"
    if cause not in (UNEXPLAINED, BOS_EOS) and all(part in accept for part in cause.split("+")):
        return "accepted"
    return "defect"


def _mismatch_cause(m: str, pi: int, text: str, hf_ids: list[int], ll_ids: list[int], failed: dict[str, list[int]],
                    norm: Normalizer | None, normalized: dict | None, merging, control_ids: frozenset[int]) -> str:
    """The cause of one probe's mismatch in mode ``m``; ``normalized``: llama.cpp's answer for the probe with the
    residual normalizer applied (None when it does not change the probe)."""
    cause = UNEXPLAINED
    if normalized is not None and [int(i) for i in normalized.get("ids", [])] == hf_ids:
        cause = norm.cause
    if cause == UNEXPLAINED and merging is not None and encode_variant(merging, text, m) == ll_ids:
        cause = IGNORE_MERGES
    if (cause == UNEXPLAINED and m == "c" and pi not in failed["a"] and control_ids
            and not control_ids.isdisjoint(hf_ids)):
        cause = CONTROL_TYPED
    return cause


def _compare(tok, probes: list[tuple[str, str]], answers: list[dict], norm: Normalizer | None,
             residual: tuple[list[int], list[dict]], merging, control_ids: frozenset[int]):
    """Every mode and probe, HF's ids against llama.cpp's: the diffs (first MAX_FULL_DIFFS with the full ids), the
    failed probe indices per mode, each mismatch's cause by (mode, probe index), and the diffs by (mode, probe)."""
    n = len(probes)
    res_pis, res_answers = residual
    res_at = {pi: k for k, pi in enumerate(res_pis)}
    diffs: list[dict] = []
    failed: dict[str, list[int]] = {m: [] for m in MODES}
    cause_of: dict[tuple[str, int], str] = {}
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
            normalized = res_answers[mi * len(res_pis) + res_at[pi]] if pi in res_at else None
            cause = _mismatch_cause(m, pi, text, hf_ids, ll_ids, failed, norm, normalized, merging, control_ids)
            cause_of[(m, pi)] = cause
            pieces = [clean_piece(p) for p in ans.get("pieces") or ["?"] * len(ll_ids)]
            d = {"mode": m, "probe": name, "cause": cause, "position": at, "hf_len": len(hf_ids),
                 "llama_len": len(ll_ids), "detail": describe_diff(tok, hf_ids, ll_ids, pieces, at)}
            if len(diffs) < MAX_FULL_DIFFS:
                d.update(hf_ids=hf_ids, llama_ids=ll_ids, llama_pieces=pieces)
            diffs.append(d)
    by_key = {(d["mode"], d["probe"]): d for d in diffs}
    # a probe that differs with each side's defaults only: the specials they add differ
    a_failed = set(failed["a"])
    for pi in failed["b"]:
        if pi not in a_failed and cause_of[("b", pi)] == UNEXPLAINED:
            cause_of[("b", pi)] = by_key[("b", probes[pi][0])]["cause"] = BOS_EOS
    return diffs, failed, cause_of, by_key


def _group_causes(probes: list[tuple[str, str]], cause_of: dict[tuple[str, int], str], norm: Normalizer | None,
                  accept: tuple[str, ...], strict: bool, texts: tuple[Path, ...]) -> dict[str, dict]:
    """Per cause: its status, the probes it explains (overall and per mode), why, and for the normalizer's cause
    the share of each text it changes."""
    causes: dict[str, dict] = {}
    for (m, pi), cause in cause_of.items():
        c = causes.setdefault(cause, {"status": cause_status(cause, accept, strict), "probes": [], "modes": {}})
        if probes[pi][0] not in c["probes"]:
            c["probes"].append(probes[pi][0])
        c["modes"].setdefault(m, []).append(probes[pi][0])
    fn = norm.residual_fn if norm and norm.cause in causes else None
    for cause, c in causes.items():
        if fn is not None and cause == norm.cause:
            c["why"] = norm.why()
            c["text_share"] = [text_share(fn, p) for p in texts]
        elif cause in _WHY:
            c["why"] = _WHY[cause]
    return causes


def _failure_lines(recipe_name: str, probes: list[tuple[str, str]], failed: dict[str, list[int]],
                   cause_of: dict[tuple[str, int], str], causes: dict[str, dict], by_key: dict) -> list[str]:
    """One line per defect mismatch (MAX_LINES_PER_KIND per mode, then a count); mode b: one BOS/EOS line."""
    n = len(probes)
    failures: list[str] = []
    for m in MODES:
        if m == "b":
            only_b = [pi for pi in failed["b"] if cause_of[("b", pi)] == BOS_EOS]
            if only_b:
                d = by_key[("b", probes[only_b[0]][0])]
                failures.append(fail_line(recipe_name, f"tokenizer parity ({m}: {MODES[m]['label']})",
                                          f"BOS/EOS policy differs on {len(only_b)} of {n} probes (identical "
                                          f"without specials): probe {d['probe']}: {d['detail']}"))
            continue
        pis = [pi for pi in failed[m] if causes[cause_of[(m, pi)]]["status"].startswith("defect")]
        for pi in pis[:MAX_LINES_PER_KIND]:
            d = by_key[(m, probes[pi][0])]
            why = causes[d["cause"]].get("why", "not explained by the HF normalizer")
            failures.append(fail_line(recipe_name, f"tokenizer parity ({m}: {MODES[m]['label']})",
                                      f"probe {d['probe']}: cause {d['cause']} ({why}): {d['detail']}"))
        if len(pis) > MAX_LINES_PER_KIND:
            more = [probes[pi][0] for pi in pis[MAX_LINES_PER_KIND:]]
            failures.append(fail_line(recipe_name, f"tokenizer parity ({m}: {MODES[m]['label']})",
                                      f"{len(more)} more probes differ ({', '.join(more[:8])}"
                                      f"{', ...' if len(more) > 8 else ''}; every diff is in the record)"))
    return failures


def _warning_lines(recipe_name: str, n: int, causes: dict[str, dict], accept: tuple[str, ...]) -> list[str]:
    """One line per known-limitation or accepted cause, and per ``accept`` entry this build did not find."""
    warnings: list[str] = []
    for cause, c in causes.items():
        if c["status"] not in ("known limitation", "accepted"):
            continue
        shares = ", ".join(f"{s['share']:.2%} of {s['text']}" for s in c.get("text_share", []))
        what = ("known llama.cpp limitation" if c["status"] == "known limitation"
                else "accepted difference (recipe conformance.accept)")
        warnings.append(fail_line(recipe_name, "tokenizer parity",
                                  f"{what} {cause}: {c['why']}; {len(c['probes'])} of {n} probes differ only by it "
                                  f"({', '.join(c['probes'][:6])}{', ...' if len(c['probes']) > 6 else ''})"
                                  + (f"; it changes {shares}" if shares else "")
                                  + ("; clients should send NFC-normalized text" if cause == "nfc" else "")))
    for a in accept:
        if not any(a in cause.split("+") for cause in causes):
            warnings.append(fail_line(recipe_name, "tokenizer parity",
                                      f"conformance.accept names {a}, which this build did not find"))
    return warnings


def check_tokenizer(recipe_name: str, tok, probes: list[tuple[str, str]], answers: list[dict],
                    norm: Normalizer | None = None, residual: tuple[list[int], list[dict]] = ([], []),
                    accept: tuple[str, ...] = (), strict: bool = False, texts: tuple[Path, ...] = (),
                    merging=None, control_ids: frozenset[int] = frozenset()) -> dict:
    """Compare the HF tokenizer with llama.cpp's answers to :func:`tokenizer_requests` (same order); ``residual``:
    the probes :func:`residual_requests` changed and llama.cpp's answers for them. A mismatch is explained by the
    normalizer when llama.cpp's ids of the normalized probe are HF's ids of the probe; ``merging``: HF's tokenizer
    with ignore_merges off (causes.merging_variant); ``control_ids``: added tokens HF keeps plain that the GGUF types
    CONTROL (causes.control_typed). ``texts`` (eval and calibration) get the share of their characters a found
    normalizer cause changes."""
    t0 = time.monotonic()
    n = len(probes)
    if len(answers) != n * len(MODES):
        raise PipelineError(f"conformance: {len(answers)} tokenizer answers for {n * len(MODES)} requests")
    diffs, failed, cause_of, by_key = _compare(tok, probes, answers, norm, residual, merging, control_ids)
    causes = _group_causes(probes, cause_of, norm, accept, strict, texts)
    failures = _failure_lines(recipe_name, probes, failed, cause_of, causes, by_key)
    warnings = _warning_lines(recipe_name, n, causes, accept)
    return {
        "passed": not failures,
        "hf_tokenizer": type(tok).__name__,
        "normalizer": norm.record() if norm else None,
        "probes": n,
        "probe_names": [p for p, _ in probes],
        "modes": {m: {"label": MODES[m]["label"], "mismatches": len(failed[m]),
                      "probes_failed": [probes[pi][0] for pi in failed[m]]} for m in MODES},
        "mismatches": sum(len(v) for v in failed.values()),
        "causes": causes,
        "diffs": diffs,
        "failures": failures,
        "warnings": warnings,
        "seconds": round(time.monotonic() - t0, 3),
    }
