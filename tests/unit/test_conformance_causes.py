"""The cause names and residual normalizers of pipeline/stages/conformance/causes.py on normalizer specs as
tokenizer.json writes them (no tokenizer library: which members llama.cpp's tokenizer type applies itself)."""

from __future__ import annotations

from pipeline.stages.conformance.causes import cause_name, read_normalizer

SPACE = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
PREPEND = {"type": "Prepend", "prepend": "\u2581"}


class FakeTok:  # only its class name is read when a spec is given
    pass


def norm(spec, model="gpt2", tmp_path=None):
    return read_normalizer(FakeTok(), {"normalizer": spec}, tmp_path or ".", model)


def test_qwen_nfc_alone_and_beside_members_llama_cpp_applies():
    assert norm({"type": "NFC"}).cause == "nfc"
    # an SPM vocabulary escapes spaces and adds the prefix itself: only NFC remains
    spm = norm({"type": "Sequence", "normalizers": [PREPEND, SPACE, {"type": "NFC"}]}, model="llama")
    assert spm.cause == "nfc" and spm.describe() == "Prepend('▁') + Replace(' '->'▁') + NFC"
    # the same members on a BPE vocabulary: the prefix is not llama.cpp's there
    assert norm({"type": "Sequence", "normalizers": [PREPEND, {"type": "NFC"}]}).cause == "nfc+prepend"


def test_defects_are_named_by_every_member_llama_cpp_does_not_apply():
    drops = {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"},
                                                 {"type": "Replace", "pattern": {"String": "ß"}, "content": "ss"}]}
    assert norm(drops).cause == "nfd+replace+strip-accents"
    assert norm({"type": "NFKC"}).cause == "nfkc"
    # WPM applies NFD, lowercase and accent stripping itself (src/llama-vocab.cpp:834-860)
    assert norm(drops, model="bert").cause == "replace"
    assert norm({"type": "Precompiled", "precompiled_charsmap": "AA=="}, model="t5").cause is None
    assert cause_name([{"type": "SomethingNew"}]) == "somethingnew"


def test_no_normalizer_no_cause():
    for spec in (None, {"type": "Sequence", "normalizers": []}):
        n = norm(spec)
        assert n.cause is None and n.describe() is None and n.residual_fn is None
    assert norm({"type": "NFC"}).why() == ("the HF normalizer NFC of the tokenizer files (FakeTok), which llama.cpp's "
                                           "BPE tokenizer does not apply")
