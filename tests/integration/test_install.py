"""The install: AutoAWQ imports with the pinned transformers."""

from __future__ import annotations

import subprocess
import sys


def test_autoawq_imports_with_pinned_transformers():
    code = "import transformers, awq; from awq import AutoAWQForCausalLM; print(transformers.__version__)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "4.56.2"


