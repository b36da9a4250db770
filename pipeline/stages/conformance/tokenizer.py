"""Check 1, tokenizer parity. (see pipeline/stages/conformance/__init__.py)."""

from __future__ import annotations

import time

from pipeline.errors import PipelineError
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
