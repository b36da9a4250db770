"""The native helper ``ggufpipe-conformance`` (pipeline/native/conformance.cpp) and the EOG mirror
(``pipeline.gguf.vocab_defaults.eog_set``) against llama.cpp b11312 itself: real tools, no fakes.

- Tokenization: on every vendored ``ggml-vocab-*.gguf`` with ``.inp``/``.out`` pairs, the helper (no specials
  added, special text not parsed) gives the ids Hugging Face's tokenizers recorded in ``.out`` (what llama.cpp's
  tests/test-tokenizer-0 checks), and on every vendored vocab it gives what ``llama-tokenize`` gives for a probe
  text, in both of that tool's modes: the helper runs the same code path.
- End of generation: the mirror's set == the helper's ``llama_vocab_is_eog`` ids == the ``print_info: EOG token``
  lines of ``llama-tokenize -lv 4``, on every vendored vocab and on generated variants (gguf_factory) for each
  rule of src/llama-vocab.cpp:2871-3033; where the mirror says the set depends on hash order, llama.cpp's set is
  one of the sets it names.
- Rendering: a ChatML conversation from a GGUF's own template, the BOS text stripped as chat.cpp:958-964 does,
  a template that raises, and requests the helper must refuse one by one while answering the rest.
"""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.gguf_factory import Tokenizer, read_tokenizer, tiny_llama

from pipeline.errors import PipelineError, ToolError
from pipeline.gguf.vocab_defaults import effective_vocab, eog_set
from pipeline.tools import HELPERS, Toolchain, cache_root, pinned_dir, run_helper

HELPER = "ggufpipe-conformance"
VOCAB_DIR = pinned_dir() / "vocab"
VOCAB_FILES = sorted(VOCAB_DIR.glob("ggml-vocab-*.gguf"))
PAIRED = [p for p in VOCAB_FILES if Path(f"{p}.inp").is_file()]
WORKERS = 2
SEP = "\n__ggml_vocab_test__\n"  # tests/test-tokenizer-0.cpp:89
# Whitespace runs, scripts, digits, emoji with ZWJ, a combining mark, and special-token texts of several families.
PROBE = ("Hello world! Le café de Müller, ñandú, Tiếng Việt.\n\t  indented\tcode   x  \n\n\n"
         "中文 日本語のかなカナ 한국어 العربية Русский हिन्दी\n3.14159 1234567890 🦙👩‍👩‍👧 e\u0301\n"
         "<|endoftext|></s><s>[CLS]<|im_end|><|eot_id|><eos> <|end|>  trailing  ")
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _vocab_id(path: Path) -> str:
    return path.name.removeprefix("ggml-vocab-").removesuffix(".gguf")


# ----------------------------------------------------------------------------------------------- llama.cpp's side


@dataclass
class Observed:
    """One GGUF as llama.cpp showed it: the helper's answers and llama-tokenize's ids and EOG lines."""

    vocab: dict[str, Any]
    answers: list[dict[str, Any]]  # the helper's answers to the requests after "vocab"
    tool_plain: list[int] | None  # llama-tokenize --no-bos --no-parse-special on PROBE
    tool_default: list[int]  # llama-tokenize with its defaults (add_special = add_bos, parse_special) on PROBE
    tool_eog: list[int]  # the `print_info: EOG token = <id>` lines


def _llama_tokenize(tc: Toolchain, gguf: Path, *flags: str) -> tuple[list[int], str]:
    cmd = [str(tc.tool("llama-tokenize")), "-m", str(gguf), "--stdin", "--ids", "--no-escape", *flags]
    for _ in range(3):  # common's log thread is not joined at exit: a run whose log lost its tail is run again
        res = subprocess.run(cmd, input=PROBE.encode(), capture_output=True, timeout=120, check=False)
        err = res.stderr.decode("utf-8", "replace")
        assert res.returncode == 0, f"{' '.join(cmd)}: {err[-2000:]}"
        if "--log-disable" in flags or "print_info: max token length" in err:
            return json.loads(res.stdout.decode().strip().splitlines()[-1]), err
    raise AssertionError(f"{' '.join(cmd)}: no print_info block in 3 runs: {err[-2000:]}")


