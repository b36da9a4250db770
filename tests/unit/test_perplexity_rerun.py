"""The bounded re-run of llama-perplexity and llama-speculative-simple when b11312 loses their last output lines at
exit or tears one, on captured real output (tests/data/perplexity, tests/data/speculative) fed to the evaluation code
in place of a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ROOT, TEST_DATA

from pipeline.errors import PipelineError, ToolError


def _runner(outputs_: list[tuple[int, str]], calls: list):
    from pipeline.tools import ToolResult

    def run_tool(tc, name, args, log, check=True, cwd=None):
        calls.append(name)
        rc, out = outputs_[min(len(calls), len(outputs_)) - 1]
        return ToolResult(rc, out, 0.1)
    return run_tool


KLD = (TEST_DATA / "kld-q4_k_m.txt").read_text()


KLD_CUT = KLD[:KLD.index("Median  KLD")]  # lost from the middle of the statistics
# A real capture (tiny model, 2 chunks, two test workers on 2 cores): exit flushed stdout while the logger thread
# wrote the RMS line, which holds part of itself, a torn "±" (U+FFFD once decoded) and then itself whole.
TORN = (TEST_DATA / "torn-line-kld.txt").read_text()


def _base_record(tmp_path: Path) -> tuple[Path, Path]:
    rec = tmp_path / "base.json"
    rec.write_text(json.dumps({"text": "botchan.txt", "text_sha256": "0" * 64, "scored_tokens": 4080}))
    logits = tmp_path / "base.logits"
    logits.write_bytes(b"x")
    return rec, logits


@pytest.mark.parametrize("runs,calls_expected,error,tool_rc", [
    ([(0, KLD_CUT), (0, KLD)], 2, None, None),  # lost once: re-run, logged
    ([(0, KLD_CUT), (0, KLD_CUT), (0, KLD)], 3, None, None),
    ([(0, KLD_CUT)], 7, "printed no KL divergence statistics|lacks", None),  # bounded: 1 + 6 re-runs, then the error
    ([(0, TORN), (0, KLD)], 2, None, None),  # a torn line: re-run, logged
    ([(1, KLD_CUT)], 1, "exited 1", 1),  # not the symptom: no re-run
    ([(0, KLD_CUT + "0.99.000.000 E kl_divergence: failed reading log-probs\n")], 1, "failed reading log-probs", 0),
    ([(0, KLD.replace("Maximum KLD", "Max KLD"))], 1, "lacks kld_max", None),  # complete but changed: no re-run
])
def test_eval_reruns_only_when_the_final_lines_are_lost(tmp_path, monkeypatch, runs, calls_expected, error, tool_rc):
    from pipeline.recipe import EvalSet
    from pipeline.stages.evaluate import eval_quant

    calls: list = []
    monkeypatch.setattr("pipeline.tools.run_tool", _runner(runs, calls))
    monkeypatch.setattr("pipeline.tools_rerun.LOST_LINES_PAUSE", 0.0)
    rec, logits = _base_record(tmp_path)
    es = EvalSet(name="botchan", text=ROOT / "data" / "botchan.txt", ctx=512, chunks=16)
    log = tmp_path / "eval.log"
    if error:
        with pytest.raises(PipelineError, match=error) as exc:
            eval_quant("r", "Q4_K_M", es, tmp_path / "q.gguf", logits, rec, tmp_path / "out.json", log=log, tc=object())
        # a failed run is a ToolError (its exit status), an output the parser cannot read a plain PipelineError
        assert isinstance(exc.value, ToolError) == (tool_rc is not None), repr(exc.value)
        if tool_rc is not None:
            assert (exc.value.tool, exc.value.returncode) == ("llama-perplexity", tool_rc)
    else:
        out = eval_quant("r", "Q4_K_M", es, tmp_path / "q.gguf", logits, rec, tmp_path / "out.json", log=log, tc=object())
        assert out["metrics"]["kld_mean"] == 0.045521
    assert len(calls) == calls_expected
    notes = log.read_text().count("lost its final lines") if log.exists() else 0
    assert notes == min(calls_expected - 1, 6)


def test_base_eval_reruns_on_a_real_lost_tail(tmp_path, monkeypatch, capsys):
    """A real capture: llama-perplexity b11312 exited 0 after printing chunk 13 of 17 (tiny model, 2 cores)."""
    from pipeline.stages.evaluate import has_final_estimate, run_perplexity

    lost = (TEST_DATA / "lost-tail-base.txt").read_text()
    assert "Final estimate" not in lost and "calculating perplexity over 17 chunks" in lost
    calls: list = []
    monkeypatch.setattr("pipeline.tools.run_tool", _runner([(0, lost), (0, (TEST_DATA / "base.txt").read_text())], calls))
    res = run_perplexity(object(), [], tmp_path / "base.log", has_final_estimate, "r: eval set botchan: base")
    assert has_final_estimate(res.output) and calls == ["llama-perplexity"] * 2
    assert "warning: r: eval set botchan: base: llama-perplexity exited 0 but its output lost its final lines" \
        in capsys.readouterr().err


def test_a_torn_line_is_incomplete_and_a_renamed_label_is_not():
    from pipeline.stages.evaluate import has_kld_statistics, parse_kld_statistics

    torn = [line for line in TORN.splitlines() if line.startswith("RMS")]
    assert len(torn) == 1 and "\ufffd" in torn[0] and torn[0].count("RMS Δp") == 2
    assert "Same top p" in TORN and not has_kld_statistics(TORN)
    with pytest.raises(PipelineError, match=r"lacks rms_dp \(format changed\?\)$"):
        parse_kld_statistics(TORN)
    assert has_kld_statistics(KLD)
    assert has_kld_statistics(KLD.replace("Maximum KLD", "Max KLD"))  # a format change: re-running cannot help
    assert not has_kld_statistics(KLD_CUT)


SPEC = (TEST_DATA.parent / "speculative" / "spec-simple-minicpm.txt").read_text()
# The CI run of 2026-12-04 17:07 (2 cores, two test workers): llama-speculative-simple on this very pair exited 0
# with its output ending at this piece of the generated text; the counts and the decode line never came.
SPEC_LOST = SPEC[:SPEC.index("selbst행") + len("selbst행")]


@pytest.mark.parametrize("runs,calls_expected,error", [
    ([(0, SPEC_LOST), (0, SPEC)], 2, None),  # lost once: re-run, logged
    ([(0, SPEC_LOST)], 7, "printed no n_drafted"),  # bounded: 1 + 6 re-runs, then the parser's error
    ([(1, SPEC_LOST + "0.00.300.000 E main: failed to process speculative batch\n")], 1, None),  # a failure: no re-run
])
def test_speculative_counts_lost_at_exit_are_measured_again(tmp_path, monkeypatch, runs, calls_expected, error):
    from pipeline.stages.draft import parse_speculative, spec_complete
    from pipeline.tools_rerun import run_complete

    calls: list = []
    monkeypatch.setattr("pipeline.tools.run_tool", _runner(runs, calls))
    monkeypatch.setattr("pipeline.tools_rerun.LOST_LINES_PAUSE", 0.0)
    assert spec_complete(SPEC) and not spec_complete(SPEC_LOST)
    log = tmp_path / "spec.log"
    res = run_complete(object(), "llama-speculative-simple", [], log, None, spec_complete, "acceptance of m + d")
    assert len(calls) == calls_expected
    assert (log.read_text().count("lost its final lines") if log.exists() else 0) == min(calls_expected - 1, 6)
    if res.returncode:
        return
    if error:
        with pytest.raises(PipelineError, match=error):
            parse_speculative(res.output)
    else:
        assert parse_speculative(res.output) == {"n_drafted": 38, "n_accept": 27, "n_predict": 37,
                                                 "decode_seconds": pytest.approx(0.3, abs=0.1)}
