"""Shared test helpers (one package, imported by every tier as ``helpers``): repository paths, the real workflow
run as a subprocess, recipe writers, a git + DVC project repository, git repositories for ``ggufpipe ci`` and the
pinned requirements. Generated checkpoints live in :mod:`helpers.hf_factory`, generated GGUFs in
:mod:`helpers.gguf_factory`, the single-node Slurm cluster in :mod:`helpers.slurm_cluster`.

Nothing here imports torch, transformers or llama.cpp at module level: the unit tier imports this package too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
DEMO_RECIPE = ROOT / "recipes" / "smollm2-135m.yaml"
BOTCHAN = ROOT / "data" / "botchan.txt"
CALIB = ROOT / "data" / "botchan-calib.txt"
TEST_DATA = ROOT / "tests" / "data" / "perplexity"  # captured output of the pinned llama-perplexity
FAKE_TOKEN = "hf_FAKEtestTOKENdoNotLeak0123456789abcdef"
# The tiny Llama of make_tiny_llama as a Hub repo in a local hub cache (tests/conftest.py: tiny_hub, tiny_build)
TINY_NAME = "tiny-hub"
TINY_REPO = "ggufpipe-test/tiny-llama"
TINY_COMMIT = "fa17ed0000000000000000000000000000c0ffee"
GATES_NAME = "tiny-gates"  # the tiny model's build that must fail (tests/conftest.py: failing_build)
# Files a project repository needs to run this workflow (besides pipeline/ and its recipes)
LOCK_FILES = ["requirements/converter.lock", "requirements/autoawq.lock"]  # part of convert's and awq's triggers
PROJECT_FILES = ["Snakefile", "dvc.yaml", ".dvcignore", ".dvc/config", "envs/ggufpipe.yaml", "data/botchan.txt",
                 *LOCK_FILES]
PROJECT_DIRS = ["pipeline"]  # the package (its stages declare the Snakefile's rules)


def snakemake(workdir: Path, recipes: list[Path] | Path, cores: int = 2, extra: list[str] | None = None,
              env: dict | None = None, hub: Path | None = None, new_session: bool = False,
              runner: Path | None = None) -> subprocess.CompletedProcess:
    """Run the real workflow (this repo's Snakefile) with its outputs under ``workdir``; ``new_session``: in a
    process group of its own (which the ``:group`` kill of tests/e2e/test_faults.py may kill whole); ``runner``: a
    script that starts Snakemake in place of ``python -m snakemake``."""
    recipes = recipes if isinstance(recipes, list) else [recipes]
    cmd = [sys.executable, *([str(runner)] if runner else ["-m", "snakemake"]), "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--cores", str(cores), *(extra or []), "--config", "recipes=" + ",".join(str(r) for r in recipes)]
    full_env = dict(os.environ)
    full_env.update({"HF_HUB_OFFLINE": "1", "HF_TOKEN": FAKE_TOKEN})
    if hub:
        full_env["HF_HUB_CACHE"] = str(hub)
    full_env.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, start_new_session=new_session)


# The demo recipe as the session's shared build (conftest.demo_build) runs it: the same model, quants, gates and
# pair, on fewer eval chunks and acceptance prompts. The full recipe is what `make demo-full` and the committed
# artifacts build; the suite proves the stages, not the recipe's sample sizes.
DEMO_TEST_CHUNKS = 9  # the fewest the recipe check allows at ctx 512 (2,048 scored tokens)
DEMO_TEST_PROMPTS = 1


def demo_recipe_data() -> dict:
    """The demo recipe's mapping with every gate text made absolute (they are relative to recipes/)."""
    data = yaml.safe_load(DEMO_RECIPE.read_text())
    for gate in data["gates"]:
        gate["text"] = str((DEMO_RECIPE.parent / gate["text"]).resolve())
    return data


def demo_recipe_at_test_size(folder: Path) -> Path:
    """Write the test-sized demo recipe into ``folder`` (same file name; its text path made absolute)."""
    data = demo_recipe_data()
    gate = data["gates"][0]
    assert gate["text"] == str(BOTCHAN) and gate["chunks"] > DEMO_TEST_CHUNKS, gate
    gate.update(chunks=DEMO_TEST_CHUNKS)
    # the prose gate only: the other axes (chat, Chinese, code, long context) run in tests/integration/test_eval_axes.py
    # on the registry model and a generated LongRoPE one; the committed demo manifest carries the demo's own
    assert [g["name"] for g in data["gates"]] == ["botchan", "chat", "chinese", "code", "long"], data["gates"]
    del data["gates"][1:]
    # no KV-type runs at test size: each doubles an eval of the real model (tests/e2e/test_e2e.py measures them on
    # the tiny build; the committed demo manifest carries the demo's own, tests/unit/test_kv_types.py)
    assert gate.pop("kv_types"), gate
    for d in data["devices"]:
        if d.get("kv_type") == "auto":
            d["kv_type"] = "q8_0"
    assert data["draft"]["prompts"] > DEMO_TEST_PROMPTS, data["draft"]
    data["draft"]["prompts"] = DEMO_TEST_PROMPTS
    # no speed-up rounds: a clock shared with the other test worker measures nothing (the controls of
    # tests/e2e/test_speedup.py measure the stage; the committed demo artifacts carry the demo's own)
    data["draft"]["speedup"] = False
    path = folder / DEMO_RECIPE.name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def awq_recipe(folder: Path, source: Path, awq: str, quants: str = "[Q8_0]") -> Path:
    p = folder / "awq.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: tiny-awq
        source: {{path: {source}}}
        awq: {awq}
        quants: {quants}
        bench: false
        conformance: false
        """))
    return p


class Repo:
    def __init__(self, path: Path, env: dict):
        self.path, self.env = path, env

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        res = subprocess.run(list(cmd), cwd=self.path, env=self.env, capture_output=True, text=True)
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        return res

    def git(self, *args: str) -> str:
        return self.run("git", *args).stdout

    def dvc(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run(sys.executable, "-m", "dvc", *args, check=check)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run(sys.executable, "-m", "pipeline.cli", *args, check=check)

    def commit(self, msg: str, tag: str | None = None) -> None:
        self.git("add", "-A")
        self.git("commit", "-qm", msg)
        if tag:
            self.git("tag", tag)

    def lock_stages(self) -> set[str]:
        import yaml

        return set((yaml.safe_load((self.path / "dvc.lock").read_text()) or {}).get("stages", {}))

    def manifest(self, name: str) -> dict:
        return json.loads((self.path / "artifacts" / name / "manifest.json").read_text())


def project_repo(path: Path, env: dict) -> Repo:
    """A git + DVC repository holding this project's workflow files (no recipes yet)."""
    repo = Repo(path, env)
    path.mkdir()
    for f in PROJECT_FILES:
        (path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / f, path / f)
    for d in PROJECT_DIRS:
        shutil.copytree(ROOT / d, path / d, ignore=shutil.ignore_patterns("__pycache__"))
    (path / ".gitignore").write_text("work/\n.snakemake/\nartifacts/**/*.gguf\nartifacts/**/*.logits\n__pycache__/\n")
    repo.git("init", "-q", "-b", "main")
    repo.dvc("init", "-q", "-f")
    shutil.copyfile(ROOT / ".dvc" / "config", path / ".dvc" / "config")  # cache.type hardlink,copy
    return repo


# ------------------------------------------------------------------ git repositories for `ggufpipe ci`

DEMO_SOURCE = {"repo": "HuggingFaceTB/SmolLM2-135M-Instruct", "revision": "6b5982a638c6ed4e3da15711b6a5a1328c34a53e"}
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def git(repo: Path, *args: str) -> str:
    res = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env={**os.environ, **GIT_ENV})
    assert res.returncode == 0, res.stderr
    return res.stdout