def observe(tc: Toolchain, gguf: Path, requests: list[dict], plain: bool = True) -> Observed:
    probes = [{"op": "tokenize", "text": PROBE, "add_special": a, "parse_special": p}
              for a, p in ((False, False), (False, True), (True, True))]
    answers = run_helper(tc, HELPER, gguf, [{"op": "vocab"}, *probes, *requests])
    vocab, got = answers[0], answers[1:4]
    for answer in answers[:4]:
        assert "error" not in answer, answer
    default_ids, log = _llama_tokenize(tc, gguf, "-lv", "4")
    tool_eog = [int(m) for m in re.findall(r"print_info: EOG token\s+= (\d+) '", log)]
    plain_ids = _llama_tokenize(tc, gguf, "--no-bos", "--no-parse-special", "--log-disable")[0] if plain else None
    # the helper's tokenizations of PROBE are llama-tokenize's (which passes add_special = add_bos, tokenize.cpp:180)
    if plain:
        assert got[0]["ids"] == plain_ids, f"{gguf.name}: helper vs llama-tokenize --no-bos --no-parse-special"
    assert got[2 if vocab["add_bos"] else 1]["ids"] == default_ids, f"{gguf.name}: helper vs llama-tokenize defaults"
    return Observed(vocab, answers[4:], plain_ids, default_ids, tool_eog)


def read_pairs(gguf: Path) -> list[tuple[str, list[int]]]:
    """The test strings of ``<gguf>.inp`` and the ids of ``<gguf>.out``, split as tests/test-tokenizer-0.cpp:61-122
    does (a final separator is optional; one ``.out`` line per test, ids as " %d")."""
    raw = Path(f"{gguf}.inp").read_bytes().decode("utf-8")
    texts = raw.split(SEP)
    if raw.endswith(SEP):
        texts.pop()
    lines = Path(f"{gguf}.out").read_bytes().decode("ascii").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    assert len(texts) == len(lines), f"{gguf.name}: {len(texts)} tests in .inp, {len(lines)} lines in .out"
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines, strict=True)]


@pytest.fixture(scope="module")
def vendored(toolchain) -> dict[str, Observed]:
    """Every vendored vocab observed once (the helper with the .inp tests, llama-tokenize twice), in parallel."""
    def one(gguf: Path) -> Observed:
        pairs = read_pairs(gguf) if gguf in PAIRED else []
        return observe(toolchain, gguf, [{"op": "tokenize", "text": t, "add_special": False, "parse_special": False}
                                         for t, _ in pairs])

    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(zip([_vocab_id(p) for p in VOCAB_FILES], pool.map(one, VOCAB_FILES), strict=True))


# ----------------------------------------------------------------------------------------------- the vendored vocabs


def test_vendored_vocabs_are_in_the_cache(toolchain):
    """install() copies the 19 vocab-only GGUFs and the 15 .inp/.out pairs beside them (ASSETS); the helper is
    built with the tools."""
    assert len(VOCAB_FILES) == 19 and len(PAIRED) == 15, (VOCAB_FILES, PAIRED)
    assert all(Path(f"{p}.out").is_file() for p in PAIRED)
    assert toolchain.helper(HELPER).is_file() and HELPER in HELPERS


@pytest.mark.parametrize("gguf", PAIRED, ids=_vocab_id)
def test_helper_gives_the_recorded_hf_ids(vendored, gguf):
    """The HF truth: every .inp test string tokenized by the helper (add_special=false, parse_special=false, as
    test-tokenizer-0.cpp:196-205) gives the ids of .out."""
    obs = vendored[_vocab_id(gguf)]
    pairs = read_pairs(gguf)
    bad = [f"test {i} {text[:30]!r}: HF {want} llama.cpp {got['ids']}"
           for i, ((text, want), got) in enumerate(zip(pairs, obs.answers, strict=True)) if got.get("ids") != want]
    assert not bad, f"{gguf.name}: {len(bad)} of {len(pairs)} tests differ from .out: " + "; ".join(bad[:3])


