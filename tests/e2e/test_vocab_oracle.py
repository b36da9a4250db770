"""``check_pair`` against llama.cpp b11312 itself: the real ``llama-speculative-simple`` is the oracle.

Each case is a (target, draft) pair of GGUFs. Most are tiny random llama models written by
:mod:`gguf_factory` around the demo model's vocabulary (SmolLM2: GPT-2 BPE, 49152 tokens, pre ``smollm``,
add_bos false, BOS 1, EOS 2), edited one way per draft; two take the vocabulary of a vocab-only
``ggml-vocab-*.gguf`` of the pinned tree; one pairs the real demo model with a tiny draft. Two cases cover
token texts that are not UTF-8 or hold a NUL byte (llama.cpp compares them as C strings).

How llama.cpp shows its verdict (common/speculative.cpp, ``common_speculative_are_compatible``):

- compatible: speculative decoding runs and prints ``n_drafted = N``; with ``-lv 5`` it logs
  ``vocab_cmpt = 1``.
- incompatible: it logs ``the target and draft vocabs are not compatible`` and throws; the uncaught exception
  aborts the program (SIGABRT, exit status 134 in a shell) with ``what():  draft model vocab type must match
  target model to use speculation`` -- the same text whichever rule failed. Which rule failed is logged just before (a warning
  for vocab type, BOS and EOS, a debug line, shown from ``-lv 5`` on, for vocab size and token text).

llama.cpp logs from a background thread, so the abort often kills the process before those last lines are
written. Where a C compiler is available, the tool runs with a tiny ``LD_PRELOAD`` library whose ``abort()``
waits 0.3 s before raising SIGABRT, which lets the logger flush; without it the rule-level tests are skipped
when the lines were lost. The verdict tests need only the exit status and the ``what()`` line.

check_pair runs in two worker processes while llama.cpp judges the pairs in the background: check_pair reads
each GGUF with gguf's GGUFReader, which takes seconds on these vocabularies (about 2.5 s for 49k tokens and
merges, 12 s for qwen2's 152k), and that is most of this module's time.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import re
import shutil
import subprocess
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFReader
from helpers.gguf_factory import read_tokenizer, tiny_llama  # tests/ is on sys.path (pytest's rootdir conftest)

from pipeline.stages.vocab import check_pair

ROOT = Path(__file__).resolve().parent.parent
DEMO_Q8 = "smollm2-135m-Q8_0.gguf"  # in the session's demo build (conftest.demo_build)
DEMO_Q4 = "smollm2-135m-Q4_K_M.gguf"
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
CHANGED = "<|tiny_changed|>"  # a token text the demo vocab does not have
DEMO_PAIR = "demo:Q8_0-Q4_K_M"  # the real demo model's Q8_0 (target) and Q4_K_M (draft)

# model name -> (tokenizer donor, edit of its tokenizer keys, tiny_llama options). Donors: "demo" (the demo
# model) or a ggml-vocab-*.gguf name of the pinned tree. Seeds differ so that no draft is its target's copy.
MODELS: dict[str, tuple[str, Any, dict]] = {
    "main": ("demo", None, {"seed": 0}),
    "same": ("demo", None, {"seed": 1}),
    "plus128": ("demo", {"append_tokens": 128}, {"seed": 2}),
    "plus129": ("demo", {"append_tokens": 129}, {"seed": 3}),
    "text5": ("demo", {"tokens": {5: CHANGED}}, {"seed": 4}),
    "text4": ("demo", {"tokens": {4: CHANGED}}, {"seed": 5}),
    "add_bos": ("demo", {"add_bos_token": True}, {"seed": 6}),
    "main_add_eos": ("demo", {"add_eos_token": True}, {"seed": 7}),
    "add_eos_eos0": ("demo", {"add_eos_token": True, "eos_token_id": 0}, {"seed": 8}),
    "main_no_add_eos": ("demo", {"add_eos_token": None}, {"seed": 9}),
    "no_add_eos_eos0": ("demo", {"add_eos_token": None, "eos_token_id": 0}, {"seed": 10}),
    "spm": ("llama-spm", None, {"seed": 11}),
    "qwen2": ("qwen2", None, {"seed": 12, "dtype": "F16", "tie_embeddings": True}),  # 151936 tokens
    # token 6 is the byte 0xff (not UTF-8); token 5 is "<file_sep>" NUL "junk"
    "bytes6": ("demo", {"tokens": {6: "<filename>\udcff"}}, {"seed": 13}),
    "nul5": ("demo", {"tokens": {5: "<file_sep>\x00junk"}}, {"seed": 14}),
}


@dataclass(frozen=True)
class Case:
    main: str  # a MODELS name, or "demo" for the real demo model (Q8_0)
    draft: str
    compatible: bool  # llama.cpp's verdict, which check_pair must give
    rule: str | None


CASES: dict[str, Case] = {
    "identical": Case("main", "same", True, None),
    "size+128": Case("main", "plus128", True, None),
    "size+129": Case("main", "plus129", False, "vocab_size"),
    "text@5": Case("main", "text5", False, "token_text"),
    "text@4": Case("main", "text4", True, None),  # llama.cpp compares texts from id 5 on
    "add_bos": Case("main", "add_bos", False, "bos"),
    "add_eos,eos_id": Case("main_add_eos", "add_eos_eos0", False, "eos"),
    # EOS ids are compared only when the target adds EOS; tokenizer.ggml.add_eos_token absent in both
    "eos_id,no_add_eos": Case("main_no_add_eos", "no_add_eos_eos0", True, None),
    "vocab_type": Case("main", "spm", False, "vocab_type"),
    "qwen2": Case("main", "qwen2", False, "vocab_size"),
    "real_main": Case("demo", "same", True, None),
    # llama.cpp compares token texts as C strings: any bytes, up to the first NUL (gguf_get_arr_str -> c_str)
    "text@6,not_utf8": Case("main", "bytes6", False, "token_text"),
    "text@5,after_nul": Case("main", "nul5", True, None),
}


def case_params() -> list:
    return list(CASES)


# The lines of common_speculative_are_compatible that name the failed rule (SPC_WRN / SPC_DBG).
RULE_LINES = (
    ("vocab_type", re.compile(r"draft model vocab type must match target model to use speculation but")),
    ("bos", re.compile(r"draft model bos tokens must match target model")),
    ("eos", re.compile(r"draft model eos tokens must match target model")),
    ("vocab_size", re.compile(r"draft model vocab must closely match target model .* does not match draft vocab size")),
    ("token_text", re.compile(r"token (\d+) content differs")),
)
NOT_COMPATIBLE = ("the target and draft vocabs are not compatible",
                  "what():  draft model vocab type must match target model to use speculation")
FLUSH_ON_ABORT_C = r"""
#include <signal.h>
#include <unistd.h>
void abort(void) {  /* give llama.cpp's logging thread time to write the last lines, then abort */
    usleep(300000);
    signal(SIGABRT, SIG_DFL);
    raise(SIGABRT);
    _exit(134);
}
"""


@dataclass(frozen=True)
class Oracle:
    """What one llama-speculative-simple run showed."""

    returncode: int
    compatible: bool | None  # None: neither ran nor refused the pair (a failure of the harness)
    rule: str | None  # the failed rule named in the log, when the log has it
    token_id: int | None  # for token_text: the first differing id llama.cpp names
    rule_logged: bool  # llama.cpp's vocab_cmpt / rule lines reached the log
    log: str

    def tail(self, n: int = 3000) -> str:
        return f"exit {self.returncode}\n{self.log[-n:]}"


def llama_verdict(exe: Path, main: Path, draft: Path, prompt: Path, shim: Path | None) -> Oracle:
    cmd = [str(exe), "-m", str(main), "-md", str(draft), "--spec-type", "draft-simple", "-f", str(prompt),
           "-n", "8", "--spec-draft-n-max", "4", "--temp", "0", "-t", "1", "-c", "256", "-lv", "5"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_") and k != "LD_PRELOAD"}
    if shim:
        env["LD_PRELOAD"] = str(shim)
    res = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env, timeout=120)
    log = res.stdout + res.stderr
    compatible = None
    if res.returncode == 0 and re.search(r"n_drafted\s*=\s*\d+", log):
        compatible = True
    elif res.returncode != 0 and any(s in log for s in NOT_COMPATIBLE):
        compatible = False
    rule = token_id = None
    for name, pattern in RULE_LINES:
        m = pattern.search(log)
        if m:
            rule = name
            token_id = int(m.group(1)) if name == "token_text" else None
            break
    return Oracle(res.returncode, compatible, rule, token_id, "vocab_cmpt = " in log, log)


def _memoize_readers() -> None:
    """Worker initializer: each GGUF is parsed once per worker (GGUFReader takes seconds on a 49k-token
    vocab and check_pair opens both files each call). Caching the reader of an unchanged file keeps every
    result as it was."""
    from pipeline.stages import vocab

    if hasattr(vocab, "open_reader"):
        vocab.open_reader = functools.lru_cache(maxsize=None)(vocab.open_reader)


def _check_pair(main: str, draft: str) -> dict | Exception:
    try:
        return check_pair(main, draft)
    except Exception as exc:  # reported by the tests of that case
        return exc


def our_verdict(results: Results, name: str) -> dict:
    ours = results.ours[name]
    if isinstance(ours, Exception):
        raise ours
    return ours


def _flush_on_abort_shim(folder: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    src, lib = folder / "flush_on_abort.c", folder / "flush_on_abort.so"
    src.write_text(FLUSH_ON_ABORT_C)
    res = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(src)], capture_output=True)
    return lib if res.returncode == 0 else None


@dataclass
class Results:
    paths: dict[str, Path]
    ours: dict[str, dict]  # case name (or DEMO_PAIR) -> check_pair's result
    llama: dict[str, Oracle]  # case name (or DEMO_PAIR) -> what llama-speculative-simple showed
    shim: Path | None


@pytest.fixture(scope="module")
def results(toolchain, tmp_path_factory, demo_build) -> Results:
    """Writes the models, then computes check_pair (two worker processes) while llama-speculative-simple
    judges the same pairs one at a time in the background."""
    demo_q8 = demo_build / "artifacts" / "smollm2-135m" / DEMO_Q8
    demo_q4 = demo_build / "work" / "smollm2-135m" / "quants" / DEMO_Q4
    exe = toolchain.tool("llama-speculative-simple")
    folder = tmp_path_factory.mktemp("vocab-oracle")
    donors = {"demo": read_tokenizer(demo_q8)}
    for donor, _, _ in MODELS.values():
        if donor not in donors:
            donors[donor] = read_tokenizer(toolchain.root / "vocab" / f"ggml-vocab-{donor}.gguf")
    paths = {"demo": demo_q8}
    for name, (donor, edit, options) in MODELS.items():
        paths[name] = tiny_llama(folder / f"{name}.gguf", donors[donor], edit, name=name, **options)
    prompt = folder / "prompt.txt"
    prompt.write_text(PROMPT)
    shim = _flush_on_abort_shim(folder)

    pairs = {name: (paths[c.main], paths[c.draft]) for name, c in CASES.items()}
    pairs[DEMO_PAIR] = (demo_q8, demo_q4)
    order = sorted(pairs, key=lambda n: n != "qwen2")  # the 151936-token vocab first: the slowest to read
    fork = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(2, mp_context=fork, initializer=_memoize_readers) as procs, \
            ThreadPoolExecutor(1) as runner:
        ours_jobs = {n: procs.submit(_check_pair, str(pairs[n][0]), str(pairs[n][1])) for n in order}
        llama_jobs = {n: runner.submit(llama_verdict, exe, m, d, prompt, shim) for n, (m, d) in pairs.items()}
        ours = {n: job.result() for n, job in ours_jobs.items()}
        llama = {n: job.result() for n, job in llama_jobs.items()}
    return Results(paths, ours, llama, shim)


# ------------------------------------------------------------------------------------------------ the cases


@pytest.mark.parametrize("name", case_params())
def test_check_pair_verdict(name, results):
    case, ours = CASES[name], our_verdict(results, name)
    assert (ours["compatible"], ours["rule"]) == (case.compatible, case.rule), ours


@pytest.mark.parametrize("name", case_params())
def test_llama_cpp_agrees(name, results):
    ours, seen = our_verdict(results, name), results.llama[name]
    assert seen.compatible is not None, f"llama-speculative-simple neither ran nor refused the pair:\n{seen.tail()}"
    assert seen.compatible == ours["compatible"], (
        f"check_pair says compatible={ours['compatible']} (rule {ours['rule']}: {ours['reason']}), "
        f"llama.cpp says compatible={seen.compatible}:\n{seen.tail()}")
    if seen.compatible:
        assert seen.returncode == 0
    else:
        assert seen.returncode in (-6, 134), seen.tail()  # the uncaught std::runtime_error aborts (SIGABRT)


@pytest.mark.parametrize("name", case_params())
def test_llama_cpp_names_the_same_rule(name, results):
    ours, seen = our_verdict(results, name), results.llama[name]
    assert results.shim is not None or seen.rule_logged, "no C compiler for the flush-on-abort shim"
    assert seen.rule_logged, f"llama.cpp's compatibility lines are missing from the log:\n{seen.tail()}"
    assert seen.rule == ours["rule"], f"llama.cpp: {seen.rule}, check_pair: {ours['rule']}\n{seen.tail()}"
    assert ("vocab_cmpt = 1" in seen.log) == ours["compatible"]
    if seen.rule == "token_text":
        assert seen.token_id == ours["diff"][0]["id"]


def test_llama_cpp_verdicts(results):
    """llama.cpp's own verdicts are the Case's, known disagreements included."""
    seen = {name: (results.llama[name].compatible, results.llama[name].rule) for name in CASES}
    expected = {name: (case.compatible, case.rule) for name, case in CASES.items()}
    if results.shim is None:
        seen = {name: verdict[0] for name, verdict in seen.items()}
        expected = {name: verdict[0] for name, verdict in expected.items()}
    assert seen == expected


def test_compatible_pairs_speculate(results):
    for name, case in CASES.items():
        if case.compatible:
            m = re.search(r"n_drafted\s*=\s*(\d+)", results.llama[name].log)
            assert m and int(m.group(1)) > 0, f"{name}: nothing drafted\n{results.llama[name].tail()}"


def test_details_of_the_verdicts(results):
    ours = results.ours
    assert ours["identical"]["warnings"] == [] and ours["real_main"]["warnings"] == []
    assert len(ours["size+128"]["warnings"]) == 1 and "128" in ours["size+128"]["warnings"][0]
    assert [d["id"] for d in ours["text@5"]["diff"]] == [5]
    assert ours["text@5"]["diff"][0]["draft"] == CHANGED
    assert any("EOS" in w for w in ours["eos_id,no_add_eos"]["warnings"])  # a warning, not a failure
    assert ours["add_eos,eos_id"]["main"]["add_eos"] and ours["add_eos,eos_id"]["draft"]["eos_id"] == 0
    assert ours["qwen2"]["draft"]["n_tokens"] == 151936
    assert ours["vocab_type"]["draft"]["vocab_type"] == "spm"


def test_demo_quants_are_compatible(results):
    ours, seen = results.ours[DEMO_PAIR], results.llama[DEMO_PAIR]
    assert ours["compatible"] and ours["rule"] is None
    assert ours["warnings"] == []
    assert seen.compatible is True, seen.tail()


def test_factory_nextn_layers(tmp_path, toolchain):
    """gguf_factory's NextN/MTP option, as a tensor-counting caller reads it from the header."""

    path = tiny_llama(tmp_path / "mtp.gguf", toolchain.root / "vocab" / "ggml-vocab-llama-spm.gguf",
                      lambda tok: tok.truncate(512), n_layer=2, nextn_layers=2)  # 512 tokens: a fast GGUFReader
    reader = GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert (meta["general.architecture"], meta["exaone4.block_count"], meta["exaone4.nextn_predict_layers"]) == (
        "exaone4", 4, 2)
    names = [t.name for t in reader.tensors]
    assert sorted(n for n in names if ".nextn." in n) == [
        f"blk.{bid}.nextn.{kind}.weight" for bid in (2, 3) for kind in ("eh_proj", "enorm", "hnorm", "shared_head_norm")]
    assert {int(n.split(".")[1]) for n in names if n.startswith("blk.")} == {0, 1, 2, 3}
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert list(embd.shape) == [64, 512]