def commit_all(repo: Path, msg: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", msg)


def ci_recipe(name: str, text: str = "../data/botchan.txt", **changes) -> dict:
    """A small recipe on the demo model: one Q8_0, one eval set of 9 x 512 (2295 scored tokens)."""
    data = {"name": name, "source": dict(DEMO_SOURCE), "quants": ["Q8_0"],
            "gates": [{"name": "botchan", "text": text, "ctx": 512, "chunks": 9}], "bench": False,
            "conformance": False}
    data.update(changes)
    return data


def write_yaml(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False) if isinstance(data, dict) else data)
    return path


def new_repo(tmp_path: Path, recipes: dict[str, dict], data: dict[str, str] | None = None) -> Path:
    """A git repo (branch main, one commit) with recipes/, data/ (Botchan unless given) and a README."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    if data is None:
        (repo / "data").mkdir()
        shutil.copyfile(BOTCHAN, repo / "data" / "botchan.txt")
    for rel, text in (data or {}).items():
        write_yaml(repo / rel, text)
    for name, r in recipes.items():
        write_yaml(repo / "recipes" / f"{name}.yaml", r)
    write_yaml(repo / "README.md", "recipes\n")
    commit_all(repo, "base")
    return repo


def run_ci(repo: Path, *args: str, hub: Path | None = None) -> subprocess.CompletedProcess:
    """`ggufpipe ci` as a user runs it: in the checkout's folder (this repo's code and Snakefile)."""
    env = {**os.environ, **GIT_ENV, "HF_HUB_OFFLINE": "1", "HF_TOKEN": FAKE_TOKEN,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    if hub:
        env["HF_HUB_CACHE"] = str(hub)
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "ci", *args], cwd=repo, capture_output=True,
                          text=True, env=env)


# ------------------------------------------------------------------ a recipe with a publish section (pipeline/distribution/hub.py)

HUB_NAME = "tiny-chat"
HUB_REPO = "ggufpipe-test/tiny-chat-GGUF"
HUB_SOURCE_COMMIT = "0123456789abcdef0123456789abcdef01234567"
HUB_KEYS = ["Q8_0", "Q4_K_M"]


def hub_recipe_data(**publish) -> dict:
    return {"name": HUB_NAME, "description": "tiny random model with the SmolLM2 tokenizer",
            "license": "apache-2.0", "source": {"repo": "org/tiny-chat", "revision": HUB_SOURCE_COMMIT},
            "outtype": "f16", "quants": HUB_KEYS, "bench": False, "conformance": False,
            "publish": {"hf_repo": HUB_REPO, **publish}}


def write_hub_recipe(root: Path, data: dict) -> Path:
    path = root / "recipes" / f"{HUB_NAME}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a hard link in a clone: never write through it
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ------------------------------------------------------------------ a recipe of a local model folder (split files)

SPLIT_NAME = "tiny-split"


def write_split_recipe(folder: Path, hf: Path, body: str, name: str = SPLIT_NAME) -> Path:
    """A recipe of the model folder ``hf`` (tests of `split:`), no bench."""
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"{name}.yaml"
    p.write_text(f"name: {name}\nsource: {{path: {hf}}}\nbench: false\nconformance: false\n" + textwrap.dedent(body))
    return p


# ------------------------------------------------------------------ pinned requirements

def norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def read_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[norm(name)] = version
    return pins


# ------------------------------------------------------------------ a recipe with `mtp:`

def mtp_recipe(folder: Path, src: Path, mtp: str | None, name: str = "glm", **extra) -> Path:
    """A one-quant recipe (Q8_0, no bench) of the local model folder ``src`` with ``mtp:`` set unless None."""
    data = {"name": name, "source": {"path": str(src)}, "quants": ["Q8_0"], "bench": False, "conformance": False,
            **extra}
    if mtp is not None:
        data["mtp"] = mtp
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ------------------------------------------------------------------ recipe schema tests (unit and integration)

# A valid recipe with every kind of quant entry (a plain type, a mapping with options, an alias)
RECIPE_SHA = "6b5982a638c6ed4e3da15711b6a5a1328c34a53e"
GOOD_RECIPE = f"""
name: demo-a
source:
  repo: org/model
  revision: "{RECIPE_SHA}"