@pytest.mark.parametrize("gguf", VOCAB_FILES, ids=_vocab_id)
def test_helper_vocab_facts_and_eog(vendored, gguf):
    """The EOG mirror == the helper's llama_vocab_is_eog ids == llama-tokenize's `print_info: EOG token` lines;
    the helper's BOS/EOS/add flags/type/size == effective_vocab (already proven against llama-tokenize)."""
    obs = vendored[_vocab_id(gguf)]
    mirror = eog_set(gguf)
    assert mirror.undetermined is None, mirror.undetermined
    assert list(mirror.ids) == obs.vocab["eog"] == obs.tool_eog, (mirror, obs.vocab["eog"], obs.tool_eog)
    facts = effective_vocab(gguf)
    assert (obs.vocab["type"], obs.vocab["n_tokens"], obs.vocab["bos"], obs.vocab["eos"], obs.vocab["add_bos"],
            obs.vocab["add_eos"]) == (facts["vocab_type"], facts["n_tokens"], facts["bos_id"], facts["eos_id"],
                                      facts["add_bos"], facts["add_eos"])
    for what in ("eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep"):  # the ids the mirror derived on the way
        assert obs.vocab[what] in (mirror.specials[what] or (None,)), (what, obs.vocab[what], mirror.specials[what])
    for i in obs.vocab["eog"]:
        assert str(i) in obs.vocab["pieces_of_specials"]


def test_eog_of_the_demo_model(toolchain):
    """The demo's SmolLM2 (extracted by `ggufpipe setup-demo`, which `make test` runs first): EOG is
    <|endoftext|>, <|im_end|> and <reponame> (FIM_REP by its text); EOT is one of the first two (hash order)."""
    gguf = cache_root() / "demo" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf.is_file():
        pytest.skip(f"{gguf} is not extracted: run `ggufpipe setup-demo`")
    obs = observe(toolchain, gguf, [])
    mirror = eog_set(gguf)
    assert list(mirror.ids) == obs.vocab["eog"] == obs.tool_eog == [0, 2, 4]
    assert mirror.specials["eot"] == (0, 2) and obs.vocab["eot"] in (0, 2) and obs.vocab["fim_rep"] == 4


# ----------------------------------------------------------------------------------------------- generated variants

SPM = "ggml-vocab-llama-spm.gguf"  # 32000 tokens, eos 2 '</s>'
BPE = "ggml-vocab-gpt-2.gguf"  # 50257 tokens, bos = eos = 50256 '<|endoftext|>'


def _append(*texts: str, **keys: Any):
    def edit(tok: Tokenizer) -> None:
        ids = tok.append_tokens(list(texts))
        for key, value in keys.items():  # a value "#k" is the id of the k-th appended token
            tok.set(key, ids[int(value[1:])] if isinstance(value, str) and value.startswith("#") else value)
    return edit


# name -> (source vocab, edit, the expected EOG set: ids, "#k" = the k-th appended token; None = undetermined)
VARIANTS: dict[str, tuple[str, Any, list | None]] = {
    "eot-eom-keys": (SPM, {"eot_token_id": 100, "eom_token_id": 200}, [2, 100, 200]),
    "eot-eom-texts": (SPM, _append("<|eot_id|>", "<|eom_id|>"), [2, "#0", "#1"]),
    "fim-keys": (SPM, {"fim_pad_token_id": 300, "fim_rep_token_id": 301, "fim_sep_token_id": 302},
                 [2, 300, 301, 302]),
    "fim-texts": (BPE, _append("<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|fim_prefix|>"),
                  [50256, "#0", "#1", "#2"]),
    "gpt-oss-end-removed": (BPE, _append("<|return|>", "<|call|>", "<|end|>"), [50256, "#0", "#1"]),
    "solar-open-end-removed": (BPE, _append("<|calls|>", "<|flush|>", "<|end|>"), [50256, "#0", "#1"]),
    "end-kept": (BPE, _append("<|return|>", "<|end|>"), [50256, "#0", "#1"]),
    "s-removed-tool-response": (BPE, _append("</s>", "<|tool_response>"), [50256, "#1"]),
    "s-removed-plamo-eos": (BPE, _append("</s>", "<|plamo:eos|>", eos_token_id="#1"), [50256, "#1"]),
    "s-kept-plamo-not-eog": (BPE, _append("</s>", "<|plamo:eos|>"), [50256, "#0"]),
    "bpe-without-eos-key": (BPE, {"eos_token_id": None, "bos_token_id": None}, [11, 50256]),
    "fim-pad-hash-order": (BPE, _append("<PAD>", "[PAD]"), None),
}


