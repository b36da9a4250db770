"""What a chat-rendered importance matrix buys (issue #33 item 3): an imatrix from prose against one from chat-rendered
conversations, each measured on a held-out prose gate and a held-out chat-rendered gate.

Run:  PYTHONPATH=. python bench/chat_calibration.py [--chunks 16] [--threads 2] [--work DIR]
- the rotated demo (docs/rotation.md: the demo's function with its weights off the Q4_1 grid the demo was
  dequantized from, so that no type wins by matching a grid), converted to F16 with the pinned converter;
- two importance matrices of ``--chunks`` x 512 tokens each (the same token budget): prose from
  data/botchan-calib.txt (Botchan chapters VI-XI) and chat from data/chat/chat-calib.jsonl (chatterbot-corpus 1.2.0,
  nine English categories), the latter rendered with the model's template and run with ``--parse-special``
  (the imatrix stage, pipeline/stages/imatrix.py, both times);
- Q4_K_M and Q3_K_M made without an imatrix, with the prose one and with the chat one (llama-quantize);
- each measured against the F16 (``--kl-divergence``) on two gates no calibration saw: prose, data/botchan.txt
  (title page to chapter III; 16 x 512) and chat, data/chat/chat-gate.jsonl (the other ten categories; 9 x 512).
Prints one line per step and the table (mean KLD, and the ratio to the quant without an imatrix).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TYPES = ("Q4_K_M", "Q3_K_M")
CALIBRATIONS = {"prose": ROOT / "data" / "botchan-calib.txt",
                "chat": {"conversations": str(ROOT / "data" / "chat" / "chat-calib.jsonl")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="/tmp/ggufpipe-chat-calibration")
    args = ap.parse_args()

    from pipeline.demo import setup_rotated_demo
    from pipeline.errors import PipelineError
    from pipeline.recipe import EvalSet, load_recipe
    from pipeline.stages.evaluate import eval_base, eval_quant
    from pipeline.stages.imatrix import imatrix
    from pipeline.tools import find_toolchain, run_converter, run_tool, tail

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    tc = find_toolchain()
    t0 = time.monotonic()
    hf = setup_rotated_demo()
    f16 = work / "rotated-F16.gguf"
    if not f16.is_file():
        res = run_converter(tc, [str(hf), "--outfile", str(f16), "--outtype", "f16"], work / "convert.log")
        if res.returncode or not f16.is_file():
            raise PipelineError(f"convert: {tail(res.output)}")
    print(f"[1] rotated demo F16: {f16.stat().st_size / 2**20:.1f} MiB ({time.monotonic() - t0:.0f} s)", flush=True)

    sets = [EvalSet(name="prose", text=ROOT / "data" / "botchan.txt", ctx=512, chunks=16),
            EvalSet(name="chat", text=ROOT / "data" / "chat" / "chat-gate.jsonl", ctx=512, chunks=9, render="chat")]
    for es in sets:
        if not (work / f"{es.name}.json").is_file():
            eval_base("bench", es, f16, work / f"{es.name}.logits", work / f"{es.name}.json", args.threads,
                      work / "eval.log", tc)
    print(f"[2] base logits of both gates ({time.monotonic() - t0:.0f} s)", flush=True)

    imatrices = {}
    for label, cal in CALIBRATIONS.items():
        path = work / f"{label}.yaml"
        path.write_text(yaml.safe_dump({"name": f"cal-{label}", "source": {"path": str(hf)}, "quants": list(TYPES),
                                        "imatrix": {"calibration": cal if isinstance(cal, dict) else str(cal),
                                                    "ctx": 512, "chunks": args.chunks}}))
        out = imatrices[label] = work / f"imatrix-{label}.gguf"
        if not out.is_file():
            rec = imatrix(load_recipe(path), "plain", f16, out, work / f"imatrix-{label}.json", work / "imatrix.log",
                          args.threads, tc)
            print(f"[3] imatrix {label}: {rec['calibration_tokens']} tokens of calibration, {rec['seconds']} s"
                  + (f", {rec['render']['special_tokens']} special" if rec.get("render") else ""), flush=True)

    rows = {}
    for qtype in TYPES:
        for label in ("none", *CALIBRATIONS):
            q = work / f"{qtype}-{label}.gguf"
            if not q.is_file():
                imx = ["--imatrix", imatrices[label]] if label != "none" else []
                run_tool(tc, "llama-quantize", [*imx, f16, q, qtype, args.threads], work / "quantize.log", cwd=work)
            for es in sets:
                rec = work / f"eval-{qtype}-{label}-{es.name}.json"
                if not rec.is_file():
                    eval_quant("bench", f"{qtype}-{label}", es, q, work / f"{es.name}.logits", work / f"{es.name}.json",
                               rec, args.threads, work / "eval.log", tc)
                rows[(qtype, label, es.name)] = json.loads(rec.read_text())["metrics"]
            print(f"[4] {qtype} with imatrix {label}: measured ({time.monotonic() - t0:.0f} s)", flush=True)

    print("\n| type | imatrix from | prose gate: mean KLD (vs none) | chat gate: mean KLD (vs none) |")
    print("|---|---|---:|---:|")
    for qtype in TYPES:
        for label in ("none", *CALIBRATIONS):
            cells = []
            for es in ("prose", "chat"):
                v, ref = rows[(qtype, label, es)]["kld_mean"], rows[(qtype, "none", es)]["kld_mean"]
                cells.append(f"{v:.5f} ({v / ref:.3f})")
            print(f"| {qtype} | {label} | {cells[0]} | {cells[1]} |")
    print(f"\ntotal {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
