"""The error hierarchy (pipeline/errors.py): each subclass is a PipelineError, carries its fields, survives pickling,
and its one line is the line a plain PipelineError gave; the CLI prints it as ``error: <line>``."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from pipeline.errors import ArtifactError, GateFailure, PipelineError, RecipeError, ToolError

KINDS = [
    RecipeError(Path("recipes/a.yaml"), "quants[0].type", "IQ2_XXS needs an importance matrix"),
    RecipeError("r.yaml", None, "not UTF-8 text"),
    ToolError("llama-quantize", 1, "work/q.log", "llama-quantize failed (exit 1): boom [log: work/q.log]"),
    GateFailure([{"check": "max_kld_mean", "message": "a", "file": "m-Q4_0.gguf"}], 2),
    ArtifactError(Path("artifacts/m/m-Q8_0.gguf"), "artifacts/m/m-Q8_0.gguf: missing (not pulled?)"),
]


@pytest.mark.parametrize("exc", KINDS, ids=lambda e: type(e).__name__)
def test_every_kind_is_a_one_line_pipeline_error_that_pickles(exc):
    assert isinstance(exc, PipelineError) and isinstance(exc, Exception)
    assert "\n" not in str(exc)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and str(back) == str(exc) and vars(back) == vars(exc)


def test_recipe_error_fields_and_line():
    e = RecipeError(Path("recipes/a.yaml"), "quants[0].type", "IQ2_XXS needs\nan importance matrix")
    assert (e.path, e.field, e.message) == (Path("recipes/a.yaml"), "quants[0].type", "IQ2_XXS needs an importance matrix")
    assert str(e) == "recipes/a.yaml: quants[0].type: IQ2_XXS needs an importance matrix"
    assert str(RecipeError("./r.yaml", None, "not UTF-8 text")) == "./r.yaml: not UTF-8 text"  # the path as given
    assert str(RecipeError("r.yaml", "", "must be a mapping, got list")) == "r.yaml: : must be a mapping, got list"


def test_tool_error_fields_and_line():
    e = ToolError("llama-imatrix", 134, "work/i.log", "r.yaml: imatrix (F16): llama-imatrix failed: abort")
    assert (e.tool, e.returncode, e.log) == ("llama-imatrix", 134, Path("work/i.log"))
    assert str(e) == "r.yaml: imatrix (F16): llama-imatrix failed: abort"
    assert ToolError("llama-server", None, None, "x").log is None


def test_gate_failure_fields_and_line():
    checks = [{"check": "conformance", "message": "rejected", "file": "m-F16.gguf"},
              {"check": "conformance", "message": "rejected", "file": "m-Q8_0.gguf"},
              {"check": "device", "device": "pi", "message": "device does not fit"}]
    e = GateFailure(checks, 0)
    assert e.checks == tuple(checks) and e.published == 0 and e.messages == ["rejected", "device does not fit"]
    assert str(e) == "rejected; device does not fit (0 quant(s) published)"  # each message once


def test_artifact_error_fields_and_line():
    e = ArtifactError(Path("a/m.gguf"), "a/m.gguf: SHA256 1 does not match the manifest's 2: file altered")
    assert e.path == Path("a/m.gguf") and str(e) == "a/m.gguf: SHA256 1 does not match the manifest's 2: file altered"


def test_cli_prints_a_subclass_as_its_one_line(tmp_path, capsys):
    """``ggufpipe verify`` on a file without a manifest: an ArtifactError, printed as the line it always was."""
    from pipeline.cli import main

    gguf = tmp_path / "m.gguf"
    assert main(["verify", str(gguf)]) == 1
    assert capsys.readouterr().err == f"error: {gguf}: no manifest at {tmp_path / 'manifest.json'}\n"

