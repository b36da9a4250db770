"""Shared fixtures (the real llama.cpp tools, the demo snapshot, one demo build per session) and the test tiers.

Every test lives in one tier folder, which also marks it (``-m unit`` ...) and orders the run: tests/unit (no
compiled tools, no torch/transformers, no network: tests/unit/conftest.py enforces it), then tests/integration
(real llama.cpp tools on generated or demo inputs), then tests/e2e (whole builds, DVC, Slurm). Shared helpers live
in tests/helpers (``from helpers import ...``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest
from helpers import BOTCHAN, GATES_NAME, TINY_COMMIT, TINY_NAME, TINY_REPO, demo_recipe_at_test_size, snakemake

# make test's two workers: which tests share one, and the order they go out in (tests/helpers/workers.py)
pytest_plugins = ["helpers.workers"]

TIERS = ("unit", "integration", "e2e")
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Mark each test with its tier and run the tiers in order (unit first, before anything imports torch)."""
    def tier(item) -> str:
        parts = Path(str(item.path)).resolve().relative_to(TESTS).parts
        if len(parts) < 2 or parts[0] not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: every test lives in one of tests/{{{','.join(TIERS)}}}/")
        return parts[0]

    for item in items:
        item.add_marker(tier(item))
    items.sort(key=lambda item: TIERS.index(tier(item)))  # stable: file and definition order within a tier


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


@pytest.fixture(scope="session")
def demo_recipe(tmp_path_factory):
    """The demo recipe at test size (helpers.demo_recipe_at_test_size): the one demo_build builds."""
    return demo_recipe_at_test_size(tmp_path_factory.mktemp("demo-recipe"))


@pytest.fixture(scope="session")
def demo_build(tmp_path_factory, demo_hub, demo_recipe):
    """The demo recipe (at test size) built once by the real Snakemake workflow; shared by the end-to-end tests."""
    work = tmp_path_factory.mktemp("demo-build")
    res = snakemake(work, demo_recipe, cores=2, hub=demo_hub)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return work


@pytest.fixture(scope="session")
def tiny_hub(tmp_path_factory):
    """The tiny Llama (make_tiny_llama) in a local hub cache under a pinned commit, and a recipe fetching it
    from there: (hub cache, recipe). Two quants, gates it passes (a random model: the point is that every
    stage runs), no bench."""
    from helpers.hf_factory import make_tiny_llama

    from pipeline.demo import place_in_hub_cache

    base = tmp_path_factory.mktemp("tiny-hub")
    hub = base / "hub"
    place_in_hub_cache(make_tiny_llama(base / "hf"), hub, TINY_REPO, TINY_COMMIT)
    recipe = base / "recipes" / f"{TINY_NAME}.yaml"
    recipe.parent.mkdir()
    recipe.write_text(f"""\
name: {TINY_NAME}
source: {{repo: {TINY_REPO}, revision: "{TINY_COMMIT}"}}
bench: false
conformance: false  # a random model: the conformance tests check it apart
quants: [Q8_0, Q4_0]
gates:
  - {{name: botchan, text: {BOTCHAN}, ctx: 256, chunks: 17, max_ppl_ratio: 100,
     max_kld_mean: 100, max_kld_p99: 100, min_same_top_p: 0, kv_types: [f16, q8_0, q4_0]}}
""")
    return hub, recipe


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory, tiny_hub):
    """The tiny recipe built once by the real Snakemake workflow (the reference of the fault, rebuild-check and
    Slurm tests: none of them changes it)."""
    hub, recipe = tiny_hub
    folder = tmp_path_factory.mktemp("tiny-build")
    res = snakemake(folder, recipe, hub=hub)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return folder


class FailingBuild(NamedTuple):
    work: Path
    recipe: Path
    res: subprocess.CompletedProcess
    draft: Path
    manifest: dict  # as the failing build left it
    published: list[str]  # GGUF files in its artifact folder then
    gate_ok: bool


@pytest.fixture(scope="session")
def failing_build(tmp_path_factory, tiny_hub):
    """One real build that must fail, of the tiny model (tiny_hub: what it proves needs no trained weights): Q8_0
    passes, a Q2_K has an impossible gate, and the draft is a tiny model with llama.cpp's GPT-2 test vocabulary
    (BPE: incompatible with the tiny model's SentencePiece vocab). Shared by test_gates and test_draft; what the
    build left is snapshotted here, since test_gates' re-judging test rebuilds in the same folder afterwards."""
    import yaml
    from helpers.gguf_factory import tiny_llama

    from pipeline.tools import find_toolchain

    hub, tiny_recipe = tiny_hub
    work = tmp_path_factory.mktemp("gates")
    draft = tiny_llama(work / "tiny-bpe.gguf", tokenizer_from=find_toolchain().root / "vocab" / "ggml-vocab-gpt-2.gguf")
    data = yaml.safe_load(tiny_recipe.read_text())
    data.update(name=GATES_NAME, quants=["Q8_0", {"type": "Q2_K", "gates": {"max_kld_mean": 0.0001}}],
                draft={"gguf": str(draft), "n_max": 4, "prompts": 1})
    recipe = work / "recipes" / f"{GATES_NAME}.yaml"
    recipe.parent.mkdir()
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    res = snakemake(work, recipe, cores=2, hub=hub)
    folder = work / "artifacts" / GATES_NAME
    return FailingBuild(work, recipe, res, draft, json.loads((folder / "manifest.json").read_text()),
                        sorted(p.name for p in folder.glob("*.gguf")),
                        (work / "work" / GATES_NAME / "gate.ok").exists())
