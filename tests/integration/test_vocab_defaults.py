"""``effective_vocab`` against llama.cpp b11312 itself: the real ``llama-tokenize`` is the oracle, never a fake.

How the tool reveals what ``llama_vocab::impl::load`` decided (tools/tokenize/tokenize.cpp, src/llama-vocab.cpp):

- ``-v`` prints ``llama_vocab::impl::print_info``: ``vocab type``, ``n_vocab``, ``BOS token = <id>`` and
  ``EOS token = <id>`` (no BOS/EOS line for LLAMA_TOKEN_NULL).
- It tokenizes its text with ``add_special = llama_vocab_get_add_bos(vocab)`` (``--no-bos`` unset). An empty
  text (given through ``--stdin``) has no tokens of its own, so the ids are exactly the special tokens
  ``llama_tokenize`` adds: for SPM, BPE and UGM vocabs none when add_bos is false, else BOS followed by EOS
  when add_eos is true; for WPM ``[BOS, SEP]`` when add_bos is true. So add_bos is observable for these
  four types and add_eos only when add_bos is true and the vocab is not WPM. RWKV, PLaMo-2 and TEST vocabs
  never add BOS/EOS: their add flags are not observable.

Each case compares ``effective_vocab`` with what the tool showed, key by key, for the keys it showed. The
cases: every ``ggml-vocab-*.gguf`` of the pinned tree, the real SmolLM2 model, GGUFs written here with
GGUFWriter from a vocab file's tokenizer keys with some keys removed or changed (e.g. no
``tokenizer.ggml.add_bos_token``), and a tiny BPE vocab under every pre-tokenizer name.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from pipeline.gguf import read_header
from pipeline.gguf.vocab_defaults import BPE_PRE_TOKENIZERS, VOCAB_TYPES, effective_vocab
from pipeline.tools import cache_root, pinned_dir

VOCAB_FILES = sorted((pinned_dir() / "vocab").glob("ggml-vocab-*.gguf"))
# the demo's source model (extracted by `ggufpipe setup-demo`, which `make test` runs first); its F16 and
# quants are checked against llama.cpp in test_vocab_oracle.py
REAL_MODELS = (cache_root() / "demo" / "SmolLM2-135M-Instruct.Q4_1.gguf",)
WORKERS = 2

T = GGUFValueType
TOKENS, SCORES, TOKEN_TYPE = "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"
MODEL, PRE, MERGES = "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.merges"
BOS_ID, EOS_ID = "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"
ADD_BOS, ADD_EOS = "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"

# ----------------------------------------------------------------------------------------------- the oracle

_PRINTED_TYPES = {"no vocab": "none", "SPM": "spm", "BPE": "bpe", "WPM": "wpm", "UGM": "ugm", "RWKV": "rwkv",
                  "PLaMo2": "plamo2", "TEST": "test"}  # llama_vocab::impl::type_name()
_ADDS_SPECIAL_TOKENS = ("spm", "bpe", "wpm", "ugm")


@dataclass
class Observed:
    """What llama-tokenize showed for one GGUF: ``facts`` is None when it refused the file."""

    facts: dict[str, Any] | None
    log: str


def _env() -> dict[str, str]:
    return {**os.environ, "GGML_NO_BACKTRACE": "1"}  # an abort prints no gdb backtrace


def _tokenize_empty_text(exe: Path, gguf: Path) -> tuple[list[int] | None, str, int]:
    """ids (None if it failed), verbose log and exit status of llama-tokenize on an empty text.

    The text comes through --stdin, which (unlike -p) accepts an empty one. It also makes the log complete:
    llama.cpp logs through a worker thread, so lines still queued when the process exits or aborts are lost
    (a vocab without tokenizer aborts in tokenize). With --stdin the tool loads the vocab, logs, then waits
    for its input, which is closed only once print_info's last vocab line has arrived.
    """
    proc = subprocess.Popen([str(exe), "-m", str(gguf), "--stdin", "--ids", "-v"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", env=_env())
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        head = []
        for line in proc.stderr:
            head.append(line)
            if "print_info: max token length" in line:
                break
        out, err = proc.communicate("")
    finally:
        watchdog.cancel()
    m = re.fullmatch(r"\[([0-9, ]*)\]\s*", out) if proc.returncode == 0 else None
    ids = [int(x) for x in m.group(1).split(",") if x.strip()] if m else None
    return ids, "".join(head) + err, proc.returncode


def observe(exe: Path, gguf: Path) -> Observed:
    """The vocab facts llama.cpp b11312 reveals for ``gguf`` (only the observable ones)."""
    ids, log, status = _tokenize_empty_text(exe, gguf)

    def printed(what: str) -> str | None:
        m = re.search(rf"print_info: {what}\s+= (.*)", log)
        return m.group(1).strip() if m else None

    vocab_type = printed("vocab type")
    if vocab_type is None:  # the load failed before print_info
        assert status != 0, f"{gguf.name}: llama-tokenize succeeded but logged no vocab: {log[-2000:]}"
        return Observed(None, log)
    bos, eos = printed("BOS token"), printed("EOS token")
    facts: dict[str, Any] = {
        "vocab_type": _PRINTED_TYPES[vocab_type],
        "n_tokens": int(printed("n_vocab") or -1),
        "bos_id": int(bos.split()[0]) if bos else None,
        "eos_id": int(eos.split()[0]) if eos else None,
    }
    if facts["vocab_type"] in _ADDS_SPECIAL_TOKENS and ids is not None:
        # add_special = add_bos: no ids at all, or BOS then EOS if add_eos (SEP for WPM, whatever add_eos says)
        facts["add_bos"] = ids != []
        if facts["add_bos"]:
            assert ids[0] == facts["bos_id"], f"{gguf.name}: {ids}"
            if facts["vocab_type"] != "wpm":
                assert ids[1:] in ([], [facts["eos_id"]]), f"{gguf.name}: {ids}"
                facts["add_eos"] = len(ids) == 2
    return Observed(facts, log)


def assert_agrees(gguf: Path, seen: Observed) -> dict[str, Any]:
    """effective_vocab says what llama.cpp showed (or raises where llama.cpp refused the file)."""
    if seen.facts is None:
        with pytest.raises(ValueError):
            effective_vocab(gguf)
        return {}
    ours = effective_vocab(gguf)
    assert {k: ours[k] for k in seen.facts} == seen.facts, f"{gguf.name}: ours {ours}"
    return ours


# ----------------------------------------------------------------------------- GGUFs written with GGUFWriter

KV = dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]]  # key -> (value, type, array element type)


def tokenizer_kv(reader: GGUFReader) -> KV:
    """A vocab file's ``tokenizer.ggml.*`` keys, values as GGUFWriter.add_key_value takes them (strings as bytes)."""
    out: KV = {}
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.ggml."):
            continue
        vtype = T(field.types[0])
        if vtype == T.ARRAY:
            sub = T(field.types[1])
            if sub == T.STRING:
                out[key] = ([bytes(field.parts[i]) for i in field.data], vtype, sub)
            else:
                out[key] = ([field.parts[i][0].item() for i in field.data], vtype, sub)
        elif vtype == T.STRING:
            out[key] = (bytes(field.parts[field.data[0]]), vtype, None)
        else:
            out[key] = (field.parts[field.data[0]][0].item(), vtype, None)
    return out


