"""The stage records (pipeline/records.py, issue #28): each kind written as the stages write it, field for field in
the order of the dict the stage wrote before the dataclasses (so the files stay byte for byte what they were), read
back equal; absent and unknown keys; the error lines of a missing or damaged record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import records as R
from pipeline.errors import PipelineError

TC = {"build_number": 11312, "commit": "abc1234", "origin": "release", "backend": "cpu"}
PY = {"python": "3.11.7", "gguf": "0.17.1"}

# (record class, the dict a stage wrote before the records existed: keys in the order it wrote them). Values are
# shaped like the demo build's records; non-ASCII text checks ensure_ascii=False.
CASES = [
    (R.FetchRecord, {"source": {"repo": "HuggingFaceTB/SmolLM2-135M", "revision": "main", "commit": "93efa2f0"},
                     "files": {"config.json": {"sha256": "a" * 64, "size": 861}}}),
    (R.FetchRecord, {"source": {"path": "/models/ローカル"}, "files": {}}),
    (R.ConvertRecord, {"outtype": "f16", "tool": "convert_hf_to_gguf.py", "toolchain": TC, "python": PY,
                       "gguf_metadata": {"general.name": "SmolLM2 135M"}, "seconds": 3.2}),
    (R.ConvertRecord, {"outtype": "f16", "tool": "convert_hf_to_gguf.py", "toolchain": TC, "python": PY,
                       "gguf_metadata": {}, "seconds": 3.2, "mtp": {"mode": "strip", "converter_args": ["--no-mtp"]},
                       "vocab_overrides": {"chat_template": "{{ x }}", "eos_token_id": 2}}),
    (R.MtpConvertRecord, {"outtype": "f16", "tool": "convert_hf_to_gguf.py", "converter_args": ["--mtp"],
                          "toolchain": TC, "python": PY, "gguf_metadata": {}, "mtp": {"tensors": 4, "layers": [2]},
                          "seconds": 1.0}),
    (R.AwqRecord, {"params": {"w_bit": 4, "q_group_size": 128}, "calibration_sha256": "b" * 64, "device": "cpu",
                   "threads": 2, "torch": "2.5.1", "autoawq": "0.2.7", "transformers": "4.46.0",
                   "copied_from_source": ["tokenizer.json"], "seconds": 41.0}),
    (R.AwqRecord, {"params": {}, "calibration_sha256": "b" * 64, "device": "cuda", "threads": None, "torch": "2.5.1",
                   "autoawq": None, "transformers": None, "copied_from_source": [], "seconds": 4.0}),
    (R.ImatrixRecord, {"base": "plain", "params": {"calibration": "botchan.txt", "chunks": 4}, "calibration_sha256":
                       "c" * 64, "calibration_tokens": 9000, "sha256": "d" * 64,
                       "facts": {"entries": 210, "chunk_count": 4}, "tool": "llama-imatrix", "toolchain": TC,
                       "threads": 2, "seconds": 12.5}),
    (R.QuantRecord, {"quant": {"type": "Q4_K_M"}, "base": "plain", "tool": "llama-quantize", "toolchain": TC,
                     "seconds": 2.0, "tensor_types": {"histogram": {"q4_K": 120}, "differs": [], "bytes": {}}}),
    (R.QuantRecord, {"quant": {"type": "Q4_K_M"}, "base": "awq", "tool": "llama-quantize", "toolchain": TC,
                     "seconds": 2.0, "tensor_types": {}, "tensor_types_file": {"file": "m.txt", "sha256": "e" * 64},
                     "imatrix_sha256": "f" * 64, "mix": {"solver": "greedy", "map_sha256": "e" * 64}}),
    (R.EvalBaseRecord, {"eval_set": "botchan", "text": "botchan.txt", "text_sha256": "1" * 64, "text_tokens": 70000,
                        "ctx": 512, "chunks": 8, "scored_tokens": 2040, "threads": 2, "ppl": 17.25,
                        "ppl_stderr": 0.5, "seconds": 9.1}),
    (R.EvalRecord, {"eval_set": "botchan", "text": "botchan.txt", "text_sha256": "1" * 64, "ctx": 512, "chunks": 8,
                    "scored_tokens": 2040, "threads": 2, "metrics": {"ppl_q": 17.9, "same_top_p": 91.2},
                    "chunk_rows": [{"kld_mean": 0.01, "same_top_p": 92.0, "ppl_q": 18.0}], "seconds": 7.0}),
    (R.BenchRecord, {"pp_tokens_per_s": 812.3, "pp_tokens": 256, "tg_tokens_per_s": 95.1, "tg_tokens": 64,
                     "threads": 2, "machine": "x86_64", "label": "build-box figures (CPU, this machine), not device speed"}),
    (R.DeviceSliceRecord, {"eval_set": "botchan", "text": "botchan.txt", "text_sha256": "1" * 64, "ctx": 512,
                           "chunks": 2, "scored_tokens": 510, "n_vocab": 49152, "file": "device-slice.logits",
                           "sha256": "2" * 64, "size_bytes": 1 << 20, "threads": 2,
                           "base_metrics": {"kld_mean": 0.0, "same_top_p": 100.0, "ppl_q": 17.0}, "seconds": 2.2}),
    (R.ConformanceRecord, {"recipe": "demo", "passed": True, "skipped": "the recipe opts out (conformance: false)",
                           "failures": [], "warnings": [], "checks": {}}),
    (R.ConformanceRecord, {"recipe": "demo", "passed": False, "failures": ["tokenizer differs"], "warnings": [],
                           "checks": {"tokenizer": {"passed": False}}, "thresholds": {"kld": 0.01}, "chunks": 2,
                           "threads": None, "gguf": "demo-F16.gguf", "vocab": {"type": "gpt2", "n_tokens": 49152},
                           "helper_requests": 12, "toolchain": TC, "python": PY, "details": {"tokenizer": {}},
                           "seconds": {"tokenizer": 0.5, "total": 3.0}}),
    (R.VocabRecord, {"compatible": True, "rule": None, "reason": None, "diff": [], "warnings": [],
                     "main": {"n_tokens": 49152}, "draft": {"n_tokens": 49152}, "main_file": "a.gguf",
                     "draft_file": "b.gguf"}),
    (R.VocabRecord, {"compatible": False, "rule": "token_text", "reason": "2 token texts differ",
                     "diff": [{"id": 5, "main": "«", "draft": "»"}], "warnings": [], "main": {}, "draft": {},
                     "main_file": "a.gguf", "draft_file": "b.gguf", "message": "draft b.gguf is incompatible"}),
    (R.AcceptanceRecord, {"eval_text": "t.txt", "text_sha256": "3" * 64, "prompts": 2, "n_predict": 64, "threads": 2,
                          "spec_type": "draft-simple", "skipped": "vocabularies are incompatible"}),
    (R.AcceptanceRecord, {"eval_text": "t.txt", "text_sha256": "3" * 64, "prompts": 2, "n_predict": 64, "threads": 2,
                          "spec_type": "draft-mtp", "by_n_max": {"4": {"drafted": 10, "accepted": 7}},
                          "best_n_max": 4, "acceptance_rate": 0.7, "drafted": 10, "accepted": 7,
                          "draft_cost_ratio": 0.25, "command": "llama-speculative-simple -m a.gguf",
                          "served": {"ok": True}, "label": "greedy", "build_box_decode_tokens_per_s": {"4": 80.5}}),
    (R.AgreementRecord, {"eval_set": "botchan", "skipped": "vocab sizes differ (1 vs 2): no common logits"}),
    (R.AgreementRecord, {"eval_set": "botchan", "text_sha256": "1" * 64, "scored_tokens": 2040,
                         "top1_agreement": 71.5, "kld_mean": 0.9, "ppl_ratio": 1.4}),
    (R.SensitivityRecord, {"flavour": "plain", "search": "screened", "groups": 12, "candidates": 3, "n_layers": 30,
                           "measurements": 37, "exhaustive_runs": 33, "runs": 7, "reused": 5, "skipped": 2,
                           "duplicates": 2, "screens": 4, "imatrix_passes": 1, "quantize_seconds": 10.5,
                           "eval_seconds": 40.2, "screen_seconds": 3.5, "cpu_seconds": 90.1, "seconds": 55.0, "sensitivity_sha256": "4" * 64}),
    (R.MixLayoutRecord, {"solver": "greedy", "label": "MIX", "type": "Q4_K_M", "flavour": "plain",
                         "budget": {"bpw": 4.5}, "bytes": 90_000_000, "candidates": ["Q4_K", "Q6_K"], "floor": "Q4_K",
                         "grouping": {"bands": [[0, 29]], "roles": ["attn"], "groups": 12},
                         "sensitivity": {"sha256": "4" * 64}, "choice": {"attn.0": "Q6_K"},
                         "predicted": {"bytes": 89_000_000, "bpw": 4.49, "kld_mean": 0.02},
                         "histogram": {"q4_K": 100}, "map_sha256": "5" * 64}),
    (R.MixLayoutRecord, {"solver": "greedy", "label": "MIX", "type": "Q4_K_M", "flavour": "plain",
                         "target": {"kld_mean": 0.05}, "aim": 0.045, "candidates": ["Q4_K"], "floor": "Q4_K",
                         "grouping": {}, "sensitivity": {}, "choice": {}, "predicted": {}, "histogram": {},
                         "map_sha256": "5" * 64}),
]


def _old_bytes(data: dict) -> str:
    """What the stages wrote before: fsutil.write_json_atomic of the dict."""
    return json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


@pytest.mark.parametrize(("cls", "data"), CASES, ids=[f"{c.KIND}-{i}" for i, (c, _) in enumerate(CASES)])
def test_round_trip_byte_identical(tmp_path: Path, cls, data: dict):
    rec = cls(**data)  # the stages build records by keyword, as here
    path = tmp_path / "rec.json"
    rec.write(path)
    assert path.read_text(encoding="utf-8") == _old_bytes(data)
    back = cls.read(path)
    assert back == rec and back.to_dict() == data and list(back.to_dict()) == list(data)
    assert back.extra == {}


def test_every_kind_has_a_case():
    assert {c for c, _ in CASES} == set(R.KINDS)


def test_absent_keys_read_leniently_and_fail_on_use(tmp_path: Path):
    path = tmp_path / "quant-Q8_0.json"
    path.write_text(json.dumps({"quant": {"type": "Q8_0"}}))  # a test fixture's partial record
    rec = R.QuantRecord.read(path)
    assert rec.quant == {"type": "Q8_0"} and not rec.has("tensor_types") and rec.get("mix", {}) == {}
    with pytest.raises(PipelineError, match=r"quant-Q8_0\.json: no 'toolchain' in the stage record"):
        _ = rec.toolchain
    assert rec.to_dict() == {"quant": {"type": "Q8_0"}}


def test_unknown_keys_are_kept_last(tmp_path: Path):
    data = {"source": {"path": "/x"}, "legacy": 1, "files": {}}
    path = tmp_path / "fetch.json"
    path.write_text(json.dumps(data))
    rec = R.FetchRecord.read(path)
    assert rec.extra == {"legacy": 1} and rec.get("legacy") == 1
    assert list(rec.to_dict()) == ["source", "files", "legacy"]


def test_missing_or_damaged_record_is_one_line(tmp_path: Path):
    with pytest.raises(PipelineError, match=r"^publish: cannot read stage record .*nope\.json: "):
        R.EvalRecord.read(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(PipelineError, match=r"^eval: cannot read stage record .*bad\.json: "):
        R.EvalBaseRecord.read(bad, "eval")
    bad.write_text("[1]")
    with pytest.raises(PipelineError, match=r"bad\.json: an eval record must be a JSON object"):
        R.EvalRecord.read(bad)


def test_write_is_atomic(tmp_path: Path, monkeypatch):
    import pipeline.fsutil

    bench = next(d for c, d in CASES if c is R.BenchRecord)
    path = tmp_path / "bench.json"
    R.BenchRecord(**bench).write(path)
    old = path.read_bytes()

    def fail(*_a):
        raise OSError("no rename")

    monkeypatch.setattr(pipeline.fsutil.os, "replace", fail)  # killed before the rename: the old file stays
    with pytest.raises(OSError):
        R.BenchRecord(**{**bench, "threads": 8}).write(path)
    assert path.read_bytes() == old and [p.name for p in tmp_path.iterdir()] == ["bench.json"]
