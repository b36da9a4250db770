"""Coverage-guided fuzzing of the one GGUF reader (pipeline/gguf/reader.py) with atheris (libFuzzer).

    .venv/bin/python bench/fuzz_gguf.py [--runs 1000000] [--workdir /tmp/ggufpipe-fuzz]

Seeds: the generated GGUFs of tests/helpers/gguf_mutate.py (a tiny model with an MTP block, every value and
block type with split keys, a vocab-only file) plus, where the pinned llama.cpp is installed, its vendored
``ggml-vocab-*.gguf`` files cut to ``--max-len`` bytes. Each input goes to ``parse_buffer`` (what
``read_header`` runs on a file's bytes); an input that parses is written to a file and every pipeline reader
of it runs (helpers/gguf_mutate.exercise: facts, arrays, tokenizer hash, vocab checks, MTP, split, hub,
imatrix). Anything but a one-line PipelineError naming the file is a crash: its input is saved under
``<workdir>/crashes`` and the run goes on. libFuzzer's ``-timeout=1`` makes an input slower than 1 s a crash
too, ``-rss_limit_mb`` a runaway allocation.

The fuzzing runs in a child process (libFuzzer exits when done); the parent prints inputs, seconds, crashes
and coverage: libFuzzer's edge count (``cov``) over the instrumented pipeline modules, and the lines of
pipeline/gguf/reader.py that the final corpus reaches (replayed under a line tracer). Results: bench/RESULTS.md,
"GGUF reader fuzzing"."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

FUZZ_NAME = "fuzz-input.gguf"
INSTRUMENTED = ["pipeline.gguf", "pipeline.gguf.vocab_defaults", "pipeline.stages.vocab", "pipeline.stages.split", "pipeline.stages.mtp"]


def child(args) -> None:
    import atheris

    with atheris.instrument_imports(include=INSTRUMENTED):
        from pipeline.errors import PipelineError
        from pipeline.gguf import reader

    from helpers.gguf_mutate import Crash, exercise

    work = Path(args.workdir)
    crashes = work / "crashes"
    crashes.mkdir(parents=True, exist_ok=True)
    file_path = Path("/dev/shm" if Path("/dev/shm").is_dir() else work) / f"ggufpipe-{os.getpid()}-{FUZZ_NAME}"
    stats = {"inputs": 0, "parsed": 0, "crashes": 0, "max_seconds": 0.0}
    stats_path = work / "stats.json"

    def save_crash(data: bytes, why: str) -> None:
        stats["crashes"] += 1
        digest = hashlib.sha256(data).hexdigest()[:16]
        (crashes / f"{digest}.gguf").write_bytes(data)
        (crashes / f"{digest}.txt").write_text(why + "\n")

    def one(data: bytes) -> None:
        stats["inputs"] += 1
        t0 = time.perf_counter()
        try:
            try:
                reader.parse_buffer(data, file_path)
            except PipelineError as exc:
                msg = str(exc)
                if "\n" in msg or str(file_path) not in msg:
                    save_crash(data, f"parse_buffer: message {msg!r}")
                return
            except Exception as exc:  # noqa: BLE001  the contract under test
                save_crash(data, f"parse_buffer: {type(exc).__name__}: {exc}")
                return
            stats["parsed"] += 1
            file_path.write_bytes(data)
            try:
                exercise(file_path)
            except Crash as exc:
                save_crash(data, str(exc))
        finally:
            stats["max_seconds"] = max(stats["max_seconds"], time.perf_counter() - t0)
            if stats["inputs"] % 20000 == 0:
                stats_path.write_text(json.dumps(stats))

    import atexit

    atexit.register(lambda: stats_path.write_text(json.dumps(stats)))
    atheris.Setup([sys.argv[0], *args.libfuzzer], one)
    atheris.Fuzz()


def make_seeds(folder: Path, max_len: int) -> int:
    from helpers.gguf_mutate import seed_files

    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    for p in seed_files(folder.parent / "generated").values():
        (folder / p.name).write_bytes(p.read_bytes()[:max_len])
        n += 1
    try:
        from pipeline.tools import pinned_dir

        vocab = sorted((pinned_dir() / "vocab").glob("ggml-vocab-*.gguf"))
    except Exception as exc:  # noqa: BLE001  no pinned llama.cpp here: generated seeds only
        print(f"[fuzz] no vendored vocab seeds: {exc}", flush=True)
        vocab = []
    from gguf import GGUFWriter
    from helpers.gguf_factory import read_tokenizer

    for p in vocab:  # each tokenizer's keys as llama.cpp ships them, its arrays cut to 128 elements
        tok = read_tokenizer(p)
        tok.truncate(128)
        if "merges" in tok:
            tok.set("merges", tok.get("merges")[:128])
        w = GGUFWriter(folder / p.name, "llama")
        tok.write_to(w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        w.close()
        if (folder / p.name).stat().st_size > max_len:
            (folder / p.name).unlink()
        else:
            n += 1
    return n


# _parse and its _Parser's methods (a class body itself runs at import, so its methods are named here)
PARSER_FUNCTIONS = ("parse_buffer", "_parse", "__init__", "bad", "unpack", "string", "charge", "header", "kv_section",
                    "array_value", "skip_strings", "alignment", "tensor_infos", "place_tensors", "get", "array",
                    "array_bytes", "facts")


def line_coverage(corpus: list[Path]) -> tuple[int, int]:
    """(lines reached, executable lines) of the parser in pipeline/gguf/reader.py (``parse_buffer``, ``_parse``
    and its _Parser's methods, the array decoding and facts) when every corpus input is parsed."""
    from pipeline.errors import PipelineError
    from pipeline.gguf import reader

    target = reader.__file__
    lines: set[int] = set()

    def code_lines(code, inside: bool = False) -> set[int]:
        inside = inside or code.co_name in PARSER_FUNCTIONS
        out = {ln for _, _, ln in code.co_lines() if ln is not None and ln != code.co_firstlineno} if inside else set()
        for c in code.co_consts:
            if hasattr(c, "co_lines"):
                out |= code_lines(c, inside)
        return out

    src = Path(target).read_text()
    executable = code_lines(compile(src, target, "exec"))

    def tracer(frame, event, arg):
        if frame.f_code.co_filename != target:
            return None
        if event == "line":
            lines.add(frame.f_lineno)
        return tracer

    sys.settrace(tracer)
    try:
        for p in corpus:
            data = p.read_bytes()
            try:
                h = reader.parse_buffer(data, p)
                for k in h.metadata:
                    h.get(k)
                h.facts()
            except PipelineError:
                pass
    finally:
        sys.settrace(None)
    return len(lines & executable), len(executable)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--workdir", default="/tmp/ggufpipe-fuzz")
    ap.add_argument("--max-len", type=int, default=1 << 17)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("libfuzzer", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    work = Path(args.workdir)
    corpus, seeds = work / "corpus", work / "seeds"
    corpus.mkdir(parents=True, exist_ok=True)
    n_seeds = make_seeds(seeds, args.max_len)
    (work / "stats.json").unlink(missing_ok=True)
    lf = [f"-runs={args.runs}", f"-max_len={args.max_len}", "-timeout=1", "-rss_limit_mb=4096",
          "-print_final_stats=1", str(corpus), str(seeds)]
    t0 = time.time()
    log = work / "libfuzzer.log"
    with open(log, "w") as fh:
        res = subprocess.run([sys.executable, __file__, "--child", "--workdir", str(work), "--", *lf],
                             stdout=fh, stderr=subprocess.STDOUT)
    seconds = time.time() - t0
    text = log.read_text(errors="replace")
    covs = re.findall(r"cov: (\d+) ft: (\d+)", text)
    done = re.search(r"Done (\d+) runs in (\d+) second", text)
    stats = json.loads((work / "stats.json").read_text()) if (work / "stats.json").is_file() else {}
    crash_files = sorted((work / "crashes").glob("*.txt")) if (work / "crashes").is_dir() else []
    reached, executable = line_coverage(sorted(corpus.iterdir()) + sorted(seeds.iterdir()))
    summary = {
        "inputs": int(done.group(1)) if done else stats.get("inputs"),
        "seconds": round(seconds, 1),
        "exit": res.returncode,
        "seeds": n_seeds,
        "corpus": len(list(corpus.iterdir())),
        "parsed": stats.get("parsed"),
        "crashes": len(crash_files),
        "crash_kinds": sorted({p.read_text().strip().split(":")[0] for p in crash_files}),
        "max_seconds_per_input": round(stats.get("max_seconds", 0.0), 3),
        "libfuzzer_cov_edges": int(covs[-1][0]) if covs else None,
        "libfuzzer_features": int(covs[-1][1]) if covs else None,
        "reader_lines": f"{reached}/{executable} ({100 * reached / executable:.1f}%)",
    }
    print(json.dumps(summary, indent=2))
    if res.returncode not in (0,):
        print(text[-3000:])


if __name__ == "__main__":
    main()