outtype: f16
quants:
  - Q8_0
  - type: Q4_K_M
    variant: embq
    output_tensor_type: q8_0
    token_embedding_type: Q8_0
    tensor_types: ["attn_v=q8_0"]
  - Q4_K
"""


def write_recipe_text(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def recipe_error(path: Path):
    """The ``RecipeError`` loading the recipe ``path`` must raise: its fields name the file, the field and what is
    wrong, and its one line is ``<path>: <field>: <what>`` (fails the test otherwise)."""
    from pipeline.errors import RecipeError
    from pipeline.recipe import load_recipe

    try:
        load_recipe(path)
    except RecipeError as exc:
        msg = str(exc)
        assert "\n" not in msg and exc.path == path and msg == f"{path}: {exc.field}: {exc.message}", msg
        return exc
    raise AssertionError(f"{path}: the recipe loaded; an error was expected")


# ------------------------------------------------------------------ DVC builds of the tiny model

DVC_NAME = "tiny"
# DVC tests (tests/e2e/test_dvc.py, test_rename.py): the tiny random model (tests/conftest.py: tiny_hub): the eval set's thresholds are ones any quant of it passes
# (and a per-quant override says the same); the impossible gate below is what must fail
LOOSE = "{max_kld_mean: 100, max_kld_p99: 100, max_ppl_ratio: 100, min_same_top_p: 0}"


def dvc_recipe(quants: str, license: str = "apache-2.0") -> str:
    return textwrap.dedent(f"""\
        name: {DVC_NAME}
        license: {license}
        source: {{repo: {TINY_REPO}, revision: "{TINY_COMMIT}"}}
        quants: {quants}
        gates: [{{name: botchan, text: ../data/botchan.txt, ctx: 256, chunks: 17, max_kld_mean: 100, max_kld_p99: 100,
                  max_ppl_ratio: 100, min_same_top_p: 0}}]
        bench: false
        conformance: false
        """)


def dvc_jobs_run(res: subprocess.CompletedProcess) -> list[str]:
    """The Snakemake jobs a `dvc repro` ran (rule names from Snakemake's own log lines)."""
    out = res.stdout + res.stderr
    return sorted(line.split("rule ", 1)[1].rstrip(":") for line in out.splitlines()
                  if line.startswith(("rule ", "localrule ")) and line.rstrip().endswith(":"))
