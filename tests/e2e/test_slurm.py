"""The workflow on a real distributed engine: a single-node Slurm cluster (Debian's slurmctld, slurmd,
munged; tests/helpers/slurm_cluster.py) builds one quant of the tiny model (tests/conftest.py: tiny_hub) through
snakemake-executor-plugin-slurm with the repo's profile (profiles/slurm), and its GGUFs and manifest entries are
byte-identical to the local build's (tiny_build). Also: every rule declares its resources, and the estimates
that input sizes alone do not give match the demo build's real files.

Runs as root where the Debian packages are installed (.ci/run installs them); skipped otherwise."""

from __future__ import annotations

import json
import re
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, TINY_NAME, snakemake
from helpers.slurm_cluster import SlurmCluster, unavailable

from pipeline.fsutil import sha256_file

REASON = unavailable()
NAME = "smollm2-135m"


def one_quant_recipe(src: Path, dest: Path) -> tuple:
    """The tiny recipe with its first quant (Q8_0) only; same name, source and eval set, so that its F16 and
    Q8_0 must equal tiny_build's."""
    data = yaml.safe_load(src.read_text())
    data["quants"] = data["quants"][:1]
    dest.mkdir(parents=True)
    path = dest / f"{TINY_NAME}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, data


def steady_polling(folder: Path) -> Path:
    """Snakemake with the Slurm plugin's status checks kept at their first interval. The plugin adds 10 s to the
    interval after every check that finds no job finished (up to 180 s: snakemake_executor_plugin_slurm/__init__.py,
    check_active_jobs), which on this one-node cluster of few-second jobs was most of the test's time."""
    script = folder / "snakemake_steady.py"
    script.write_text(textwrap.dedent("""\
        import runpy

        import snakemake_executor_plugin_slurm as slurm
        from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

        interval = RemoteExecutor.next_seconds_between_status_checks
        slurm.Executor.next_seconds_between_status_checks = property(
            interval.fget, lambda self, value: interval.fset(self, min(value, 2)))
        runpy.run_module("snakemake", run_name="__main__", alter_sys=True)
        """))
    return script


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_slurm_build_equals_local_build(tmp_path, tiny_hub, tiny_build):
    hub, tiny_recipe = tiny_hub
    recipe, data = one_quant_recipe(tiny_recipe, tmp_path / "recipes")
    assert [q if isinstance(q, str) else q["type"] for q in data["quants"]] == ["Q8_0"]
    work = tmp_path / "build"
    work.mkdir()
    cluster = SlurmCluster(cpus=2)
    started = time.monotonic()
    try:
        with cluster:
            up = time.monotonic() - started
            res = snakemake(work, recipe, hub=hub, runner=steady_polling(tmp_path), extra=[
                "--profile", str(ROOT / "profiles" / "slurm"),
                "--slurm-init-seconds-before-status-checks", "2",  # small jobs: check soon
                "--seconds-between-status-checks", "1",  # and often (default 10 s: most of the test's time)
                "--slurm-keep-successful-logs", "--slurm-no-account"])
            built = time.monotonic() - started - up
            log = cluster.ctld_log.read_text(errors="replace")
            states = {line.split()[0]: line.split()[1] for line in cluster.squeue_all()}
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:] + "\n" + cluster.logs_tail()
        print(f"\nslurm cluster up in {up:.1f} s, build through Slurm {built:.1f} s")

        # every job went through sbatch and ended in Slurm with exit status 0
        submitted = dict(re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", out))
        done = re.search(r"(\d+) of (\d+) steps \(100%\) done", out)
        assert done and len(submitted) == int(done.group(2)) - 1 >= 7, out[-3000:]  # fetch ... gate; not `all`
        for jobid in submitted.values():
            assert f"_job_complete: JobId={jobid} WEXITSTATUS 0" in log, (jobid, log[-3000:])
            assert states.get(jobid) == "COMPLETED", (jobid, states)
        rules = {p.name for p in (work / ".snakemake" / "slurm_logs").iterdir()}
        assert {"rule_fetch", "rule_convert", "rule_quantize", "rule_eval_base", "rule_eval", "rule_publish",
                "rule_gate"} <= rules, rules
        assert re.findall(r"^localrule (\w+):", out, re.M) == ["all"], "a rule ran outside Slurm"
    finally:
        cluster.cleanup()

    # the same bytes as the local build: every GGUF, and its whole manifest entry (SHA256, type, size and the
    # gate metrics, which are bit-identical because eval threads are fixed)
    folder, local_folder = work / "artifacts" / TINY_NAME, tiny_build / "artifacts" / TINY_NAME
    files = sorted(p.name for p in folder.glob("*.gguf"))
    assert files == [f"{TINY_NAME}-F16.gguf", f"{TINY_NAME}-Q8_0.gguf"]
    for f in files:
        assert sha256_file(folder / f) == sha256_file(local_folder / f), f
    remote = {a["file"]: a for a in json.loads((folder / "manifest.json").read_text())["artifacts"]}
    local = {a["file"]: a for a in json.loads((local_folder / "manifest.json").read_text())["artifacts"]}
    assert sorted(remote) == files
    for f in files:
        assert remote[f] == local[f], f
        assert remote[f]["sha256"] == sha256_file(folder / f)
    assert remote[f"{TINY_NAME}-Q8_0.gguf"]["gate"]["passed"] is True
    assert (work / "work" / TINY_NAME / "gate.ok").exists()


def test_every_rule_declares_its_resources(tmp_path, demo_hub):
    """Every job of every recipe declares mem_mb, disk_mb and runtime itself: with the defaults set to 1, a
    dry run over all recipes shows none of them at 1 (values still <TBD> depend on inputs not built yet)."""
    res = snakemake(tmp_path, ROOT / "recipes", hub=demo_hub,
                    extra=["-n", "--default-resources", "mem_mb=1", "disk_mb=1", "runtime=1"])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    found: dict[str, set[str]] = {}
    rule = None
    for line in res.stdout.splitlines():
        if m := re.match(r"(local)?rule (\w+):", line):
            rule = m.group(2)
        elif line.strip().startswith("resources:") and rule:
            values = dict(kv.split("=", 1) for kv in line.split(":", 1)[1].strip().split(", "))
            found.setdefault(rule, set()).update(k for k in ("mem_mb", "disk_mb", "runtime") if values[k] == "1")
    from pipeline.devices.plan_jobs import resources
    from pipeline.stages import registry

    rules = set(registry())
    assert rules - set(found) == {"convert_mtp", "split", "sensitivity", "solve"}  # no recipe here uses them
    assert {r: d for r, d in found.items() if d and r != "all"} == {}
    for r in rules:  # every declared stage (those unused here included) declares all three
        assert set(resources(r)) == {"mem_mb", "disk_mb", "runtime"}, r


def test_derived_resources_match_real_files(demo_build, demo_hub, demo_recipe):
    """The estimates that input sizes alone do not give, against the demo build's real files: the base logits
    file (from ctx, chunks and the vocabulary in the base GGUF's header) and the source snapshot's size."""
    from pipeline.stagedef import logits_bytes, size_mb
    from pipeline.workflow import Workflow

    wf = Workflow({"recipes": str(demo_recipe), "hf_hub_cache": str(demo_hub)})
    es = wf.recipe(NAME).eval_sets[0]
    logits = demo_build / "work" / NAME / "eval" / es.name / "base.logits"
    assert logits.stat().st_size == logits_bytes(es.ctx, es.chunks, 49152)  # SmolLM2: 49152 tokens
    base = demo_build / "work" / NAME / "quants" / f"{NAME}-F16.gguf"
    from pipeline.devices.plan_jobs import JobSizes, resources

    def disk(rule: str, wc: dict, inputs: dict) -> int:  # as the rules' resources evaluate it
        return resources(rule)["disk_mb"](JobSizes(wf, {"name": NAME, **wc}, inputs))

    assert disk("eval_base", {"es": es.name}, {"base": str(base)}) == int(logits.stat().st_size / 2**20 + 512)
    # before the base GGUF exists: the bound, never less than the real file
    assert disk("eval_base", {"es": es.name}, {"base": str(base) + ".absent"}) > logits.stat().st_size / 2**20
    hf = size_mb(demo_build / "work" / NAME / "hf")
    assert hf > 200 and abs(wf.source_mb(NAME) - hf) < 1  # the snapshot holds what fetch took (and a little)
    assert disk("fetch", {}, {}) == int(2 * wf.source_mb(NAME) + 512)
