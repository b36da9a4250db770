"""`make demo`'s progress lines (pipeline/progress.py): one per Snakemake step, naming the job it closed, with the time
since the run began; the card's path at the end; on a failure the build's error lines and the log. The build here is
a command that prints Snakemake 9's output as it appears in a demo run's log."""

from __future__ import annotations

import sys
import time

from pipeline.progress import main

# as Snakemake 9 prints two jobs of the demo, the second finishing first
SNAKEMAKE_OUT = """\
Select jobs to execute...
[Tue Dec  8 00:27:00 2026]
localrule fetch:
    output: work/m/hf, work/m/records/fetch.json
    jobid: 3
    reason: Missing output files: work/m/hf
    wildcards: name=m
[Tue Dec  8 00:27:00 2026]
localrule eval:
    jobid: 17
    wildcards: name=m, es=botchan, quant=Q8_0
[Tue Dec  8 00:27:01 2026]
Finished jobid: 17 (Rule: eval)
1 of 3 steps (33%) done
[Tue Dec  8 00:27:02 2026]
Finished jobid: 3 (Rule: fetch)
2 of 3 steps (67%) done
localrule all:
    jobid: 0
Finished jobid: 0 (Rule: all)
3 of 3 steps (100%) done
"""


def _build(tmp_path, text: str, code: int = 0) -> list[str]:
    script = tmp_path / "build.py"
    script.write_text(f"import sys\nsys.stdout.write({text!r})\nsys.exit({code})\n")
    return [sys.executable, str(script)]


def test_one_line_per_step_and_the_card_at_the_end(tmp_path, capsys):
    log = tmp_path / "logs" / "demo.log"
    rc = main(["--since", str(time.time() - 75), "--log", str(log), "--card", "artifacts/m/README.md", "--",
               *_build(tmp_path, SNAKEMAKE_OUT)])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0 and out == [
        "[demo 1:15] step 1 of 3 (33%): eval (name=m, es=botchan, quant=Q8_0)",
        "[demo 1:15] step 2 of 3 (67%): fetch (name=m)",
        "[demo 1:15] step 3 of 3 (100%): all",
        "[demo 1:15] done: the model card is artifacts/m/README.md",
        f"[demo 1:15] the whole output: {log}",
    ], out
    assert log.read_text() == SNAKEMAKE_OUT  # every line of the build, in the log


def test_a_failed_build_shows_its_error_lines_and_the_log(tmp_path, capsys):
    text = SNAKEMAKE_OUT.split("2 of 3")[0] + "error: gate failed: recipe m, quant Q8_0, eval set botchan: ...\n"
    log = tmp_path / "demo.log"
    rc = main(["--label", "demo-full", "--log", str(log), "--card", "x/README.md", "--", *_build(tmp_path, text, 1)])
    out, err = capsys.readouterr()
    assert rc == 1 and "done:" not in out and out.splitlines()[-1].endswith(": eval (name=m, es=botchan, quant=Q8_0)")
    assert err.splitlines()[0] == "error: gate failed: recipe m, quant Q8_0, eval set botchan: ..."
    assert err.splitlines()[-1] == f"[demo-full 0:00] failed (exit 1); the whole output: {log}"
