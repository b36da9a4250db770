#!/usr/bin/env python3
"""Memory model benchmark (issue #20 item 1): predicted vs measured peak RSS of llama-bench.

    .venv/bin/python bench/memory_bench.py [--work DIR] [--cache FILE] [--only fit|held-out] [--markdown]

"Memory" is the peak resident set (VmHWM) of

    llama-bench -m FILE -p CTX -n 16 -r 1 -t 2 -v

(default mmap, the pinned CPU build; ``-v`` only adds log lines). It is measured twice per run, and both are
printed: VmHWM polled from ``/proc/<pid>/status`` every 10 ms (the last value read before the process exits;
VmHWM only grows) and ``ru_maxrss`` of the child from ``os.wait4`` (what ``/usr/bin/time -f %M`` prints).

The prediction is :func:`pipeline.memory.predict_memory` for (FILE, CTX). Its few fitted constants were
fitted on the FIT set only (SmolLM2-135M F16 and Q8_0 at ctx 512 and 2048); the HELD-OUT set was never used
to fit: SmolLM2 F16 at ctx 8192, other SmolLM2 quants (Q4_K_M: CPU-repacked Q4_K tensors; Q5_K_M; the calib
build's Q3_K_M), and a generated Gemma-3 (GQA 8 heads / 4 KV heads of 128, 12 layers, sliding window 512 on 5
of every 6 layers, random weights, converted with the pinned converter; F16 at ctx 8192 and Q4_0, which this
CPU repacks, at ctx 2048). Each run's components are also checked against what llama.cpp prints of them: the
CPU_Mapped / CPU_REPACK model buffers, the KV buffers, the output buffer and the (reserved) compute buffer.

Exit status 1 when a held-out run's predicted / measured is outside 1 +- 0.15 (or a run failed).
``--cache`` keeps the measurements (per file size, mtime and ctx) so the table can be re-printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.memory import MIB, predict_memory  # noqa: E402
from pipeline.tools import find_toolchain  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from pipeline_bench import _hwm_kb  # noqa: E402  the VmHWM reader of the pipeline bench

DEMO = ROOT / "artifacts" / "smollm2-135m"
CALIB_QUANTS = ROOT / "work" / "smollm2-135m-calib" / "quants"
TOLERANCE = 0.15
N_GEN, REPS, THREADS = 16, 1, 2


def runs(work: Path) -> list[tuple[Path, int, str]]:
    gemma = work / "tiny-gemma3-F16.gguf"
    gemma_q4 = work / "tiny-gemma3-Q4_0.gguf"
    return [
        (DEMO / "smollm2-135m-F16.gguf", 512, "fit"),
        (DEMO / "smollm2-135m-F16.gguf", 2048, "fit"),
        (DEMO / "smollm2-135m-Q8_0.gguf", 512, "fit"),
        (DEMO / "smollm2-135m-Q8_0.gguf", 2048, "fit"),
        (DEMO / "smollm2-135m-F16.gguf", 8192, "held-out"),
        (DEMO / "smollm2-135m-Q8_0.gguf", 8192, "held-out"),
        (DEMO / "smollm2-135m-Q4_K_M.gguf", 2048, "held-out"),
        (DEMO / "smollm2-135m-Q5_K_M.gguf", 4096, "held-out"),
        (CALIB_QUANTS / "smollm2-135m-calib-Q3_K_M.gguf", 1024, "held-out"),
        (gemma, 8192, "held-out"),
        (gemma, 512, "held-out"),
        (gemma_q4, 2048, "held-out"),
    ]


# ------------------------------------------------------------------ the generated GQA + sliding-window model
def make_gemma3(work: Path, tc) -> None:
    """A tiny Gemma-3 text model with random weights, converted by the pinned converter; then Q4_0 of it."""
    from pipeline.tools import run_converter

    f16, q4 = work / "tiny-gemma3-F16.gguf", work / "tiny-gemma3-Q4_0.gguf"
    if not f16.is_file():
        import sentencepiece as spm
        import torch
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaTokenizer

        hf = work / "tiny-gemma3-hf"
        shutil.rmtree(hf, ignore_errors=True)
        hf.mkdir(parents=True)
        spm.SentencePieceTrainer.train(
            input=str(ROOT / "data" / "botchan-calib.txt"), model_prefix=str(hf / "spm"), vocab_size=768,
            model_type="bpe", byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=3,
            num_threads=1, minloglevel=2, input_sentence_size=20000, shuffle_input_sentence=False)
        tok = LlamaTokenizer(vocab_file=str(hf / "spm.model"), legacy=True, add_bos_token=True)
        tok.save_pretrained(hf)
        cfg = Gemma3TextConfig(
            vocab_size=tok.vocab_size, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
            num_attention_heads=8, num_key_value_heads=4, head_dim=128, sliding_window=512,
            max_position_embeddings=32768, bos_token_id=1, eos_token_id=2, pad_token_id=3, torch_dtype="float16")
        cfg.sliding_window_pattern = 6
        torch.manual_seed(0)
        Gemma3ForCausalLM(cfg).half().save_pretrained(hf, safe_serialization=True)
        res = run_converter(tc, [str(hf), "--outfile", str(f16), "--outtype", "f16"], work / "convert.log")
        if res.returncode != 0:
            raise SystemExit(f"convert failed: see {work / 'convert.log'}")
    if not q4.is_file():
        subprocess.run(["nice", "-n", "10", str(tc.tool("llama-quantize")), str(f16), str(q4), "Q4_0", "2"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ------------------------------------------------------------------ one measured run
PRINTED = {
    "mapped": re.compile(r"CPU_Mapped model buffer size =\s*([\d.]+) MiB"),
    "repack": re.compile(r"CPU_REPACK model buffer size =\s*([\d.]+) MiB"),
    "output": re.compile(r"CPU\s+output buffer size =\s*([\d.]+) MiB"),
    "kv": re.compile(r"llama_kv_cache:\s+CPU KV buffer size =\s*([\d.]+) MiB"),
    "compute": re.compile(r"sched_reserve:\s+CPU compute buffer size =\s*([\d.]+) MiB"),
}


def measure(tc, gguf: Path, ctx: int) -> dict:
    cmd = ["nice", "-n", "10", str(tc.tool("llama-bench")), "-m", str(gguf), "-p", str(ctx), "-n", str(N_GEN),
           "-r", str(REPS), "-t", str(THREADS), "-v"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0]
    stop = threading.Event()

    def poll():  # nice(1) exec()s llama-bench: same pid
        while not stop.is_set():
            peak[0] = max(peak[0], _hwm_kb(proc.pid))
            time.sleep(0.01)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    out = proc.stdout.read()
    # reap with wait4 for ru_maxrss; the poller stops at the first failed read after the exit
    _, status, ru = os.wait4(proc.pid, 0)
    stop.set()
    th.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"llama-bench failed ({proc.returncode}) on {gguf} ctx {ctx}:\n{out[-3000:]}")
    keep = re.compile(r"model buffer size|output buffer size|KV buffer size|compute buffer size|llama_context: n_ctx ")
    log = [ln for ln in out.splitlines() if keep.search(ln)]
    return {"vmhwm_kib": peak[0], "maxrss_kib": ru.ru_maxrss, "seconds": round(time.monotonic() - t0, 1),
            "log": log}


def printed_mib(log: list[str]) -> dict[str, float]:
    """The buffers llama.cpp printed for the model and the first (pp CTX) context; the tg16 context comes after,
    with its own, smaller buffers (stdout is a pipe here, so llama-bench's table lines come at the end)."""
    starts = [i for i, ln in enumerate(log) if "llama_context: n_ctx " in ln]
    first = "\n".join(log[: starts[1]] if len(starts) > 1 else log)
    return {key: sum(float(v) for v in rx.findall(first)) for key, rx in PRINTED.items()}


# ------------------------------------------------------------------ table
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "ggufpipe-memory-bench")
    ap.add_argument("--cache", type=Path, default=None, help="JSON file of measurements to reuse / extend")
    ap.add_argument("--only", choices=("fit", "held-out"))
    ap.add_argument("--markdown", action="store_true", help="print markdown tables")
    ap.add_argument("--make-gemma3", action="store_true", help=argparse.SUPPRESS)  # the child below
    args = ap.parse_args(argv)
    tc = find_toolchain()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.make_gemma3:
        make_gemma3(args.work, tc)
        return 0
    # in a child: with torch loaded this process is ~560 MiB, and a child forked from it reports that as its
    # ru_maxrss (Linux keeps the high-water mark across exec), whatever llama-bench itself peaks at
    subprocess.run([sys.executable, __file__, "--make-gemma3", "--work", str(args.work)], check=True)
    cache_file = args.cache or args.work / "measurements.json"
    cache = json.loads(cache_file.read_text()) if cache_file.is_file() else {}

    rows, comp_rows, bad = [], [], []
    for gguf, ctx, kind in runs(args.work):
        if args.only and kind != args.only:
            continue
        if not gguf.is_file():
            print(f"skip (missing): {gguf}", file=sys.stderr)
            continue
        st = gguf.stat()
        key = f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}|{ctx}"
        if key not in cache:
            cache[key] = measure(tc, gguf, ctx)
            cache_file.write_text(json.dumps(cache, indent=1))
        m = cache[key]
        pred = predict_memory(gguf, ctx, threads=THREADS)
        meas = m["vmhwm_kib"] * 1024
        ratio = pred["total"] / meas
        ok = abs(ratio - 1) <= TOLERANCE
        if kind == "held-out" and not ok:
            bad.append(f"{gguf.name} ctx {ctx}: {ratio:.3f}")
        p = printed_mib(m["log"])
        # llama.cpp's own projection for a CPU-only run: model + context (KV) + compute buffers, the sum
        # common_fit_params compares with host memory (common/fit.cpp:317-318, src/llama-context.cpp:3484-3507)
        proj = p["mapped"] + p["repack"] + p["kv"] + p["compute"]
        rows.append((gguf.name, ctx, pred["total"] / MIB, meas / MIB, m["maxrss_kib"] / 1024, ratio, kind,
                     "ok" if ok else "OUT", proj, proj * MIB / meas))
        r = pred["reserved"]
        comp_rows.append((gguf.name, ctx, [
            ("model buffer", r["mapped"] / MIB, p["mapped"]),
            ("repack", r["repack"] / MIB, p["repack"]),
            ("KV", r["kv"] / MIB, p["kv"]),
            ("output", r["output"] / MIB, p["output"]),
            ("compute (reserved)", r["compute"] / MIB, p["compute"]),
        ]))

    if args.markdown:
        print("| file | ctx | predicted MiB | VmHWM MiB | ru_maxrss MiB | predicted / VmHWM | set | ±15 % "
              "| llama.cpp projection MiB (/ VmHWM) |")
        print("|---|---:|---:|---:|---:|---:|---|---|---:|")
        for name, ctx, pr, me, mx, ratio, kind, ok, proj, pratio in rows:
            print(f"| {name} | {ctx} | {pr:.1f} | {me:.1f} | {mx:.1f} | {ratio:.3f} | {kind} | {ok} "
                  f"| {proj:.1f} ({pratio:.2f}) |")
        print()
        print("Per component, predicted / printed by llama.cpp (MiB):\n")
        print("| file | ctx | model buffer | repack | KV | output | compute (reserved) |")
        print("|---|---:|---|---|---|---|---|")
        for name, ctx, comps in comp_rows:
            cells = " | ".join(f"{a:.2f} / {b:.2f}" for _, a, b in comps)
            print(f"| {name} | {ctx} | {cells} |")
    else:
        print(f"{'file':36} {'ctx':>5} {'pred MiB':>9} {'VmHWM':>8} {'maxrss':>8} {'ratio':>6}  set  llama.cpp proj")
        for name, ctx, pr, me, mx, ratio, kind, ok, proj, pratio in rows:
            print(f"{name:36} {ctx:5d} {pr:9.1f} {me:8.1f} {mx:8.1f} {ratio:6.3f}  {kind} {ok}  {proj:.1f} ({pratio:.2f})")
        print("\nper component: predicted / printed (MiB)")
        for name, ctx, comps in comp_rows:
            print(f"{name:36} {ctx:5d}  " + "  ".join(f"{c}: {a:.2f}/{b:.2f}" for c, a, b in comps))
    if bad:
        print("held-out outside ±15 %: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
