"""Measure what `ggufpipe plan` predicts (docs/planning.md): each stage's peak RSS (VmHWM of the stage process and
every process it starts: /usr/bin/time's %M, the largest of the tree) and a build's disk peak.

    python bench/plan_check.py ram --recipe R --name N --work W [--stage convert ...] --out ram.json
    python bench/plan_check.py disk --recipe R --hub HUB --dir DIR --out disk.json

``ram`` reruns stage commands on an existing build (``--work`` a hard-linked copy: every stage writes its outputs
atomically, so the originals are never changed). ``disk`` runs a whole Snakemake build into DIR and polls the used
bytes of DIR's filesystem every 20 ms (DIR should be a filesystem of its own, e.g. a tmpfs)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# stage key -> the `ggufpipe stage` arguments after the common ones (as the rules pass them)
STAGE_ARGS = {
    "convert": ["convert", "--quantized-by", "ggufpipe"],
    "awq": ["awq", "--threads", "2"],
    "imatrix": ["imatrix", "--base", "plain", "--threads", "2"],
    "eval_base": ["eval-base", "--eval-set", "{es}", "--threads", "2"],
    "eval": ["eval", "--eval-set", "{es}", "--quant", "{quant}", "--threads", "2"],
    "quantize": ["quantize", "--quant", "{quant}", "--threads", "2"],
    "conformance": ["conformance", "--threads", "2"],
}


def stage_env() -> dict:
    env = dict(os.environ)
    env.setdefault("GGUFPIPE_PYTHON", sys.executable)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


def vmhwm(cmd: list[str], env: dict, cwd: Path = ROOT) -> tuple[int, float, int, str]:
    """(rc, seconds, peak RSS bytes of the largest process of the tree, output tail)."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        t0 = time.monotonic()
        res = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", tf.name, *cmd], cwd=cwd, env=env,
                             capture_output=True, text=True)
        dt = time.monotonic() - t0
        lines = [ln for ln in Path(tf.name).read_text().splitlines() if ln.strip().isdigit()]
    return res.returncode, dt, int(lines[-1]) * 1024 if lines else 0, (res.stdout + res.stderr)[-1500:]


def cmd_ram(a) -> None:
    env = stage_env()
    out = {}
    for spec in a.stage:
        key, _, arg = spec.partition(":")
        args = [x.format(es=a.eval_set, quant=arg or "Q8_0") for x in STAGE_ARGS[key]]
        cmd = [sys.executable, "-m", "pipeline.cli", "stage", *args, "--recipe", a.recipe, "--name", a.name,
               "--work", a.work, "--artifacts", a.artifacts]
        rc, dt, peak, tail = vmhwm(cmd, env)
        out[spec] = {"rc": rc, "seconds": round(dt, 2), "vmhwm": peak}
        print(f"{spec:24} rc {rc}  {dt:7.1f} s  VmHWM {peak / 2**20:8.1f} MiB", flush=True)
        if rc:
            print(tail, flush=True)
        Path(a.out).write_text(json.dumps(out, indent=1))


def cmd_disk(a) -> None:
    d = Path(a.dir)
    st = os.statvfs(d)
    used0 = (st.f_blocks - st.f_bfree) * st.f_frsize
    peak = [used0]
    done = threading.Event()

    def poll():
        while not done.is_set():
            s = os.statvfs(d)
            peak[0] = max(peak[0], (s.f_blocks - s.f_bfree) * s.f_frsize)
            time.sleep(0.02)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    env = stage_env()
    env["HF_HUB_CACHE"] = a.hub
    t0 = time.monotonic()
    res = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "--snakefile", str(ROOT / "Snakefile"),
                          "--directory", str(d), "--cores", "2", "--config", f"recipes={a.recipe}",
                          f"hf_hub_cache={a.hub}"], env=env, capture_output=True, text=True, cwd=d)
    done.set()
    th.join()
    s = os.statvfs(d)
    final = (s.f_blocks - s.f_bfree) * s.f_frsize
    out = {"rc": res.returncode, "seconds": round(time.monotonic() - t0, 1), "peak": peak[0] - used0,
           "final": final - used0, "tail": (res.stdout + res.stderr)[-2000:] if res.returncode else ""}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "tail"}), out["tail"])


def predicted(recipe: str, name: str, source: str | None, hub: str | None) -> tuple[dict, dict]:
    """(RAM per stage key as plan_check names them, disk rows) from `ggufpipe plan`'s functions."""
    sys.path.insert(0, str(ROOT))
    from pipeline.cli.plan import plan_recipe
    from pipeline.devices.plan_jobs import BOX
    from pipeline.workflow import Workflow

    W = Workflow({"recipes": recipe, "hf_hub_cache": hub or ""} if hub else {"recipes": recipe})
    p = plan_recipe(W, name, source, BOX)
    ram = {}
    for r in p["ram"]:
        key = r["stage"] if r["stage"] in ("convert", "awq", "imatrix", "conformance", "eval_base") else \
            f"{r['stage']}:{r['key'].split('/')[-1]}"
        ram[key] = r
    return ram, p


def cmd_compare(a) -> None:
    ram, p = predicted(a.recipe, a.name, a.source, a.hub)
    print(f"| {a.label} stage | predicted | VmHWM | predicted / measured |")
    print("|---|---:|---:|---:|")
    for m in a.measured:
        for key, v in json.loads(Path(m).read_text()).items():
            if v["rc"] or key not in ram:
                continue
            pr = ram[key]["bytes"]
            print(f"| {key} | {pr / 2**20:.1f} MiB | {v['vmhwm'] / 2**20:.1f} MiB | {pr / v['vmhwm']:.2f} |")
    if a.disk:
        d = json.loads(Path(a.disk).read_text())
        print(f"\ndisk: predicted {p['disk_total'] / 2**20:.2f} MiB, real peak {d['peak'] / 2**20:.2f} MiB "
              f"({p['disk_total'] / d['peak']:.3f})")
    if a.files:
        rows = {(r["stage"], r["key"]): r["bytes"] for r in p["disk"]}
        for spec in a.files:
            key, _, path = spec.partition("=")
            stage, _, k = key.partition(":")
            real = Path(path).stat().st_size
            print(f"| {key} | {rows[(stage, k)]} | {real} | {rows[(stage, k)] / real:.4f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("ram")
    r.add_argument("--recipe", required=True)
    r.add_argument("--name", required=True)
    r.add_argument("--work", required=True)
    r.add_argument("--artifacts", required=True)
    r.add_argument("--eval-set", default="botchan")
    r.add_argument("--stage", action="append", required=True, help="convert, eval:Q4_K_M, quantize:Q8_0, ...")
    r.add_argument("--out", required=True)
    r.set_defaults(func=cmd_ram)
    d = sub.add_parser("disk")
    d.add_argument("--recipe", required=True)
    d.add_argument("--hub", required=True)
    d.add_argument("--dir", required=True)
    d.add_argument("--out", required=True)
    d.set_defaults(func=cmd_disk)
    c = sub.add_parser("compare", help="predicted (ggufpipe plan's functions) vs measured")
    c.add_argument("--recipe", required=True)
    c.add_argument("--name", required=True)
    c.add_argument("--label", default="")
    c.add_argument("--source")
    c.add_argument("--hub")
    c.add_argument("--measured", action="append", default=[], help="JSON of `ram`")
    c.add_argument("--disk", help="JSON of `disk`")
    c.add_argument("--files", action="append", default=[], help="stage:key=PATH of a real output")
    c.set_defaults(func=cmd_compare)
    a = ap.parse_args()
    a.func(a)


if __name__ == "__main__":
    main()
