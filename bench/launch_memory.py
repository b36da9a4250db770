"""Does a device launch line fit what it predicts? The server memory of pipeline/launch.py against llama-server's peak
resident set (issue #30 item 4).

Run:  PYTHONPATH=. python bench/launch_memory.py
On the committed demo files (artifacts/, `dvc pull` first): for x86_64 devices (this box's CPU profile) of several
memories, slots, KV types, with and without the demo's draft, the launch line is computed (pipeline/launch.py); then
that `llama-server` line runs, answers one request (a 400-token prompt, 32 tokens), and its VmHWM (polled from
/proc/<pid>/status every 10 ms) is compared with the prediction. Prints one row per line and the ratio. Memory only:
any load on the box changes nothing here.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from pipeline_bench import _hwm_kb  # noqa: E402  the VmHWM reader of the pipeline bench

MIB = 1 << 20


def serve_peak(tc, args: list[str], folder: Path, prompt: str) -> int:
    """llama-server ARGS (in ``folder``) answering one request: its VmHWM in bytes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(tc.tool("llama-server")), *args, "--host", "127.0.0.1", "--port", str(port)],
                            cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak, done = [0], threading.Event()

    def poll():
        while not done.is_set():
            peak[0] = max(peak[0], _hwm_kb(proc.pid))
            time.sleep(0.01)

    threading.Thread(target=poll, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        body = json.dumps({"prompt": prompt, "n_predict": 32, "temperature": 0, "cache_prompt": False}).encode()
        req = urllib.request.Request(url + "/completion", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()
        time.sleep(0.05)
        peak[0] = max(peak[0], _hwm_kb(proc.pid))
    finally:
        done.set()
        proc.terminate()
        proc.wait(10)
    return peak[0] * 1024


def main() -> int:
    from pipeline.launch import launch
    from pipeline.recipe import load_recipe
    from pipeline.recipe.devices import Device
    from pipeline.tools import find_toolchain

    tc = find_toolchain()
    r = load_recipe(ROOT / "recipes" / "smollm2-135m.yaml")
    art, dart = ROOT / "artifacts" / r.name, ROOT / "artifacts" / r.draft_name
    prompt = (ROOT / "data" / "botchan.txt").read_text(encoding="utf-8")[20000:21600]
    draft_file = r.draft_recipe().artifact_for("Q4_0")
    drafts = {r.artifact_for(q): {"file": draft_file, "path": dart / draft_file, "label": "bench", "speedup": 1.0,
                                  "spec": ["-md", str(dart / draft_file), "--spec-type", "draft-simple",
                                           "--spec-draft-n-max", "4"]} for q in ("Q8_0", "Q4_K_M")}
    cases = [("Q8_0", Device("d", "1G", 1 << 30), False), ("Q8_0", Device("d", "1G", 1 << 30, parallel=2), False),
             ("Q8_0", Device("d", "400M", 400 * MIB), False), ("Q4_K_M", Device("d", "1G", 1 << 30), False),
             ("Q8_0", Device("d", "1G", 1 << 30, kv_type="q8_0"), False), ("Q8_0", Device("d", "2G", 2 << 30), True),
             ("Q4_K_M", Device("d", "2G", 2 << 30, parallel=4), True)]
    print("| line | predicted MiB | VmHWM MiB | predicted / VmHWM |\n|---|---|---|---|")
    for key, dev, with_draft in cases:
        dev = Device(dev.name, dev.memory, dev.memory_bytes, ctx=dev.ctx, kv_type=dev.kv_type, threads=2,
                     parallel=dev.parallel)
        file = r.artifact_for(key)
        e = launch(dev, [(file, art / file)], drafts if with_draft else {})
        args = e["line"].split()[1:]
        peak = serve_peak(tc, args, art, prompt)
        shown = e["line"].replace(str(dart) + "/", "")
        print(f"| `{shown}` | {e['memory']['total'] / MIB:.1f} | {peak / MIB:.1f} | "
              f"{e['memory']['total'] / peak:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
