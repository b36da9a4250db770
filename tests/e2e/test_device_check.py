"""The on-device check (issue #20 item 4) on real builds with the real llama.cpp tools: this machine plays the device.

* The published slice is byte for byte the file llama-perplexity writes when run over only those chunks, and each
  quant's slice values (its eval's chunk row, pipeline/stages/device_slice.py) are what a run on the slice measures.
* ``ggufpipe device-check`` passes on the demo's files; a tampered slice fails in one line naming the field; a file
  that computes like another quant fails the tolerance.
* ``ggufpipe collect`` then a publish show the device's row in the report and the card, and leave the manifest as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import BOTCHAN, ROOT, TINY_NAME

from pipeline.devices.check import find_device_tools, judge, measure
from pipeline.fsutil import sha256_file
from pipeline.stages.publish_devices import SLICE_FILE

NAME = "smollm2-135m"


def _manifest(folder):
    return json.loads((folder / "manifest.json").read_text())


def test_the_slice_is_what_a_run_over_its_chunks_writes(tiny_build, toolchain, tmp_path):
    folder = tiny_build / "artifacts" / TINY_NAME
    m = _manifest(folder)
    dc = m["device_check"]
    assert (dc["file"], dc["chunks"], dc["ctx"], dc["eval_set"]) == (SLICE_FILE, 2, 256, "botchan")
    assert sha256_file(folder / SLICE_FILE) == dc["sha256"]
    fresh = tmp_path / "fresh.logits"
    base = folder / m["artifacts"][0]["file"]
    res = subprocess.run([str(toolchain.tool("llama-perplexity")), "-m", str(base), "-f", str(BOTCHAN), "-c", "256",
                          "--chunks", "2", "-b", "256", "-t", "2", "--kl-divergence-base", str(fresh)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert fresh.read_bytes() == (folder / SLICE_FILE).read_bytes()
    for e in m["artifacts"]:  # the build box's values are what a run on the slice measures
        got = measure(toolchain, folder / e["file"], folder / SLICE_FILE, dc, threads=1)
        assert got["kld_mean"] == pytest.approx(e["slice"]["kld_mean"], abs=1e-5), e["file"]
        assert got["same_top_p"] == pytest.approx(e["slice"]["same_top_p"], abs=1e-5), e["file"]


def _device_check(*args, env=None):
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_DIR"} | (env or {})
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "device-check", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=env)


def test_device_check_passes_on_this_machine(demo_build, toolchain, tmp_path):
    """As on a device: the tools found on PATH (no LLAMA_CPP_DIR, no pinned build needed)."""
    folder = demo_build / "artifacts" / NAME
    out = tmp_path / "result.json"
    path = f"{toolchain.bin_dir}{os.pathsep}{os.environ['PATH']}"
    res = _device_check(folder / f"{NAME}-Q4_K_M.gguf", "--device", "build-box", "--threads", "1", "--out", out,
                        env={"PATH": path})
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith(f"PASS  {NAME}-Q4_K_M.gguf on build-box (llama.cpp b11312, 1 threads): mean KLD")
    r = json.loads(out.read_text())
    assert r["checked"] and r["passed"] and r["verified"].startswith("OK  ")
    assert r["tools"]["origin"] == "device" and r["tools"]["backend"] == "cpu"
    assert abs(r["slice"]["delta"]["kld_mean"]) < 1e-5 and abs(r["slice"]["delta"]["same_top_p_points"]) < 1e-3
    assert r["bench"]["tg_tokens_per_s"] > 0


def _copy_folder(folder, dest, files):
    dest.mkdir()
    for f in ["manifest.json", SLICE_FILE, *files]:
        if f == SLICE_FILE:
            shutil.copyfile(folder / f, dest / f)
        else:
            os.link(folder / f, dest / f)
    return dest


def test_a_tampered_slice_fails_in_one_line(demo_build, tmp_path):
    folder = _copy_folder(demo_build / "artifacts" / NAME, tmp_path / NAME, [f"{NAME}-Q8_0.gguf"])
    with open(folder / SLICE_FILE, "r+b") as fh:  # one base log-probability step changed, deep in the records
        fh.seek(40_000_000)
        b = fh.read(1)
        fh.seek(40_000_000)
        fh.write(bytes([b[0] ^ 1]))
    res = _device_check(folder / f"{NAME}-Q8_0.gguf", "--no-bench")
    assert res.returncode == 1 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {folder / SLICE_FILE}: SHA256 ")
    assert "device_check.sha256" in lines[0] and "file altered" in lines[0]


def test_a_file_that_computes_like_another_quant_fails_the_tolerance(demo_build):
    """What a device whose Q4_K_M kernels were wrong would report: another file's numbers on the slice."""
    folder = demo_build / "artifacts" / NAME
    m = _manifest(folder)
    entries = {e["file"]: e for e in m["artifacts"]}
    got = measure(find_device_tools(), folder / f"{NAME}-Q5_K_M.gguf", folder / SLICE_FILE, m["device_check"], 2)
    verdict = judge(entries[f"{NAME}-Q4_K_M.gguf"]["slice"], got, m["device_check"]["tolerance"],
                    m["device_check"]["scored_tokens"])
    assert not verdict["passed"] and abs(verdict["delta"]["kld_mean"]) > 5 * verdict["limit"]["kld_mean"], verdict