@pytest.fixture(scope="module")
def variants(toolchain, tmp_path_factory) -> dict[str, tuple[Path, int, Observed]]:
    """Each variant written as a tiny model (tiny_llama, 8-dim, tied embeddings) and observed once."""
    folder = tmp_path_factory.mktemp("eog-variants")
    sources = {name: read_tokenizer(VOCAB_DIR / name) for name in (SPM, BPE)}

    def one(name: str) -> tuple[Path, int, Observed]:
        source, edit, _ = VARIANTS[name]
        gguf = tiny_llama(folder / f"{name}.gguf", sources[source], edit, n_layer=1, n_embd=8, n_head=2,
                          n_head_kv=1, n_ff=8, tie_embeddings=True)
        return gguf, sources[source].n_tokens, observe(toolchain, gguf, [], plain=False)

    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(zip(VARIANTS, pool.map(one, VARIANTS), strict=True))


@pytest.mark.parametrize("name", VARIANTS)
def test_eog_variants(variants, name):
    gguf, first_appended, obs = variants[name]
    want = VARIANTS[name][2]
    mirror = eog_set(gguf)
    assert obs.vocab["eog"] == obs.tool_eog, (obs.vocab["eog"], obs.tool_eog)
    if want is None:
        # two texts could be fim_pad: llama.cpp takes the first it meets in an unordered_map; the mirror says so
        assert mirror.ids is None and "fim_pad may be '<PAD>'" in mirror.undetermined, mirror
        assert tuple(obs.tool_eog) in mirror.alternatives and len(mirror.alternatives) == 2, mirror
        return
    expected = sorted(first_appended + int(x[1:]) if isinstance(x, str) else x for x in want)
    assert mirror.undetermined is None and list(mirror.ids) == expected == obs.tool_eog, (mirror, obs.tool_eog)


def test_eog_variant_special_ids(variants):
    """The ids behind the rules: EOT/EOM from keys or from text, the FIM ids, GPT-2's default EOS 11 (',')."""
    assert (variants["eot-eom-keys"][2].vocab["eot"], variants["eot-eom-keys"][2].vocab["eom"]) == (100, 200)
    _, n, obs = variants["eot-eom-texts"]
    assert (obs.vocab["eot"], obs.vocab["eom"]) == (n, n + 1)
    _, n, obs = variants["fim-texts"]
    assert (obs.vocab["fim_pad"], obs.vocab["fim_rep"], obs.vocab["fim_sep"]) == (n, n + 1, n + 2)
    obs = variants["bpe-without-eos-key"][2]
    assert obs.vocab["eos"] == 11 and obs.vocab["pieces_of_specials"]["11"] == ","
    # "<|end|>" and "<|endoftext|>" could both be EOT (hash order): the EOG set is the same either way
    mirror = eog_set(variants["gpt-oss-end-removed"][0])
    assert len(mirror.specials["eot"]) == 2 and mirror.undetermined is None


# ----------------------------------------------------------------------------------------------- rendering and errors


@pytest.fixture(scope="module")
def chat_gguf(tmp_path_factory) -> Path:
    """SPM (add_bos true, BOS '<s>', EOS '</s>') with a ChatML template and its two tokens."""
    folder = tmp_path_factory.mktemp("chat")
    return tiny_llama(folder / "chatml.gguf", VOCAB_DIR / SPM,
                      _append("<|im_start|>", "<|im_end|>", **{"tokenizer.chat_template": CHATML}),
                      n_layer=1, n_embd=8, n_head=2, n_head_kv=1, n_ff=8, tie_embeddings=True)


