"""Shared fixtures: the real llama.cpp tools, the demo snapshot, and one demo build per session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO_RECIPE = ROOT / "recipes" / "smollm2-135m.yaml"
FAKE_TOKEN = "hf_FAKEtestTOKENdoNotLeak0123456789abcdef"


@pytest.fixture(scope="session")
def toolchain():
    from pipeline.tools import find_toolchain

    return find_toolchain()


@pytest.fixture(scope="session")
def quantize_exe(toolchain):
    return str(toolchain.tool("llama-quantize"))


@pytest.fixture(scope="session")
def demo_snapshot():
    from pipeline.demo import setup_demo

    return setup_demo()


@pytest.fixture(scope="session")
def demo_hub(demo_snapshot):
    from pipeline.demo import hub_cache_dir

    return hub_cache_dir()


@pytest.fixture(scope="session")
def eval_text():
    from pipeline.demo import eval_text as _eval

    return _eval()


@pytest.fixture(scope="session")
def source_gguf():
    from pipeline.demo import source_gguf as _src

    return _src()


def snakemake(workdir: Path, recipes: list[Path] | Path, cores: int = 2, extra: list[str] | None = None,
              env: dict | None = None, hub: Path | None = None, new_session: bool = False) -> subprocess.CompletedProcess:
    """Run the real workflow (this repo's Snakefile) with its outputs under ``workdir``; ``new_session``: in a
    process group of its own (which the ``:group`` kill of tests/test_faults.py may kill whole)."""
    recipes = recipes if isinstance(recipes, list) else [recipes]
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--cores", str(cores), *(extra or []), "--config", "recipes=" + ",".join(str(r) for r in recipes)]
    full_env = dict(os.environ)
    full_env.update({"HF_HUB_OFFLINE": "1", "HF_TOKEN": FAKE_TOKEN})
    if hub:
        full_env["HF_HUB_CACHE"] = str(hub)
    full_env.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, start_new_session=new_session)


@pytest.fixture(scope="session")
def demo_build(tmp_path_factory, demo_hub):
    """The demo recipe built once by the real Snakemake workflow; shared by the end-to-end tests."""
    work = tmp_path_factory.mktemp("demo-build")
    res = snakemake(work, DEMO_RECIPE, cores=2, hub=demo_hub)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return work


def copy_recipe(src: Path, dest_dir: Path, **changes) -> Path:
    """Write a copy of a recipe with top-level keys replaced (YAML round trip)."""
    import yaml

    data = yaml.safe_load(src.read_text())
    data.update(changes)
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / f"{data['name']}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out



class FailingBuild(NamedTuple):
    work: Path
    recipe: Path
    res: subprocess.CompletedProcess
    draft: Path
    manifest: dict  # as the failing build left it
    published: list[str]  # GGUF files in its artifact folder then
    gate_ok: bool


@pytest.fixture(scope="session")
def failing_build(tmp_path_factory, demo_hub):
    """One real build that must fail: Q8_0 passes, a Q2_K has an impossible gate, and the draft is a
    tiny model with llama.cpp's llama-spm test vocabulary (incompatible with the demo's BPE vocab).
    Shared by test_gates and test_draft; what the build left is snapshotted here, since
    test_gates' re-judging test rebuilds in the same folder afterwards."""
    import yaml
    from gguf_factory import tiny_llama

    from pipeline.tools import find_toolchain

    work = tmp_path_factory.mktemp("gates")
    draft = tiny_llama(work / "tiny-spm.gguf",
                       tokenizer_from=find_toolchain().root / "vocab" / "ggml-vocab-llama-spm.gguf")
    data = yaml.safe_load(DEMO_RECIPE.read_text())
    data.update(name="smollm2-gates", bench=False,
                quants=["Q8_0", {"type": "Q2_K", "gates": {"max_kld_mean": 0.0001}}],
                draft={"gguf": str(draft), "n_max": 4, "prompts": 1})
    data["gates"][0]["text"] = str(ROOT / "data" / "botchan.txt")
    recipe = work / "recipes" / "smollm2-gates.yaml"
    recipe.parent.mkdir()
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    res = snakemake(work, recipe, cores=2, hub=demo_hub)
    folder = work / "artifacts" / "smollm2-gates"
    return FailingBuild(work, recipe, res, draft, json.loads((folder / "manifest.json").read_text()),
                        sorted(p.name for p in folder.glob("*.gguf")),
                        (work / "work" / "smollm2-gates" / "gate.ok").exists())