def test_collect_feeds_publish_and_leaves_the_manifest(demo_build, demo_recipe, tmp_path):
    from pipeline.cli.stage import _recipe
    from pipeline.layout import Layout
    from pipeline.stages.publish import publish, strip_volatile

    src = demo_build / "artifacts" / NAME
    arts = tmp_path / "artifacts"
    for folder in src.parent.iterdir():  # the recipe and its draft's (the draft section reads its manifest)
        shutil.copytree(folder, arts / folder.name, copy_function=os.link)
    draft = arts / f"{NAME}-draft" / f"{NAME}-draft-Q4_0.gguf"
    res = _device_check(arts / NAME / f"{NAME}-Q8_0.gguf", "--device", "pi5-8g", "--no-bench", "--out",
                        tmp_path / "r.json", "--draft", draft)
    assert res.returncode == 0, res.stderr
    # the draft's speed-up with this machine's llama-server (issue #30 item 3): the demo's pair is the same model at
    # Q4_0, so drafting doubles the work per token and no round can come out faster
    sp = json.loads((tmp_path / "r.json").read_text())["speedup"]
    acc = next(p for p in _manifest(src)["draft"]["pairs"] if p["main"] == f"{NAME}-Q8_0.gguf")["acceptance"]
    assert sp["pair"] == f"{NAME}-Q8_0.gguf + {draft.name}" and sp["n_max"] == acc["best_n_max"], sp
    assert len(sp["speedup_by_round"]) == 3 and sp["drafted"] > 0 and not sp["helps"], sp
    assert sp["verdict"].startswith("no speed-up on pi5-8g: measured ") and f"draft {draft.name}: no speed-up" in res.stdout
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "collect", tmp_path / "r.json", "--artifacts", arts],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0 and "added pi5-8g's result" in res.stdout, res.stderr
    before = _manifest(src)
    recipe = _recipe(str(demo_recipe))
    publish(recipe, Layout(arts, demo_build / "work"))
    assert strip_volatile(_manifest(arts / NAME)) == strip_volatile(before)  # results are shown, not part of the build
    report = (arts / NAME / "report.md").read_text()
    assert "## On-device check" in report and "| pi5-8g (" in report and f"`{NAME}-Q8_0.gguf` | b11312 |" in report
    assert "## Checked on devices" in (arts / NAME / "README.md").read_text()
    assert f"{sp['speedup']:.2f}x ({sp['interval'][0]:.2f}-{sp['interval'][1]:.2f}) with `{draft.name}`" in report


@pytest.fixture(scope="session")
def a76_tools():
    """The Cortex-A76 profile's cross-built tools (issue #34), from the cache like the x86 ones (built on a miss)."""
    from pipeline import tools_cross
    from pipeline.tools_install import install

    if shutil.which("aarch64-linux-gnu-g++") is None or shutil.which(tools_cross.QEMU) is None:
        pytest.skip(f"no aarch64 cross compiler or qemu-user: apt-get install {tools_cross.DEBIAN_PACKAGES} (.ci/run "
                    "does, as root)")
    return install(device=tools_cross.PROFILES["cortex-a76"])


def test_emulated_check_on_a_cortex_a76(tiny_build, a76_tools, tmp_path):
    """The one emulated check of the suite: a tiny Q4_0 through the A76's tools under qemu -cpu cortex-a76. Its kernels
    are the ARM ones (dotprod, repack), its numbers within the tolerance of the x86 build box's, its repack buffer the
    memory model's; no speeds, and collect refuses it."""
    from pipeline.memory import ModelShape, components

    info = json.loads((a76_tools / "toolchain.json").read_text())
    assert info["profile"] == "cortex-a76" and all(n > 100 for n in info["dot_instructions"].values()), info
    folder = tiny_build / "artifacts" / TINY_NAME
    m = _manifest(folder)
    file = next(e["file"] for e in m["artifacts"] if e["quant_type"] == "Q4_0")
    out = tmp_path / "a76.json"
    res = _device_check(folder / file, "--emulate", "cortex-a76", "--threads", "2", "--out", out)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith(f"PASS  {file} on ")
    r = json.loads(out.read_text())
    assert r["emulated"]["qemu_cpu"] == "cortex-a76" and r["tools"]["origin"] == "emulated"
    assert r["emulated"]["features"]["DOTPROD"] == "1" and r["emulated"]["features"]["REPACK"] == "1"
    assert r["bench"] is None and r["slice"]["seconds"] is None
    s = r["slice"]
    assert abs(s["delta"]["kld_mean"]) <= s["limit"]["kld_mean"] / 2, s  # well inside, not just inside
    predicted = components(ModelShape.from_gguf(folder / file), m["device_check"]["ctx"], arch="arm64-dotprod")
    assert r["buffers_mib"]["CPU_REPACK model"] == pytest.approx(predicted["repack"] / (1 << 20), abs=0.01)
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "collect", out, "--artifacts", tiny_build / "artifacts"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 1 and "emulated (cortex-a76 under qemu)" in res.stderr
