"""Stages for draft models (speculative decoding): vocab check, measured acceptance, top-1 agreement.

* :func:`vocab_check` applies llama.cpp's compatibility rule (:mod:`pipeline.stages.vocab`) to one
  (main quant, draft quant) pair and records the verdict with a readable diff;
* :func:`acceptance` runs real greedy speculative decoding (``llama-speculative-simple``) on prompts
  taken from the draft-eval text, for each configured draft length, and records drafted / accepted
  tokens, the acceptance rate, the decode speed and the command; the best draft length goes into the
  deployment line of the manifest. The draft is a draft model (``--spec-type draft-simple``) or the main
  model's own MTP heads (``--spec-type draft-mtp``, recipe ``draft: {mtp: true}``: inside the main file, or
  the ``mtp: separate`` export given with ``-md``);
* top-1 agreement of draft vs main comes from the KLD machinery (``eval_quant`` of the draft against
  the main model's base logits): its "same top p".
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from pipeline.errors import PipelineError, RecipeError, ToolError
from pipeline.fsutil import sha256_file
from pipeline.gguf.vocab_defaults import effective_vocab
from pipeline.records import AcceptanceRecord, AgreementRecord, VocabRecord
from pipeline.stagedef import Stage, mem_mb
from pipeline.stages.evaluate import eval_quant
from pipeline.stages.mtp import mtp_step_bytes
from pipeline.stages.vocab import check_pair, describe_failure
from pipeline.tools import Toolchain, find_toolchain, serve_tool, tail
from pipeline.tools_rerun import run_complete, tool_errors

PROMPT_CHARS = 1500


def vocab_check(main_gguf: str | Path, draft_gguf: str | Path, record: str | Path) -> dict:
    """Entry function: llama.cpp's vocab rule on one pair; the verdict is recorded, not raised
    (the gate stage fails the build, so every pair's diff is reported at once)."""
    rec = VocabRecord(**check_pair(main_gguf, draft_gguf), main_file=Path(main_gguf).name,
                      draft_file=Path(draft_gguf).name)
    if not rec.compatible:
        rec.message = describe_failure(rec.to_dict(), Path(main_gguf).name, Path(draft_gguf).name)
        print(rec.message, flush=True)
    rec.write(record)
    return rec.to_dict()


def prompts_from_text(text: str, n: int, chars: int = PROMPT_CHARS) -> list[str]:
    """``n`` deterministic, non-overlapping passages spread over the text, cut at line starts."""
    if len(text) < n * chars:
        raise PipelineError(f"draft eval text has {len(text)} characters; {n} prompts of {chars} need {n * chars}")
    out = []
    step = len(text) // n
    for i in range(n):
        start = text.find("\n", i * step)
        start = i * step if start < 0 or start > i * step + chars else start + 1
        out.append(text[start:start + chars])
    return out


_STAT = {key: re.compile(rf"{key}\s*=\s*([0-9.]+)") for key in ("n_drafted", "n_accept", "n_predict")}
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds, speed:\s+([0-9.]+) t/s")


def parse_speculative(output: str) -> dict:
    if "vocabs are not compatible" in output or "vocab type must match" in output:
        raise PipelineError("llama-speculative-simple refused the pair: the target and draft vocabs are not compatible")
    stats = {}
    for key, rx in _STAT.items():
        m = rx.search(output)
        if not m:
            raise PipelineError(f"llama-speculative-simple printed no {key}: {tail(output)}")
        stats[key] = int(float(m.group(1)))
    m = _DECODED.search(output)
    if not m:
        raise PipelineError(f"llama-speculative-simple printed no decode speed: {tail(output)}")
    stats["decode_seconds"] = float(m.group(2))
    return stats


def _errors(output: str) -> str:
    """llama.cpp's own error lines (``E ...``) of a failed run, or the output's tail."""
    got = tool_errors(output)
    return " | ".join(got[-3:]) if got else tail(output)


def spec_complete(output: str) -> bool:
    """The counts and the decode line llama-speculative-simple prints last are all there."""
    return _DECODED.search(output) is not None and all(rx.search(output) for rx in _STAT.values())


def spec_args(main: str | Path, draft: str | Path | None, spec_type: str, n_max: int) -> list[str]:
    """The speculative-decoding arguments common to llama-speculative-simple and llama-server (common/arg.cpp:4148,
    4247, 4257 of b11312): ``-m``, ``-md`` (no draft file: MTP heads inside the main file), ``--spec-type``,
    ``--spec-draft-n-max``."""
    return ["-m", str(main), *(["-md", str(draft)] if draft is not None else []), "--spec-type", spec_type,
            "--spec-draft-n-max", str(n_max)]


def serve_deploy(tc: Toolchain, main_gguf, draft_gguf, spec_type: str, n_max: int, prompt: str, n_predict: int,
                 threads: int, log, pair: str) -> dict:
    """The deploy line run: ``llama-server`` with the published speculative arguments (:func:`spec_args`), one slot
    and the acceptance context, and one greedy ``/completion`` of ``prompt`` (:func:`serve_completion`): its
    timings and the ``command`` (file names bare, as the deploy line has them)."""
    extra = ["-c", "2048", "-np", "1", "-t", str(threads)]
    timings = serve_completion(tc, [*spec_args(main_gguf, draft_gguf, spec_type, n_max), *extra], prompt, n_predict,
                               log, f"the deploy line of {pair}")
    names = (Path(main_gguf).name, Path(draft_gguf).name if draft_gguf is not None else None)
    return {**timings, "command": " ".join(["llama-server", *spec_args(*names, spec_type, n_max), *extra])}


def serve_completion(tc: Toolchain, args: list, prompt: str, n_predict: int, log, what: str, cwd=None) -> dict:
    """``llama-server ARGS`` and one greedy ``/completion`` of ``prompt``: its ``timings`` (tools/server/
    server-common.cpp:85-103 of b11312: ``draft_n`` and ``draft_n_accepted`` when it drafted). Raises
    PipelineError, one line, when the server or the request fails."""
    # urllib.request (slow): only the llama-server runs need it
    import urllib.request

    body = json.dumps({"prompt": prompt, "n_predict": n_predict, "temperature": 0, "seed": 1,
                       "cache_prompt": False}).encode()
    try:
        with serve_tool(tc, args, Path(log) if log else None, cwd=cwd) as url:
            req = urllib.request.Request(url + "/completion", data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as r:
                answer = json.loads(r.read())
    except PipelineError as exc:
        raise PipelineError(f"{what}: {exc}") from None
    except (OSError, ValueError) as exc:
        raise PipelineError(f"{what}: llama-server's /completion failed: {exc}") from None
    t = answer.get("timings") or {}
    return {"predicted_n": int(t.get("predicted_n", 0)), "draft_n": int(t.get("draft_n", 0)),
            "draft_n_accepted": int(t.get("draft_n_accepted", 0))}


def acceptance(main_gguf: str | Path, draft_gguf: str | Path | None, vocab_record: str | Path, text: str | Path,
               n_max: tuple[int, ...], prompts: int, n_predict: int, record: str | Path, threads: int = 2,
               log: str | Path | None = None, tc: Toolchain | None = None, spec_type: str = "draft-simple") -> dict:
    """Entry function: measured acceptance of one compatible pair (skipped for incompatible ones).
    ``spec_type`` ``draft-mtp``: the draft is the main model's MTP heads, inside ``main_gguf`` (``draft_gguf``
    None, recipe ``mtp: keep``) or exported alone (``draft_gguf``, ``mtp: separate``)."""
    if draft_gguf is None and spec_type != "draft-mtp":
        raise PipelineError(f"acceptance: --spec-type {spec_type} needs a draft file")
    tc = tc or find_toolchain()
    vocab = VocabRecord.read(vocab_record, "acceptance")
    text = Path(text)
    base = {"eval_text": text.name, "text_sha256": sha256_file(text), "prompts": prompts, "n_predict": n_predict,
            "threads": threads, "spec_type": spec_type}
    if not vocab.compatible:
        rec = AcceptanceRecord(**base, skipped="vocabularies are incompatible")
        rec.write(record)
        return rec.to_dict()
    main_name = Path(main_gguf).name
    pair = main_name + (f" + {Path(draft_gguf).name}" if draft_gguf is not None else "")
    passages = prompts_from_text(text.read_text(encoding="utf-8"), prompts)
    measure = ["-n", str(n_predict), "--temp", "0", "--seed", "1", "-t", str(threads), "-c", "2048"]
    by_n: dict[str, dict] = {}
    timings: dict[str, float] = {}  # decode tokens/s on the build box: volatile, kept apart
    with tempfile.TemporaryDirectory(prefix="ggufpipe-spec-") as tmpd:
        files = []
        for i, p in enumerate(passages):
            f = Path(tmpd) / f"prompt{i}.txt"
            f.write_text(p, encoding="utf-8")
            files.append(f)
        for n in n_max:
            drafted = accepted = predicted = 0
            seconds = 0.0
            for f in files:
                # every early failure exits 1 (speculative-simple.cpp:25-137): exit 0 without the counts is the lost tail
                res = run_complete(tc, "llama-speculative-simple", [*spec_args(main_gguf, draft_gguf, spec_type, n),
                                   "-f", f, *measure], Path(log) if log else None, None, spec_complete,
                                   f"acceptance of {pair} at n_max {n}")
                if res.returncode != 0:
                    raise ToolError("llama-speculative-simple", res.returncode, log, f"llama-speculative-simple --spec-type "
                                    f"{spec_type} failed on {pair} (exit {res.returncode}): {_errors(res.output)}")
                st = parse_speculative(res.output)
                drafted += st["n_drafted"]
                accepted += st["n_accept"]
                predicted += st["n_predict"]
                seconds += st["decode_seconds"]
            by_n[str(n)] = {"drafted": drafted, "accepted": accepted, "generated": predicted,
                            "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0}
            timings[str(n)] = round(predicted / seconds, 2) if seconds else 0.0
    # Best draft length by a deterministic cost model (not by noisy timings): tokens per target step
    # (generated / steps, steps = generated - accepted) over the relative cost of a step, 1 + n * c, with c
    # the per-token cost of the draft relative to the main model: the draft/main size ratio, for MTP heads
    # the bytes of the tensors one MTP step runs (pipeline/stages/mtp.py:mtp_step_bytes) over the main size.
    main_size = Path(main_gguf).stat().st_size
    if spec_type == "draft-mtp":
        c = mtp_step_bytes(draft_gguf if draft_gguf is not None else main_gguf) / main_size
    else:
        c = Path(draft_gguf).stat().st_size / main_size
    for n, v in by_n.items():
        steps = max(1, v["generated"] - v["accepted"])
        v["tokens_per_step"] = round(v["generated"] / steps, 4)
        v["est_speedup"] = round(v["tokens_per_step"] / (1 + int(n) * c), 4)
    best = max(by_n, key=lambda k: (by_n[k]["est_speedup"], -int(k)))
    names = [main_name, Path(draft_gguf).name if draft_gguf is not None else None]
    command = ["llama-speculative-simple", *spec_args(*names, spec_type, int(best)), "-f", "prompt<i>.txt", *measure]
    served = serve_deploy(tc, main_gguf, draft_gguf, spec_type, int(best), passages[0], n_predict, threads, log, pair)
    rec = AcceptanceRecord(**base, by_n_max=by_n, best_n_max=int(best), acceptance_rate=by_n[best]["acceptance_rate"],
                           drafted=by_n[best]["drafted"], accepted=by_n[best]["accepted"], draft_cost_ratio=round(c, 4),
                           command=" ".join(command), served=served,
                           label="greedy llama-speculative-simple; best n_max by estimated speedup "
                                 "(tokens per target step / (1 + n_max * draft/main size))",
                           build_box_decode_tokens_per_s=timings)
    rec.write(record)
    return rec.to_dict()


def agreement(recipe_name: str, draft_gguf: str | Path, main_base: str | Path, es, base_logits: str | Path,
              base_record: str | Path, record: str | Path, threads: int = 2, log: str | Path | None = None,
              tc: Toolchain | None = None) -> dict:
    """Entry function: top-1 agreement of the draft with the main model's unquantized file over the
    first eval set ("same top p" of a KL-divergence run of the draft against the main base logits)."""
    n_main, n_draft = effective_vocab(main_base)["n_tokens"], effective_vocab(draft_gguf)["n_tokens"]
    if n_main != n_draft:
        rec = AgreementRecord(eval_set=es.name, skipped=f"vocab sizes differ ({n_main} vs {n_draft}): no common logits")
        rec.write(record)
        return rec.to_dict()
    with tempfile.TemporaryDirectory(prefix="ggufpipe-agree-") as tmpd:
        ev = eval_quant(recipe_name, f"draft {Path(draft_gguf).name}", es, draft_gguf, base_logits, base_record,
                        Path(tmpd) / "eval.json", threads=threads, log=log, tc=tc, base_gguf=main_base)
    m = ev["metrics"]
    rec = AgreementRecord(eval_set=es.name, text_sha256=ev["text_sha256"], scored_tokens=ev["scored_tokens"],
                          top1_agreement=m["same_top_p"], kld_mean=m["kld_mean"], ppl_ratio=m["ppl_ratio"])
    rec.write(record)
    return rec.to_dict()


def deployment_line(main_file: str, draft_file: str | None, n_max: int, spec_type: str = "draft-simple") -> str:
    """``llama-server`` with the speculative arguments the acceptance stage ran (:func:`spec_args`); no
    ``draft_file``: MTP heads inside the main file."""
    return " ".join(["llama-server", *spec_args(main_file, draft_file, spec_type, n_max)])


def _pair(r, wc, L) -> dict:
    return {"main": L.main_gguf(r, wc["mkey"]), "draft": L.draft_gguf(r, wc["dkey"], wc["mkey"])}


def _run_acceptance(j) -> None:
    r, d = j.recipe, j.recipe.draft
    draft = None if d.mtp and r.mtp != "separate" else j.input["draft"]  # MTP heads inside the main file: no -md
    acceptance(j.input["main"], draft, j.input["vocab"], d.eval_text, d.n_max, d.prompts, d.n_predict,
               j.output["record"], threads=j.threads, log=j.log, spec_type=d.spec_type)


def _acceptance_trigger(r, wc, s) -> dict:
    d = r.draft
    return {"eval_text": str(d.eval_text), "n_max": d.n_max, "prompts": d.prompts, "n_predict": d.n_predict,
            "eval_threads": s.eval_threads, "build": s.build_number, "spec_type": d.spec_type, "offload": s.offload}


def _run_agreement(j) -> None:
    r, i = j.recipe, j.input
    if r.draft.mtp:
        raise RecipeError(r.path, "draft.mtp", "the MTP heads have no top-1 agreement stage (no logits of their own "
                          "over a text)")
    agreement(r.name, i["draft"], i["base"], r.first_eval_set, i["logits"], i["base_record"], j.output["record"],
              threads=j.threads, log=j.log)


def _agreement_inputs(r, wc, L) -> dict:
    es = r.first_eval_set.name
    return {"draft": L.draft_gguf(r, wc["dkey"]), "base": L.base_gguf(r), "logits": L.base_logits(r.name, es),
            "base_record": L.base_record(r.name, es)}


VOCAB_CHECK = Stage(
    "vocab_check", "vocab", order=60, log="vocab-{mkey}--{dkey}", wildcards=("mkey", "dkey"), output="log",
    run=lambda j: vocab_check(j.input["main"], j.input["draft"], j.output["record"]), inputs=_pair,
    outputs=lambda L: {"record": L.vocab_record("{name}", "{mkey}", "{dkey}")},
    resources={"mem_mb": 1024, "disk_mb": 1024, "runtime": 10},
)
ACCEPTANCE = Stage(
    "acceptance", "acceptance", order=61, log="acceptance-{mkey}--{dkey}", wildcards=("mkey", "dkey"),
    threads="eval_threads", run=_run_acceptance,
    inputs=lambda r, wc, L: {**_pair(r, wc, L), "vocab": L.vocab_record(r.name, wc["mkey"], wc["dkey"])},
    outputs=lambda L: {"record": L.spec_record("{name}", "{mkey}", "{dkey}")}, trigger=_acceptance_trigger,
    resources={"mem_mb": lambda s: mem_mb(s.total, 1.5, 1024), "disk_mb": 1024,
               "runtime": lambda s: int(60 + s.total / 20)},
)
AGREEMENT = Stage(
    "agreement", "agreement", order=62, log="agreement-{dkey}", wildcards=("dkey",), threads="eval_threads",
    run=_run_agreement, inputs=_agreement_inputs, outputs=lambda L: {"record": L.agreement_record("{name}", "{dkey}")},
    trigger=lambda r, wc, s: {"offload": s.offload},
    resources={"mem_mb": lambda s: mem_mb(s.mb("draft"), 1.3, 1024), "disk_mb": 1024,
               "runtime": lambda s: int(30 + s.mb("draft") / 20)},
)