def test_render_and_bad_requests(toolchain, chat_gguf):
    convo = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    chatml = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    requests = [
        {"op": "render", "messages": convo},
        {"op": "render", "messages": convo, "add_generation_prompt": False},
        {"op": "render", "messages": convo, "template": "{{ raise_exception('no system role here') }}"},
        {"op": "render", "messages": convo[1:], "template": "{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}"},
        {"op": "tokenize", "text": chatml, "add_special": True, "parse_special": True},
        {"op": "nope"},
        {"op": "tokenize", "text": 3, "add_special": False, "parse_special": False},
        {"op": "tokenize", "text": "x", "parse_special": False},
        {"op": "render"},
        {"op": "render", "messages": [{"content": "no role"}]},
        {"op": "detokenize", "ids": [1, 99999999]},
        "not an object",
        {"op": "vocab"},
    ]
    got = run_helper(toolchain, HELPER, chat_gguf, requests)
    assert got[0] == {"prompt": chatml + "<|im_start|>assistant\n"}
    assert got[1] == {"prompt": chatml}
    assert "no system role here" in got[2]["error"] and "\n" not in got[2]["error"]
    # add_bos: the leading BOS text is stripped; add_eos false: the EOS text stays (common/chat.cpp:958-964)
    assert got[3] == {"prompt": "Hi</s>"}
    n = 32000  # <|im_start|>, <|im_end|>
    ids = got[4]["ids"]
    assert ids[0] == 1 and ids.count(n) == 2 and ids.count(n + 1) == 2, ids
    assert got[4]["pieces"][0] == "<s>" and got[4]["pieces"][ids.index(n)] == "<|im_start|>"
    for i, words in ((5, "unknown op 'nope'"), (6, "'text' must be a string"), (7, "missing 'add_special'"),
                     (8, "'messages' must be a list"), (9, "role"), (10, "99999999 is not a token id"),
                     (11, "a request is an object")):
        assert words in got[i].get("error", ""), (i, got[i])
    assert got[12]["add_bos"] is True and got[12]["bos"] == 1 and got[12]["eog"] == [2, n + 1]
    back = run_helper(toolchain, HELPER, chat_gguf, [{"op": "detokenize", "ids": ids}])[0]["text"]
    assert back.count("<|im_start|>") == 2 and "You are terse.<|im_end|>" in back, back


def test_helper_failures_are_one_line(toolchain, tmp_path):
    exe = str(toolchain.helper(HELPER))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF not really")
    res = subprocess.run([exe, str(bad)], input=b"[]", capture_output=True, timeout=60, check=False)
    errors = [ln for ln in res.stderr.decode().splitlines() if ln.startswith("error:")]
    assert res.returncode == 1 and len(errors) == 1 and str(bad) in errors[0], res.stderr
    with pytest.raises(ToolError, match=r"ggufpipe-conformance failed on .*broken\.gguf \(exit 1\)") as exc:
        run_helper(toolchain, HELPER, bad, [])
    assert (exc.value.tool, exc.value.returncode) == (HELPER, 1)
    res = subprocess.run([exe, str(VOCAB_DIR / SPM)], input=b"{not json", capture_output=True, timeout=60,
                         check=False)
    assert res.returncode == 2 and res.stderr.decode().strip().splitlines()[-1].startswith("error: stdin is not JSON")
    res = subprocess.run([exe, str(VOCAB_DIR / SPM)], input=b"[]", capture_output=True, timeout=60, check=False)
    assert res.returncode == 0 and json.loads(res.stdout) == [] and res.stderr == b"", res.stderr


def test_pieces_that_are_not_utf8_come_back_as_bytes(toolchain):
    """A byte-level piece that ends inside a character is written as \\udcXX: the bytes survive json.loads."""
    text = "🦙"  # 4 UTF-8 bytes: GPT-2 has no token for it, so each byte is a token of its own
    got = run_helper(toolchain, HELPER, VOCAB_DIR / BPE,
                     [{"op": "tokenize", "text": text, "add_special": False, "parse_special": False}])[0]
    pieces = [p.encode("utf-8", "surrogateescape") for p in got["pieces"]]
    assert len(pieces) > 1 and b"".join(pieces) == text.encode()


def test_helper_missing_from_a_user_build(tmp_path):
    """A user's LLAMA_CPP_DIR build has the TOOLS but not the helpers: one line saying how to get it."""
    tc = Toolchain(tmp_path, tmp_path, tmp_path / "convert_hf_to_gguf.py", tmp_path, 11312, "0c1e570", "user")
    with pytest.raises(PipelineError) as err:
        tc.helper(HELPER)
    msg = str(err.value)
    assert "\n" not in msg and "`make tools`" in msg and f"LLAMA_CPP_DIR={tmp_path} lacks it" in msg
    with pytest.raises(PipelineError, match="llama.cpp tool llama-quantize is missing"):
        tc.tool("llama-quantize")
    with pytest.raises(ValueError, match="not a helper"):
        tc.helper("llama-quantize")
