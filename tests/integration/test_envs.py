"""The installed environments (pipeline/envs.py) against what they stand for: the converter's pins as the pinned tree
states them, AutoAWQ's stack (it imports there, and only there)."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile

from pipeline.envs import CONVERTER_PINS, converter_deviations, env_environ, env_python, env_versions
from pipeline.provenance import WEIGHT_PACKAGES, python_versions
from pipeline.tools import SDIST_FILE, SDIST_NAME, SDIST_SHA256, SDIST_VERSION, cache_root, pip_fetch

REQUIREMENTS = ("requirements/requirements-convert_hf_to_gguf.txt", "requirements/requirements-convert_legacy_llama.txt")


def tree_pins() -> dict[str, str]:
    """The converter's requirement lines in the pinned tree (the sdist `make tools` unpacked): {package: specifier}."""
    sdist = pip_fetch(SDIST_NAME, SDIST_VERSION, SDIST_FILE, SDIST_SHA256, cache_root() / "downloads", sdist=True)
    out = {}
    with tarfile.open(sdist) as tar:
        for member in tar:
            if member.name.endswith(REQUIREMENTS) and "vendor/llama.cpp/" in member.name:
                for line in tar.extractfile(member).read().decode().splitlines():
                    m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*([=~<>!].*)", line.strip())
                    if m:
                        out[m.group(1).lower()] = m.group(2).replace(" ", "")
    return out


def test_converter_pins_are_the_trees():
    pins = tree_pins()
    assert pins.pop("gguf") == ">=0.1.0"  # the tree's own gguf-py, put on the path (pipeline/tools.py)
    assert pins == CONVERTER_PINS


def test_installed_environments():
    conv = env_versions("converter", WEIGHT_PACKAGES)
    assert converter_deviations(conv) == {"torch": {"required": "==2.11.0", "installed": "2.13.0+cpu"}}, conv
    assert "gguf" not in conv and "autoawq" not in conv  # the tree's gguf-py; no AutoAWQ
    awq = env_versions("autoawq", WEIGHT_PACKAGES)
    assert (awq["autoawq"], awq["transformers"], awq["torch"]) == ("0.2.9", "4.56.2", "2.13.0+cpu"), awq
    build = python_versions()
    assert "autoawq" not in build and build["torch"] == awq["torch"], build
    assert python_versions(("torch",), env="converter") == {"torch": "2.13.0+cpu"}


def test_autoawq_imports_in_its_environment_only():
    """AutoAWQ imports (with the stage's fix-ups) on transformers 4.56.2 in its environment, and not in the build
    environment; the engine choice's list of its model types (read without that environment) is the one AutoAWQ 0.2.9
    installs. One start of the environment: its imports take seconds."""
    import json

    from pipeline.stages.awq import AUTOAWQ_MODEL_TYPES

    code = ("import json, transformers; from pipeline.stages.awq import import_awq; "
            "print(json.dumps([transformers.__version__, sorted(import_awq()[1])]))")
    res = subprocess.run([str(env_python("autoawq")), "-c", code], capture_output=True, text=True,
                         env=env_environ("autoawq"))
    assert res.returncode == 0, res.stderr[-2000:]
    version, model_types = json.loads(res.stdout.splitlines()[-1])
    assert version == "4.56.2" and set(model_types) == AUTOAWQ_MODEL_TYPES
    res = subprocess.run([sys.executable, "-c", "import awq"], capture_output=True, text=True)
    assert res.returncode == 1 and "No module named 'awq'" in res.stderr, res.stderr[-2000:]
