"""End to end: the real Snakemake workflow on the demo recipe with the real llama.cpp tools."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FAKE_TOKEN, ROOT, TINY_NAME, snakemake

from pipeline.errors import PipelineError
from pipeline.fsutil import sha256_file
from pipeline.gguf import general_metadata, read_facts

NAME = "smollm2-135m"


def _manifest(root):
    return json.loads((root / "artifacts" / NAME / "manifest.json").read_text())


def test_manifest_matches_files(demo_build):
    m = _manifest(demo_build)
    folder = demo_build / "artifacts" / NAME
    files = {e["file"]: e for e in m["artifacts"]}
    assert set(files) == {f"{NAME}-{t}.gguf" for t in ("F16", "Q8_0", "Q5_K_M", "Q4_K_M")}
    assert sorted(p.name for p in folder.glob("*.gguf")) == sorted(files)
    for name, entry in files.items():
        path = folder / name
        assert entry["sha256"] == sha256_file(path)
        assert entry["size_bytes"] == path.stat().st_size
        facts = read_facts(path)
        expected = name.removeprefix(f"{NAME}-").removesuffix(".gguf")
        assert facts.quant_type == entry["quant_type"] == expected
        assert entry["gguf_version"] == 3 and entry["tensor_count"] == facts.tensor_count > 200
        assert 4.0 < entry["bits_per_weight"] < 16.1  # F16 files keep F32 norms
    bpw = {e["quant_type"]: e["bits_per_weight"] for e in m["artifacts"]}
    assert bpw["F16"] > bpw["Q8_0"] > bpw["Q5_K_M"] > bpw["Q4_K_M"]


def test_manifest_provenance(demo_build, demo_recipe):
    from pipeline.demo import DEMO_COMMIT

    m = _manifest(demo_build)
    assert m["recipe"]["sha256"] == sha256_file(demo_recipe)
    assert m["source"]["repo"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert m["source"]["commit"] == DEMO_COMMIT
    assert m["tools"]["llama_cpp_build"] == 11312 and m["tools"]["llama_cpp_commit"] == "0c1e570"
    py = m["tools"]["python"]  # per environment (pipeline/envs.py)
    assert set(py) == {"build", "converter"} and "autoawq" not in py["build"], py
    assert {"torch", "transformers", "safetensors", "numpy"} <= set(py["converter"]) and "gguf" not in py["converter"]
    assert py["converter"]["transformers"] == "4.57.6" and py["build"]["torch"] == py["converter"]["torch"], py
    assert m["tools"]["converter_unmet"] == {"torch": {"required": "==2.11.0", "installed": py["converter"]["torch"]}}
    assert m["build_id"].startswith(NAME + "-") and len(m["build_id"]) == len(NAME) + 13
    assert set(m["build"]) == {"timestamp", "bench", "bench_label", "draft_decode_tokens_per_s", "eval_threads",
                               "conformance_seconds", "device", "launch"}
    assert m["build"]["device"] == "cpu" and m["tools"]["backend"] == "cpu" and "ngl" not in m["tools"]
    assert m["build"]["eval_threads"] == {"botchan": 2}  # eval_threads capped by --cores 2: volatile, not in eval_sets
    assert all("threads" not in es for es in m["eval_sets"])
    q4 = next(e for e in m["artifacts"] if e["quant_type"] == "Q4_K_M")
    assert q4["requested"] == {"type": "Q4_K_M"} and q4["role"] == "quant"


def test_converter_environment_writes_the_committed_bytes(demo_build):
    """The converter environment (transformers 4.57.6, numpy 2.2) writes the F16 the build environment's
    transformers 4.56.2 wrote for the committed demo artifacts: byte for byte (the test-sized recipe differs in eval
    sample sizes only)."""
    committed = json.loads((ROOT / "artifacts" / NAME / "manifest.json").read_text())
    want = next(e["sha256"] for e in committed["artifacts"] if e["quant_type"] == "F16")
    assert sha256_file(demo_build / "artifacts" / NAME / f"{NAME}-F16.gguf") == want


def test_manifest_tensor_types(demo_build):
    """Issue #19: every quant's per-type histogram (read back), its predicted size to the byte, and the tensors
    whose type differs from what the recipe asked (the demo's n_embd 576: K-type shape fallback)."""
    from pipeline.gguf.reader import read_header
    from pipeline.stages.quant_plan import differs_by_tensor

    m = _manifest(demo_build)
    quants = {e["quant_type"]: e for e in m["artifacts"] if e["role"] == "quant"}
    assert set(quants) == {"Q8_0", "Q5_K_M", "Q4_K_M"}
    for e in quants.values():
        tt = e["tensor_types"]
        h = read_header(demo_build / "artifacts" / NAME / e["file"])
        hist: dict[str, int] = {}
        for t in h.tensors:
            hist[t.type_name] = hist.get(t.type_name, 0) + 1
        assert tt["histogram"] == dict(sorted(hist.items()))
        assert tt["bytes"]["predicted"] == tt["bytes"]["written"] == e["size_bytes"]
        written = {t.name: t.type_name for t in h.tensors}
        by_tensor = differs_by_tensor(tt["differs"])
        assert len(by_tensor) == sum(len(g["tensors"]) for g in tt["differs"])  # each tensor in one entry
        assert all(written[t] == d["written"] != d["asked"] for t, d in by_tensor.items())
    assert quants["Q8_0"]["tensor_types"]["differs"] == []
    for qt, k, fb in (("Q4_K_M", "Q4_K", "Q5_0"), ("Q5_K_M", "Q5_K", "Q5_1")):
        pairs = {(d["asked"], d["written"]) for d in quants[qt]["tensor_types"]["differs"]}  # one per group
        assert pairs == {(k, fb), ("Q6_K", "Q8_0")}, qt


def test_gguf_general_metadata(demo_build):
    meta = general_metadata(demo_build / "artifacts" / NAME / f"{NAME}-Q4_K_M.gguf")
    assert meta["general.quantized_by"] == "ggufpipe"
    assert meta["general.name"] == "SmolLM2-135M-Instruct"
    assert meta["general.source.url"] == "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct"
    assert meta["general.license"] == "apache-2.0"


def test_q4_k_m_perplexity_bound(demo_build):
    """The published Q4_K_M's perplexity as its gate measured it (test_demo_fixture checks the recorded F16
    figure against a run of llama-perplexity of its own)."""
    q4 = next(a for a in _manifest(demo_build)["artifacts"] if a["quant_type"] == "Q4_K_M")
    assert q4["metrics"]["botchan"]["ppl_q"] < 35, q4["metrics"]


def test_launch_line_per_device(demo_build):
    """The demo's three devices (recipes/smollm2-135m.yaml) each get a llama-server line for their best published
    quant (issue #30 item 4): the card and the report show the fit table and the lines. The suite's build measures no
    speed-up, so no line carries a draft."""
    m = _manifest(demo_build)
    launch, devices = m["build"]["launch"], m["devices"]
    assert list(launch) == ["pi5-8g", "phone-4g", "laptop-16g"] == list(devices)
    card = (demo_build / "artifacts" / NAME / "README.md").read_text()
    for dev, e in launch.items():
        assert e["file"] == f"{NAME}-{devices[dev]['best']}.gguf" and "-md" not in e["line"], e
        assert e["line"].startswith(f"llama-server -m {e['file']} -c {e['ctx']} -np {e['parallel']} -t "), e
        assert e["ctx"] == 8192 * e["parallel"] and e["memory"]["total"] + e["margin_bytes"] == devices[dev]["memory_bytes"]
        assert f"`{e['line']}`" in card
    assert "## Fits on" in card and "## Launch on a device" in card


def test_kv_cache_types_measured(tiny_build):
    """Issue #33 item 2 through the real workflow and llama-perplexity (the tiny build: its evals take 0.2 s; the demo's
    real numbers are checked in tests/unit/test_kv_types.py): each quant measured again with q8_0 and q4_0 caches, the
    runs' arguments as llama.cpp takes them, kv_costs with the bytes of each cache, the report's table and plot."""
    folder = tiny_build / "artifacts" / TINY_NAME
    m = json.loads((folder / "manifest.json").read_text())
    assert m["eval_sets"][0]["kv_types"] == ["f16", "q8_0", "q4_0"]
    quants = [e for e in m["artifacts"] if e.get("role") == "quant"]
    rows = {(r["file"], r["kv_type"]): r for r in m["kv_costs"]["rows"]}
    assert set(rows) == {(e["file"], t) for e in quants for t in ("f16", "q8_0", "q4_0")}
    for e in quants:
        kv = e["metrics"]["botchan"]["kv"]
        assert set(kv) == {"q8_0", "q4_0"} and all(v["inside"] for v in kv.values())  # thresholds of 100
        assert rows[e["file"], "q4_0"]["kv_bytes"] < rows[e["file"], "q8_0"]["kv_bytes"] < rows[e["file"], "f16"]["kv_bytes"]
        assert kv["q4_0"]["kld_mean"] != e["metrics"]["botchan"]["kld_mean"]  # another computation, not a copy
    log = (tiny_build / "work" / TINY_NAME / "logs" / "eval-botchan-Q8_0.log").read_text()
    assert "-ctk q4_0 -ctv q4_0 --kl-divergence-base" in log
    assert "## KV cache types" in (folder / "report.md").read_text() and (folder / "kv.svg").is_file()


def test_rerun_runs_zero_jobs(demo_build, demo_hub, demo_recipe):
    res = snakemake(demo_build, demo_recipe, extra=["--dry-run"], hub=demo_hub)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Nothing to be done" in res.stdout + res.stderr


def test_rerun_with_another_interpreter_path_runs_zero_jobs(demo_build, demo_hub, demo_recipe):
    """The interpreter is not a rerun trigger: another path to the same venv (python3 vs python) finds
    nothing to do."""
    other = Path(sys.executable).with_name("python3" if Path(sys.executable).name != "python3" else "python")
    assert other.exists() and str(other) != sys.executable
    cmd = [str(other), "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
           "--directory", str(demo_build), "--cores", "2", "--dry-run", "--config", f"recipes={demo_recipe}"]
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1",
                                                                   "HF_HUB_CACHE": str(demo_hub)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Nothing to be done" in res.stdout + res.stderr, (res.stdout + res.stderr)[-2000:]


def test_clean_logits_then_rerun(demo_build, demo_hub, demo_recipe, tmp_path):
    """`ggufpipe clean-logits` on a finished build (a hard-linked copy): nothing to re-run; evals that run
    again use the stub (recomputing the logits themselves), no eval-base job."""
    from pipeline.stages.clean_logits import clean_logits

    copy = tmp_path / "copy"
    for sub in ("work", "artifacts", ".snakemake"):
        shutil.copytree(demo_build / sub, copy / sub, copy_function=os.link, symlinks=True,
                        ignore=shutil.ignore_patterns("locks", "incomplete", "log"))
    logits = copy / "work" / NAME / "eval" / "botchan" / "base.logits"
    logits.unlink()  # a copy of its own (clean-logits empties the file in place)
    shutil.copy2(demo_build / "work" / NAME / "eval" / "botchan" / "base.logits", logits)
    mtime = logits.stat().st_mtime_ns
    gone = clean_logits(copy / "work", [NAME])
    assert [p.name for p, _ in gone] == ["base.logits"] and gone[0][1] > 100e6
    assert logits.stat().st_size == 0 and logits.stat().st_mtime_ns == mtime
    res = snakemake(copy, demo_recipe, extra=["--dry-run"], hub=demo_hub)
    assert res.returncode == 0 and "Nothing to be done" in res.stdout + res.stderr, (res.stdout + res.stderr)[-2000:]
    # the evals forced again (as for a quant added to the recipe, which here would need a recipe at another
    # path, itself a rerun trigger): they take the stub as it is, the base logits job does not run
    res = snakemake(copy, demo_recipe, extra=["--dry-run", "--quiet", "rules", "--forcerun", "eval"], hub=demo_hub)
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    out = res.stdout + res.stderr
    counts = dict(re.findall(r"^(\w+)\s+(\d+)\s*$", out, re.M))
    assert counts.get("eval") == "3", out
    assert not {"convert", "fetch", "quantize", "eval_base", "agreement"} & set(counts), out


def test_no_token_or_temp_files_left(demo_build):
    for path in demo_build.rglob("*"):
        if path.is_file() and ".snakemake" not in path.parts:
            assert FAKE_TOKEN.encode() not in path.read_bytes()[:50_000_000], path
        assert ".tmp-" not in path.name, path


def test_verify_against_manifest(demo_build, tmp_path):
    """`ggufpipe verify`: a pulled file checked against its manifest; altered or truncated copies fail."""
    from pipeline.cli import main

    src = demo_build / "artifacts" / NAME
    shutil.copyfile(src / "manifest.json", tmp_path / "manifest.json")
    good = tmp_path / f"{NAME}-Q4_K_M.gguf"
    shutil.copyfile(src / good.name, good)
    assert main(["verify", str(good)]) == 0
    with open(good, "r+b") as fh:  # flip one byte in the tensor data
        fh.seek(good.stat().st_size // 2)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0xFF]))
    assert main(["verify", str(good)]) == 1
    with open(good, "r+b") as fh:
        fh.truncate(1000)
    assert main(["verify", str(good)]) == 1
    assert main(["verify", str(tmp_path / "nope.gguf")]) == 1


def test_truncated_gguf_refused(demo_build, tmp_path):
    src = demo_build / "artifacts" / "smollm2-135m" / "smollm2-135m-Q4_K_M.gguf"
    cut = tmp_path / "cut.gguf"
    with open(src, "rb") as fh:
        cut.write_bytes(fh.read(src.stat().st_size // 2))
    with pytest.raises(PipelineError, match="truncated"):
        read_facts(cut)
