"""``python -m pipeline.progress``: run a build (Snakemake) and show a newcomer one line per step, with the time since
the run began, instead of Snakemake's pages of rule listings; the whole output goes to a log. At the end: the card's
path, or the build's error lines and the log. ``make demo`` and ``make demo-full`` run through it.

    python -m pipeline.progress --since EPOCH --log LOG --card README.md -- snakemake --cores 2 ...
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

_STEPS_RE = re.compile(r"^(\d+) of (\d+) steps \((\d+)%\) done")
_RULE_RE = re.compile(r"^(?:local)?rule (\w+):")
_JOBID_RE = re.compile(r"^\s+jobid: (\d+)$")
_WILDCARDS_RE = re.compile(r"^\s+wildcards: (.*)$")
_FINISHED_RE = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)")


def elapsed(since: float) -> str:
    s = int(time.time() - since)
    return f"{s // 60}:{s % 60:02d}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.progress", description=__doc__.splitlines()[0])
    ap.add_argument("--since", type=float, default=None, help="the run's start (seconds since the epoch; default now)")
    ap.add_argument("--log", required=True, help="where the build's whole output goes")
    ap.add_argument("--card", action="append", default=[], help="the model card(s) to point to at the end")
    ap.add_argument("--label", default="demo")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    since = time.time() if a.since is None else a.since
    log = Path(a.log)
    log.parent.mkdir(parents=True, exist_ok=True)
    names: dict[str, str] = {}  # jobid -> "rule (wildcards)", to name the step a "Finished jobid" line closes
    rule = job = done = None
    errors: list[str] = []
    with open(log, "w", encoding="utf-8") as fh, subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            fh.flush()
            if line.startswith("error: "):
                errors.append(line.rstrip())
            if m := _RULE_RE.match(line):
                rule = m.group(1)
            elif m := _JOBID_RE.match(line):
                job = m.group(1)
                names[job] = rule or "?"
            elif (m := _WILDCARDS_RE.match(line)) and job in names:
                names[job] = f"{names[job]} ({m.group(1)})"
            elif m := _FINISHED_RE.match(line):
                done = names.pop(m.group(1), m.group(2))
            elif m := _STEPS_RE.match(line):
                print(f"[{a.label} {elapsed(since)}] step {m.group(1)} of {m.group(2)} ({m.group(3)}%)"
                      + (f": {done}" if done else ""), flush=True)
            elif line.startswith("Nothing to be done"):
                print(f"[{a.label} {elapsed(since)}] nothing to do: everything is built", flush=True)
        rc = proc.wait()
    if rc != 0:
        for e in errors[-5:] or ["(no error line: see the log)"]:
            print(e, file=sys.stderr)
        print(f"[{a.label} {elapsed(since)}] failed (exit {rc}); the whole output: {log}", file=sys.stderr)
        return rc
    for card in a.card:
        print(f"[{a.label} {elapsed(since)}] done: the model card is {card}", flush=True)
    print(f"[{a.label} {elapsed(since)}] the whole output: {log}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
