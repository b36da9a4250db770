"""How a conformance verdict reaches the user: the gate's one error line (every file rejected for one reason, said
once; the failed checks after it), `ggufpipe ci`'s failures, and the report / card section."""

from __future__ import annotations

import pytest

from pipeline.errors import GateFailure
from pipeline.stages.evaluate import gate_messages
from pipeline.stages.publish import CONFORMANCE_REJECTED, check_gates
from pipeline.stages.report import conformance_text

FAILED = ("conformance: recipe m: tokenizer parity (a: no specials added, special text parsed): probe french: "
          "first difference at token 1 (HF 86 tokens, llama.cpp 58)")


def manifest(passed: bool) -> dict:
    checks = {"tokenizer": {"passed": passed, "summary": "42 probes x 3 modes"},
              "logits": {"passed": True, "summary": "top-1 0.9971"}}
    rejected = [] if passed else [
        {"file": f"m-{k}.gguf", "size_bytes": 1, "failures": [{"check": "conformance", "message": CONFORMANCE_REJECTED}]}
        for k in ("F16", "Q8_0")]
    m = {"name": "m", "base_quant_type": "F16", "build_id": "m-0", "artifacts": [], "rejected": rejected,
         "conformance": {"passed": passed, "checks": checks, "warnings": []}}
    if not passed:
        m["failures"] = [{"check": "conformance", "message": FAILED}]
    return m


def test_failed_conformance_is_one_line_naming_the_check(tmp_path):
    import json

    m = manifest(False)
    assert gate_messages(m) == [CONFORMANCE_REJECTED, FAILED]  # once each, though two files were rejected
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(m))
    with pytest.raises(GateFailure) as exc:
        check_gates(path, tmp_path / "gate.ok")
    assert [(c["check"], c.get("file")) for c in exc.value.checks] == [
        ("conformance", "m-F16.gguf"), ("conformance", "m-Q8_0.gguf"), ("conformance", None)]
    assert exc.value.messages == [CONFORMANCE_REJECTED, FAILED] and exc.value.published == 0
    # the one line `ggufpipe stage gate` prints, as before GateFailure had fields
    assert str(exc.value) == f"{CONFORMANCE_REJECTED}; {FAILED} (0 quant(s) published)"
    assert not (tmp_path / "gate.ok").exists()


def test_report_section():
    ok = conformance_text(manifest(True))
    assert "against the Hugging Face model" in ok and ": passed." in ok and "| logits | pass | top-1 0.9971 |" in ok
    bad = conformance_text(manifest(False))
    assert "failed: no file is published" in bad and "| tokenizer | FAIL | 42 probes x 3 modes |" in bad
    skipped = conformance_text({"conformance": {"skipped": "the recipe opts out (conformance: false)"}})
    assert skipped == "Not checked against the Hugging Face model: the recipe opts out (conformance: false)."
    assert conformance_text({}) == ""


def test_report_section_names_the_causes():
    """A known limitation tells clients what to send; an accepted defect is shown as a known difference; a
    normalizer-free record shows neither."""
    m = manifest(True)
    m["conformance"]["checks"]["tokenizer"]["causes"] = {
        "nfc": {"status": "known limitation", "probes": ["decomposed-accents"], "text_share": {"botchan.txt": 0.0}},
        "nfkc": {"status": "accepted", "probes": ["chinese", "compatibility-characters"]},
        "control-typed": {"status": "known limitation", "probes": ["added-token 5 '<|fim_prefix|>'"]}}
    text = conformance_text(m)
    assert ("**Send NFC-normalized text.** The Hugging Face tokenizer normalizes its input to Unicode NFC and "
            "llama.cpp's does not (a known llama.cpp limitation), so text that is not NFC, such as a decomposed `e` + "
            "U+0301, tokenizes differently (NFC changes 0.00% of botchan.txt).") in text
    assert ("**Known difference, accepted by the recipe (`conformance.accept`): nfkc.** Text it touches tokenizes "
            "differently in llama.cpp than in the Hugging Face tokenizer; probes: chinese, compatibility-characters.") in text
    assert text.count("**") == 4  # control-typed: a warning line in the record, no advice paragraph of its own
    assert "Send NFC" not in conformance_text(manifest(True))