def write_vocab_only(path: Path, kv: KV, arch: str = "llama") -> Path:
    """A vocab-only GGUF (no tensors): general.architecture plus ``kv``."""
    writer = GGUFWriter(path, arch)
    for key, (value, vtype, sub) in kv.items():
        writer.add_key_value(key, value, vtype, sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _donor(name: str) -> tuple[GGUFReader, Path, KV]:
    path = pinned_dir() / "vocab" / f"ggml-vocab-{name}.gguf"
    reader = GGUFReader(path)
    return reader, path, tokenizer_kv(reader)


def _str(s: str):
    return (s.encode(), T.STRING, None)


def _u32(n: int):
    return (n, T.UINT32, None)


def _bool(b: bool):
    return (b, T.BOOL, None)


def edit(kv: KV, drop: tuple[str, ...] = (), **changes) -> KV:
    """``kv`` without the keys in ``drop``, with ``tokenizer.ggml.<name>`` keys set from ``changes``."""
    out = {k: v for k, v in kv.items() if k not in drop}
    out.update({f"tokenizer.ggml.{k}": v for k, v in changes.items()})
    return out


def _first_tokens(kv: KV, n: int) -> KV:
    return edit(kv, **{k.removeprefix("tokenizer.ggml."): (kv[k][0][:n], T.ARRAY, kv[k][2])
                       for k in (TOKENS, SCORES, TOKEN_TYPE)})


def _duplicate_token(kv: KV) -> KV:
    tokens = list(kv[TOKENS][0])
    tokens[300] = tokens[301]
    return edit(kv, tokens=(tokens, T.ARRAY, T.STRING))


# The GGUFs written from a base: "spm" / "bpe" are all tokenizer keys of ggml-vocab-llama-spm (SPM, 32000 tokens,
# bos 1, eos 2, add_bos_token true, add_eos_token false) / ggml-vocab-deepseek-coder (GPT-2 BPE, pre
# deepseek-coder, 32256 tokens, bos 32013, eos 32014, add_bos_token true, add_eos_token false); "spm512" is
# llama-spm cut to its first 512 tokens, "bpe259" a 259-token GPT-2 BPE vocab with deepseek-coder's keys
# (bos 257, eos 258), both quick to write and load.
# name -> (base, how to change its tokenizer keys, what llama.cpp is expected to show (None: it refuses the
# file) -- a summary for the reader; each case is also compared in full with llama-tokenize's own answers)
Variant = tuple[str, Callable[[KV], KV], dict[str, Any] | None]
VARIANTS: dict[str, Variant] = {
    # the requested case: no tokenizer.ggml.add_bos_token -> the per-type / per-pre default
    "spm-no-add_bos_token": ("spm", lambda kv: edit(kv, (ADD_BOS,)), {"add_bos": True, "add_eos": False}),
    "bpe-no-add_bos_token": ("bpe", lambda kv: edit(kv, (ADD_BOS,)), {"add_bos": False}),
    "bpe-llama-bpe-no-add_bos_token": ("bpe", lambda kv: edit(kv, (ADD_BOS,), pre=_str("llama-bpe")),
                                       {"add_bos": True, "add_eos": False}),
    "bpe-smollm-no-add_bos_token": ("bpe259", lambda kv: edit(kv, (ADD_BOS,), pre=_str("smollm")), {"add_bos": False}),
    "bpe-no-add-flags-no-pre": ("bpe259", lambda kv: edit(kv, (ADD_BOS, ADD_EOS, PRE)), {"add_bos": False}),
    # default special ids, and ids outside the vocab
    "spm-default-ids": ("spm512", lambda kv: edit(kv, (ADD_BOS, ADD_EOS, BOS_ID, EOS_ID)),
                        {"bos_id": 1, "eos_id": 2, "add_bos": True, "add_eos": False}),
    "bpe-default-ids": ("bpe259", lambda kv: edit(kv, (BOS_ID, EOS_ID)),
                        {"bos_id": 11, "eos_id": 11, "add_bos": True, "add_eos": False}),
    "spm-ids-out-of-range": ("spm512", lambda kv: edit(kv, bos_token_id=_u32(512), eos_token_id=_u32(2**32 - 1)),
                             {"bos_id": 1, "eos_id": 2}),
    "spm-2-tokens": ("spm512", lambda kv: edit(_first_tokens(kv, 2), (BOS_ID, EOS_ID)),
                     {"n_tokens": 2, "bos_id": 1, "eos_id": None, "add_bos": True}),
    "spm-add_eos_token": ("spm512", lambda kv: edit(kv, add_eos_token=_bool(True)), {"add_bos": True, "add_eos": True}),
    "bpe-chatglm-bpe-no-bos_token_id": ("bpe259", lambda kv: edit(kv, (BOS_ID, ADD_BOS), pre=_str("chatglm-bpe")),
                                        {"bos_id": None, "add_bos": False}),
    "bpe-glm4-keeps-bos_token_id": ("bpe259", lambda kv: edit(kv, pre=_str("glm4")), {"bos_id": 257, "add_bos": True}),
    # Gemma 4 pre-tokenizers force add_bos even against add_bos_token = false
    "bpe-gemma4-add_bos_token-false": ("bpe", lambda kv: edit(kv, pre=_str("gemma4"), add_bos_token=_bool(False)),
                                       {"add_bos": True}),
    "bpe-granite-embed-multi-311m-add_bos_token-false": (
        "bpe259", lambda kv: edit(kv, pre=_str("granite-embed-multi-311m"), add_bos_token=_bool(False)),
        {"add_bos": True}),
    "bpe-llama3-add_bos_token-false": ("bpe259", lambda kv: edit(kv, pre=_str("llama3"), add_bos_token=_bool(False)),
                                       {"add_bos": False}),
    # the other tokenizer models
    "ugm-defaults": ("spm512", lambda kv: edit(kv, (ADD_BOS, ADD_EOS, BOS_ID), model=_str("t5")),
                     {"vocab_type": "ugm", "bos_id": None, "eos_id": 2, "add_bos": False}),
    "ugm-add_bos_token": ("spm512", lambda kv: edit(kv, (ADD_EOS,), model=_str("t5")),
                          {"vocab_type": "ugm", "bos_id": 1, "add_bos": True, "add_eos": True}),
    "rwkv-defaults": ("spm512", lambda kv: edit(kv, (BOS_ID, EOS_ID), model=_str("rwkv")),
                      {"vocab_type": "rwkv", "bos_id": None, "eos_id": None}),
    "plamo2-defaults": ("spm512", lambda kv: edit(kv, (BOS_ID, EOS_ID), model=_str("plamo2")),
                        {"vocab_type": "plamo2", "bos_id": 1, "eos_id": 2}),
    "test-defaults": ("spm512", lambda kv: edit(kv, (BOS_ID, EOS_ID), model=_str("test")),
                      {"vocab_type": "test", "bos_id": None, "eos_id": None}),
    "no_vocab": ("spm512", lambda kv: {MODEL: _str("no_vocab"), "llama.vocab_size": _u32(1234)},
                 {"vocab_type": "none", "n_tokens": 1234, "bos_id": None, "eos_id": None}),
    "none-without-vocab_size": ("spm512", lambda kv: edit(kv, model=_str("none")),
                                {"vocab_type": "none", "n_tokens": 0, "bos_id": None, "eos_id": None}),
    # files llama.cpp refuses: effective_vocab raises
    "unknown-tokenizer-model": ("spm512", lambda kv: edit(kv, model=_str("sentencepiece")), None),
    "unknown-pre-tokenizer": ("bpe259", lambda kv: edit(kv, pre=_str("no-such-pre")), None),
    "bos_token_id-wrong-type": ("spm512", lambda kv: edit(kv, bos_token_id=(1, T.INT32, None)), None),
    "add_bos_token-wrong-type": ("spm512", lambda kv: edit(kv, add_bos_token=_u32(1)), None),
    "bpe-without-merges": ("bpe259", lambda kv: edit(kv, (MERGES,)), None),
    "duplicate-token-text": ("spm512", _duplicate_token, None),
    "scores-shorter-than-tokens": ("spm512", lambda kv: edit(kv, scores=(kv[SCORES][0][:100], T.ARRAY, T.FLOAT32)),
                                   None),
}


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte-level alphabet, by byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def tiny_bpe(pre: str) -> KV:
    """A 259-token GPT-2 BPE vocab (256 byte tokens, "he", "<s>", "</s>") with no special ids or add flags."""
    tokens = [*_bytes_to_unicode(), "he", "<s>", "</s>"]
    return {
        MODEL: _str("gpt2"),
        PRE: _str(pre),
        TOKENS: ([t.encode() for t in tokens], T.ARRAY, T.STRING),
        TOKEN_TYPE: ([1] * 257 + [3, 3], T.ARRAY, T.INT32),
        MERGES: ([b"h e"], T.ARRAY, T.STRING),
    }


def bpe259() -> KV:
    """tiny_bpe with ggml-vocab-deepseek-coder's pre, add flags, and special ids on its "<s>" / "</s>"."""
    return edit(tiny_bpe("deepseek-coder"), bos_token_id=_u32(257), eos_token_id=_u32(258),
                add_bos_token=_bool(True), add_eos_token=_bool(False))


def _converter_pre_names() -> set[str]:
    """tokenizer.ggml.pre values the pinned converter can write (``res = "..."`` in its sources)."""
    names: set[str] = set()
    for py in (pinned_dir() / "convert").rglob("*.py"):
        names.update(re.findall(r'\bres = "([^"]+)"', py.read_text(errors="replace")))
    return names


# every pre-tokenizer name of the table, those the converter writes (bert-bge... are for WPM vocabs: refused
# under a BPE vocab), and one nobody knows
PRE_NAMES = sorted({n for _, names, _ in BPE_PRE_TOKENIZERS for n in names} | _converter_pre_names() | {"no-such-pre"})
# pre-tokenizers that turn add_bos on: as a default (llama3, tekken, chameleon) or over the file (Gemma 4)
FORCING_PRES = ("gemma4", "granite-embed-multi-311m", "llama3", "tekken", "chameleon")


@dataclass
class Cases:
    seen: dict[str, tuple[Path, Observed]]  # case name -> (GGUF, what llama-tokenize showed)
    donors: dict[str, tuple[GGUFReader, Path, KV]]


@pytest.fixture(scope="module")
def cases(toolchain, tmp_path_factory) -> Cases:
    """Every GGUF of this module and what llama-tokenize showed for it.

    The tool runs two at a time in the background, starting with the pinned tree's vocab files while the
    GGUFs derived from them are written.
    """
    exe = toolchain.tool("llama-tokenize")
    folder = tmp_path_factory.mktemp("vocab-variants")
    with ThreadPoolExecutor(WORKERS) as pool:
        jobs = {}

        def submit(name: str, path: Path) -> None:
            jobs[name] = (path, pool.submit(observe, exe, path))

        for path in [*VOCAB_FILES, *REAL_MODELS]:
            submit(path.name, path)
        donors = {"spm": _donor("llama-spm"), "bpe": _donor("deepseek-coder")}
        bases = {"spm": donors["spm"][2], "bpe": donors["bpe"][2], "spm512": _first_tokens(donors["spm"][2], 512),
                 "bpe259": bpe259()}
        for name, (base, change, _) in VARIANTS.items():
            submit(name, write_vocab_only(folder / f"{name}.gguf", change(bases[base])))
        for i, pre in enumerate(PRE_NAMES):
            submit(f"pre={pre}", write_vocab_only(folder / f"pre-{i}.gguf", tiny_bpe(pre)))
        for pre in FORCING_PRES:
            submit(f"pre={pre},add_bos_token=false", write_vocab_only(
                folder / f"pre-{pre}-no-add-bos.gguf", edit(tiny_bpe(pre), add_bos_token=_bool(False))))
        # tokenizer.ggml.model "gemma4": llama.cpp replaces the file's pre with "gemma4", so add_bos is forced
        submit("model=gemma4", write_vocab_only(folder / "model-gemma4.gguf", edit(
            tiny_bpe("qwen2"), model=_str("gemma4"), bos_token_id=_u32(257), add_bos_token=_bool(False))))
        return Cases({name: (path, job.result()) for name, (path, job) in jobs.items()}, donors)


# ----------------------------------------------------------------------- the pinned tree's vocab files, a model


def test_vocab_files_present():
    assert len(VOCAB_FILES) >= 19, f"expected the pinned tree's ggml-vocab-*.gguf files in {pinned_dir() / 'vocab'}"


@pytest.mark.parametrize("gguf", VOCAB_FILES, ids=lambda p: p.stem.removeprefix("ggml-vocab-"))
def test_vocab_file_matches_llama_cpp(gguf, cases):
    _, seen = cases.seen[gguf.name]
    assert seen.facts is not None, f"llama-tokenize could not load {gguf.name}: {seen.log[-2000:]}"
    assert "add_bos" in seen.facts, f"{gguf.name}: add_bos not observed"  # all of them are SPM/BPE/WPM/UGM
    assert_agrees(gguf, seen)


@pytest.mark.parametrize("gguf", REAL_MODELS, ids=lambda p: p.name)
def test_real_model_matches_llama_cpp(gguf, cases):
    assert gguf.is_file(), f"{gguf} is missing: run `ggufpipe setup-demo` (make test does)"
    _, seen = cases.seen[gguf.name]
    assert seen.facts is not None, seen.log[-2000:]
    ours = assert_agrees(gguf, seen)
    # SmolLM2: GPT-2 BPE, pre "smollm", add_bos_token false: llama.cpp adds neither BOS nor EOS
    assert ours == {"vocab_type": "bpe", "n_tokens": 49152, "bos_id": 1, "eos_id": 2, "add_bos": False,
                    "add_eos": False, "model": "gpt2", "pre": "smollm"}
    assert seen.facts["add_bos"] is False


def test_reader_and_path_agree(cases):
    """pipeline.gguf's reader gives gguf-py GGUFReader's values, arrays decoded on demand element for element;
    a parsed header and a path give the same facts."""
    reader, path, _ = cases.donors["spm"]
    header = read_header(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(header.metadata) == list(fields)
    for key, f in fields.items():
        assert header.get(key) == f.contents(), key
    assert effective_vocab(header) == effective_vocab(path)


@pytest.mark.parametrize("name", VARIANTS)
def test_written_variant_matches_llama_cpp(name, cases):
    path, seen = cases.seen[name]
    expected = VARIANTS[name][2]
    if expected is None:
        assert seen.facts is None, f"llama.cpp loaded {name}: {seen.facts}"
    else:
        assert seen.facts is not None, f"llama.cpp refused {name}: {seen.log[-2000:]}"
        assert {k: seen.facts.get(k) for k in expected} == expected, f"llama.cpp showed {seen.facts}"
    assert_agrees(path, seen)


def test_gguf_without_add_bos_token_loads(cases):
    """The GGUFs lacking tokenizer.ggml.add_bos_token are real vocab-only files llama.cpp loads and tokenizes."""
    for name, donor in (("spm-no-add_bos_token", "spm"), ("bpe-no-add_bos_token", "bpe")):
        path, seen = cases.seen[name]
        assert ADD_BOS.encode() not in path.read_bytes() and ADD_BOS in cases.donors[donor][0].fields
        assert seen.facts is not None and "add_bos" in seen.facts
        assert effective_vocab(path)["add_bos"] == seen.facts["add_bos"]


@pytest.mark.parametrize("pre", PRE_NAMES)
def test_pre_tokenizer_matches_llama_cpp(pre, cases):
    path, seen = cases.seen[f"pre={pre}"]
    ours = assert_agrees(path, seen)
    if pre == "no-such-pre":
        assert seen.facts is None
    if seen.facts is not None:
        assert "add_bos" in seen.facts and ours["pre"] == pre


@pytest.mark.parametrize("pre", FORCING_PRES)
def test_add_bos_token_false_against_forcing_pre(pre, cases):
    path, seen = cases.seen[f"pre={pre},add_bos_token=false"]
    assert_agrees(path, seen)
    assert seen.facts["add_bos"] is (pre in ("gemma4", "granite-embed-multi-311m"))  # only Gemma 4 overrides the key


def test_gemma4_model_forces_its_pre(cases):
    path, seen = cases.seen["model=gemma4"]
    ours = assert_agrees(path, seen)
    assert seen.facts["add_bos"] is True and ours["pre"] == "qwen2"  # `pre` is the file's value


def test_vocab_types_are_llama_cpp_enum():
    assert VOCAB_TYPES == ("none", "spm", "bpe", "wpm", "ugm", "rwkv", "plamo2", "test")
    assert sorted(_PRINTED_TYPES.values()) == sorted(VOCAB_TYPES)
