"""Seeded fuzzing of the commands' one-line contract (issue #50 item 6): generators that mutate a valid input (JSON,
YAML, GGUF, command-line flags) and a runner that feeds each to ``pipeline.cli.main`` in this process and judges the
outcome. Used by tests/unit/test_fuzz_commands.py (the commands that run without llama.cpp tools) and
tests/integration/test_fuzz_commands_tools.py (validate, plan, init, rebuild-check: they look the tools up).

The contract, for every input (:func:`problems`):

- exit status 0 (success: no ``error:`` line), 1 (one line ``error: ...``: the command refused the input) or 2
  (argparse's usage error: ``usage:`` lines, then one line ``ggufpipe <cmd>: error: ...``); the form of the line
  matches the status; an input a case marks as bad never exits 0;
- no traceback, at most one ``error:`` line on stderr and none on stdout, no line over :data:`MAX_LINE` characters;
- on a failure nothing under the case's root changed (every file's size, mtime and inode, every link's target, no
  file added or removed; folders' own mtimes are not compared: a temporary file made and removed again is allowed);
- at most :data:`SECONDS` per input: a SIGALRM interrupts a command that blocks (a FIFO opened for reading) or
  loops, and the input is reported as hung.

Every generator takes a ``random.Random``: the same seed gives the same inputs, so a failure is reproduced by its
case label alone (``rerun(case)``)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import shutil
import signal
import stat
import struct
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

SECONDS = 4.0  # per input: the commands take milliseconds, the box is a loaded 2-core one
MAX_LINE = 4096  # an error line echoing a megabyte of input is one line, but not a readable one
ERROR_LINE = re.compile(r"^(?:ggufpipe(?: [a-z-]+)?: )?error: ")
USAGE_LINE = re.compile(r"^ggufpipe(?: [a-z-]+)?: error: ")
DECOY = "outside/decoy.txt"  # a file outside the case's folder that `..` paths aim at

# ------------------------------------------------------------------ values


class Raw(str):
    """JSON text inserted as is (a number JSON cannot spell in Python, nesting deeper than the encoder recurses)."""


NAN, INF = float("nan"), float("inf")
HUGE_STRING = "A" * 300_000
WRONG_VALUES: tuple = (
    None, True, False, 0, -1, 1.5, -0.0, 10**18, 2**64, -(2**63) - 1, NAN, INF, -INF, "", "x", "../../" + DECOY,
    "/etc/passwd", "\u202egguf.exe", "line\nbreak", "a|b <b>x</b>", [], {}, [None], {"": None}, [[[]]],
    Raw("1e999"), Raw("-1e999"), Raw("1" + "0" * 400), Raw("[" * 100_000 + "]" * 100_000), Raw("[" * 500 + "]" * 500),
    Raw('{"a":' * 3000 + "1" + "}" * 3000),
)
# command-line values that are wrong for most flags
BAD_ARGS: tuple[str, ...] = (
    "", " ", "-1", "0", "nan", "NaN", "inf", "-inf", "1e999", "1e18", "9" * 40, "0x10", "1.5", "..", "../../" + DECOY, "/", "/dev/null", "a" * 5000, "\udcff\udcfe.gguf", "-", "--", "名前", "\t", "2147483648",
    "-2147483649", "18446744073709551616",
)


def in_range(value, lo: float, hi: float, integer: bool = False) -> bool:
    """Whether ``value`` (a generated wrong value) is a number a field of range ``lo..hi`` takes: the mutations
    that must be refused at a numeric field are the others."""
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)) or isinstance(value, Raw):
        return False
    if integer and not isinstance(value, int):
        return False
    return math.isfinite(value) and lo <= value <= hi


def key_paths(doc, prefix: tuple = ()) -> list[tuple]:
    """Every path into ``doc`` (dict keys and list indices), the root excluded."""
    out = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append((*prefix, k))
            out += key_paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.append((*prefix, i))
            out += key_paths(v, (*prefix, i))
    return out


def _copy(doc):
    return json.loads(json.dumps(doc))


def _at(doc, path: tuple):
    for p in path:
        doc = doc[p]
    return doc


def _set(doc, path: tuple, value):
    _at(doc, path[:-1])[path[-1]] = value


def _delete(doc, path: tuple):
    parent = _at(doc, path[:-1])
    del parent[path[-1]]


def _short(v) -> str:
    t = repr(v)
    return t if len(t) <= 40 else t[:37] + "..."


def dumps(doc) -> str:
    """JSON text of ``doc``, NaN and infinities as Python writes them, :class:`Raw` values and the duplicate-key
    markers of :func:`json_cases` spliced in."""
    raws: list[str] = []

    def swap(v):
        if isinstance(v, Raw):
            raws.append(str(v))
            return f"\0RAW{len(raws) - 1}\0"
        if isinstance(v, dict):
            return {(k if not isinstance(k, Raw) else swap(k)): swap(x) for k, x in v.items()}
        if isinstance(v, list):
            return [swap(x) for x in v]
        return v

    text = json.dumps(swap(doc), ensure_ascii=False)
    for i, r in enumerate(raws):
        text = text.replace(json.dumps(f"\0RAW{i}\0"), r)
    return text


@dataclass
class Mutant:
    """One generated input: ``label`` says what was done (the report's input column), ``data`` the bytes,
    ``path`` where in the document (None: the whole text), ``bad``: a correct command must refuse it."""

    label: str
    data: bytes
    path: tuple | None = None
    bad: bool = True


def _parses(data: bytes) -> bool:
    try:
        json.loads(data)
        return True
    except (ValueError, RecursionError):
        return False


def json_cases(rng: random.Random, doc, n: int, checked: Callable[[tuple, str, object], bool] = lambda p, k, v: True,
               strings: Iterable[str] = ()) -> list[Mutant]:
    """``n`` mutations of the JSON document ``doc``: a wrong value (type, NaN, infinity, huge or negative number,
    deep nesting, ``..`` path, huge string, markup) at a key path, a key deleted or given twice (the second,
    wrong, wins), the text truncated, bytes flipped, another encoding, another top-level type. ``checked(path,
    kind, value)``: whether the command must refuse that change (``kind``: set, delete or dup; ``value`` the new
    value, None for a delete) at that path; a change elsewhere may pass. ``strings``: extra wrong values."""
    paths = key_paths(doc)
    values = list(WRONG_VALUES) + list(strings) + [HUGE_STRING]
    text = dumps(doc).encode()
    out: list[Mutant] = []
    seen = {text}  # a mutation that changed nothing is no input
    kinds = ["set"] * 12 + ["delete"] * 3 + ["dup"] * 2 + ["truncate", "flip", "encoding", "top"]
    while len(out) < n:
        kind = rng.choice(kinds)
        if kind in ("set", "delete", "dup") and paths:
            path = rng.choice(paths)
            d = _copy(doc)
            if kind == "set":
                v = rng.choice(values)
                _set(d, path, v)
                out.append(Mutant(f"{'.'.join(map(str, path))} = {_short(v)}", dumps(d).encode(), path,
                                  checked(path, kind, v)))
            elif kind == "delete":
                _delete(d, path)
                out.append(Mutant(f"{'.'.join(map(str, path))} deleted", dumps(d).encode(), path,
                                  checked(path, kind, None)))
            else:
                parent = _at(d, path[:-1])
                if not isinstance(parent, dict):
                    continue
                v = rng.choice(values)
                marker = f"\0DUP\0{path[-1]}"
                parent[marker] = v
                raw = dumps(d).replace(json.dumps(marker), json.dumps(path[-1]))
                out.append(Mutant(f"{'.'.join(map(str, path))} twice, second {_short(v)}", raw.encode(), path,
                                  checked(path, kind, v)))
        elif kind == "truncate":
            cut = rng.randrange(0, len(text))
            out.append(Mutant(f"truncated to {cut} of {len(text)} bytes", text[:cut], None, not _parses(text[:cut])))
        elif kind == "flip":
            b = bytearray(text)
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            out.append(Mutant("bytes flipped", bytes(b), None, not _parses(bytes(b))))
        elif kind == "encoding":
            how = rng.choice(["utf-16", "bom", "latin-1", "nul", "invalid", "utf-32"])
            if how in ("utf-16", "utf-32"):  # json.loads(bytes) reads them: may pass
                out.append(Mutant(f"encoded {how}", dumps(doc).encode(how), None, False))
            elif how == "bom":
                out.append(Mutant("UTF-8 BOM first", b"\xef\xbb\xbf" + text, None, False))
            else:
                junk = {"latin-1": b"caf\xe9", "nul": b"\x00", "invalid": b"\xc3\x28\xff"}[how]
                i = text.rfind(b'"', 0, rng.randrange(2, len(text)))
                out.append(Mutant(f"{how} bytes in a string", text[:i + 1] + junk + text[i + 1:] if i >= 0 else junk,
                                  None, True))
        else:
            top = rng.choice([b"", b" \n", b"[]", b'"x"', b"1", b"null", b"[" + text + b"]", b"NaN",
                              b"[" * 100_000, text + b"garbage", text + b"\n" + text])
            out.append(Mutant(f"top level {top[:12]!r}{'...' if len(top) > 12 else ''}", top, None, True))
        if out[-1].data in seen:
            out.pop()
        else:
            seen.add(out[-1].data)
    return out


# ------------------------------------------------------------------ YAML

YAML_WRONG = (".nan", ".inf", "-.inf", "1e400", "-1", "0", str(10**30), "~", "[]", "{}", "yes", "''", "'..'",
              "../../" + DECOY, "/etc/passwd", "!!python/object/apply:os.system ['true']", "*undefined", "[[[[[[]]]]]]",
              "0x7fffffffffffffff", "2147483648", "1_000_000_000_000", "'\\u202e'", "@reserved", "{a: 1, a: 2}")


def yaml_cases(rng: random.Random, doc: dict, n: int, checked: Callable[[tuple, str, object], bool] = lambda p, k, v: True
               ) -> list[Mutant]:
    """``n`` mutations of the recipe mapping ``doc`` as YAML text: a wrong value (YAML spelling: ``.nan``,
    ``.inf``, a 10^30, a tag, an alias that is not defined ...) at a key path, a key deleted or repeated (as
    PyYAML would keep the last), an alias bomb, deep nesting, the text truncated, bytes flipped, a wrong encoding,
    several documents."""
    import yaml

    paths = key_paths(doc)
    out: list[Mutant] = []
    seen = {yaml.safe_dump(doc, sort_keys=False).encode()}
    kinds = ["set"] * 10 + ["delete"] * 3 + ["dup"] * 3 + ["bomb", "deep", "truncate", "flip", "encoding", "docs"]
    while len(out) < n:
        kind = rng.choice(kinds)
        if kind in ("set", "delete", "dup"):
            path = rng.choice(paths)
            d = _copy(doc)
            if kind == "delete":
                _delete(d, path)
                out.append(Mutant(f"{'.'.join(map(str, path))} deleted", yaml.safe_dump(d, sort_keys=False).encode(),
                                  path, checked(path, kind, None)))
                continue
            v = rng.choice(YAML_WRONG + (HUGE_STRING[:200_000],))
            marker = "\0MARK\0"
            if kind == "set":
                _set(d, path, marker)
            else:
                parent = _at(d, path[:-1])
                if not isinstance(parent, dict):
                    continue
                parent["\0DUPKEY\0"] = marker
            raw = yaml.safe_dump(d, sort_keys=False, width=10**9, allow_unicode=True)
            raw = raw.replace("\"\\0MARK\\0\"", v).replace("\"\\0DUPKEY\\0\"", str(path[-1]))
            what = "twice, second" if kind == "dup" else "="
            out.append(Mutant(f"{'.'.join(map(str, path))} {what} {_short(v)}", raw.encode(), path,
                              checked(path, kind, v)))
        elif kind == "bomb":
            lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
            lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
            out.append(Mutant("alias bomb (10^9 nodes)", ("\n".join(lines) + "\n" + yaml.safe_dump(doc)).encode()))
        elif kind == "deep":
            depth = rng.choice([200, 2000, 50_000])
            out.append(Mutant(f"nested {depth} deep", (yaml.safe_dump(doc) + "extra: " + "[" * depth + "]" * depth
                                                       + "\n").encode()))
        elif kind == "truncate":
            text = yaml.safe_dump(doc, sort_keys=False).encode()
            cut = rng.randrange(0, len(text))
            out.append(Mutant(f"truncated to {cut} of {len(text)} bytes", text[:cut], None, False))
        elif kind == "flip":
            b = bytearray(yaml.safe_dump(doc, sort_keys=False).encode())
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            out.append(Mutant("bytes flipped", bytes(b), None, False))
        elif kind == "encoding":
            text = yaml.safe_dump(doc, sort_keys=False)
            how = rng.choice(["utf-16", "latin-1", "nul", "tab"])
            data = {"utf-16": text.encode("utf-16"), "latin-1": text.encode() + b"# caf\xe9\n",
                    "nul": text.encode() + b"x: \x00\n", "tab": b"\t" + text.encode()}[how]
            out.append(Mutant(f"encoding: {how}", data, None, how != "utf-16"))
        else:
            text = yaml.safe_dump(doc, sort_keys=False)
            out.append(Mutant("two documents", (text + "---\n" + text).encode()))
        if out and out[-1].data in seen:
            out.pop()
        elif out:
            seen.add(out[-1].data)
    return out


# ------------------------------------------------------------------ GGUF


def gguf_cases(rng: random.Random, data: bytes, n: int) -> list[Mutant]:
    """``n`` mutations of a GGUF file: truncated, bytes flipped, a header count / length / type / dimension /
    offset set to an edge value (helpers.gguf_mutate.fields), the magic or version changed, junk appended. ``bad``:
    truncated or with another magic (any reader must refuse); a changed field or byte may still be a GGUF."""
    from helpers.gguf_mutate import fields, get_field, interesting, set_field

    flds = fields(data)
    out: list[Mutant] = []
    while len(out) < n:
        kind = rng.choice(["field"] * 5 + ["truncate", "truncate", "flip", "magic", "append"])
        if kind == "field":
            f = rng.choice(flds)
            v = rng.choice(interesting(f, get_field(data, f), len(data)))
            out.append(Mutant(f"GGUF {f.label} = {v}", set_field(data, f, v), bad=False))
        elif kind == "truncate":
            cut = rng.choice([0, 3, 4, 8, 16, 23, 24, rng.randrange(len(data)), len(data) - 1])
            out.append(Mutant(f"GGUF truncated to {cut} of {len(data)} bytes", data[:cut]))
        elif kind == "flip":
            b = bytearray(data)
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
            out.append(Mutant(f"GGUF byte {i} flipped", bytes(b), bad=False))
        elif kind == "magic":
            what = rng.choice([b"GGML", b"FUGG", b"\0\0\0\0"])
            ver = rng.choice([0, 1, 2, 4, 2**31, 2**32 - 1])
            out.append(Mutant(f"GGUF magic {what!r} version {ver}", what + struct.pack("<I", ver) + data[8:]))
        else:
            out.append(Mutant("GGUF with junk appended", data + bytes(rng.randrange(1, 64)), bad=False))
        if out[-1].data == data:
            out.pop()
    return out


# ------------------------------------------------------------------ argv


@dataclass(frozen=True)
class Flag:
    """A command's flag as the argv fuzzer treats it: ``value`` None for a switch; ``good`` a valid value;
    ``bad`` the values it must refuse (default :data:`BAD_ARGS`)."""

    name: str
    good: str | None = None
    bad: tuple[str, ...] = BAD_ARGS


def argv_cases(rng: random.Random, base: list[str], flags: list[Flag], n: int,
               positional_bad: tuple[str, ...] = BAD_ARGS) -> list[tuple[str, list[str], bool]]:
    """``n`` argument vectors (label, argv, bad) from ``base`` (the command and its valid arguments): one flag
    given a bad value (``--f V`` or ``--f=V``), a flag given twice, a value missing at the end, an unknown flag,
    a positional replaced by a bad value."""
    valued = [f for f in flags if f.good is not None]
    out = []
    while len(out) < n:
        kind = rng.choice(["value"] * 6 + ["twice", "missing", "unknown", "positional", "positional"])
        argv = list(base)
        if kind == "value" and valued:
            f = rng.choice(valued)
            v = rng.choice(f.bad)
            argv += [f"{f.name}={v}"] if rng.random() < 0.3 else [f.name, v]
            out.append((f"{f.name} {v[:40]!r}", argv, True))
        elif kind == "twice" and valued:
            f = rng.choice(valued)
            v = rng.choice(f.bad)
            argv += [f.name, f.good, f.name, v]
            out.append((f"{f.name} {f.good!r} then {v[:40]!r}", argv, True))
        elif kind == "missing" and valued:
            f = rng.choice(valued)
            out.append((f"{f.name} without a value", argv + [f.name], True))
        elif kind == "unknown":
            bad = rng.choice(["--bogus", "--bogus=1", "-Z", "---", "--" + "x" * 300])
            out.append((f"unknown flag {bad[:20]!r}", argv + [bad], True))
        elif kind == "positional":
            pos = [i for i, a in enumerate(argv[1:], 1) if not a.startswith("-") and not argv[i - 1].startswith("--")]
            if not pos:
                continue
            i = rng.choice(pos)
            v = rng.choice(positional_bad)
            argv[i] = v
            out.append((f"argument {i} {v[:40]!r}", argv, True))
    return out


# ------------------------------------------------------------------ running one input


class Hung(BaseException):
    """Raised by SIGALRM inside a command that ran over its time (not an Exception: no ``except`` swallows it)."""


@dataclass
class Outcome:
    code: int | None
    out: str
    err: str
    seconds: float
    crash: str | None = None  # the traceback, or "hung ..."
    changed: list[str] = field(default_factory=list)


def tree(root: Path) -> dict[str, tuple]:
    """Every entry under ``root``: files by (size, mtime, inode), links by target, folders by existence."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def diff(before: dict, after: dict) -> list[str]:
    out = [f"{k} removed" for k in before if k not in after]
    out += [f"{k} added" for k in after if k not in before]
    out += [f"{k} changed" for k in before if k in after and before[k] != after[k]]
    return sorted(out)


def _alarm(signum, frame):
    raise Hung()


def run_main(argv: list[str], cwd: Path, root: Path, limit: float = SECONDS) -> Outcome:
    """``pipeline.cli.main(argv)`` in ``cwd``, stdout a strict UTF-8 stream as a terminal's (stderr
    backslash-escaping, as Python's own), interrupted after ``limit`` seconds; ``root``'s tree compared."""
    from pipeline.cli import main

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
    before = tree(root)
    old_cwd = os.getcwd()
    previous = signal.signal(signal.SIGALRM, _alarm)
    code, crash = None, None
    t0 = time.monotonic()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            signal.setitimer(signal.ITIMER_REAL, limit)
            try:
                code = main(list(argv))
            except SystemExit as exc:
                if isinstance(exc.code, str):  # as Python prints it
                    err.write(exc.code + "\n")
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Hung:
                crash = f"hung: over {limit:.0f} s"
            except BaseException:  # noqa: BLE001  what escaped main is the finding
                crash = traceback.format_exc()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
        os.chdir(old_cwd)
    seconds = time.monotonic() - t0

    def text(stream) -> str:
        stream.flush()
        return stream.buffer.getvalue().decode("utf-8", "backslashreplace")

    return Outcome(code, text(out), text(err), seconds, crash, diff(before, tree(root)))


def problems(o: Outcome, bad: bool, limit: float = SECONDS, may_write: bool = False) -> list[str]:
    """What breaks the contract (module docstring) in outcome ``o`` of an input (``bad``: must be refused;
    ``may_write``: a failure may change files)."""
    p = []
    if o.crash:
        last = [ln for ln in o.crash.strip().splitlines() if ln.strip()]
        p.append(f"traceback: {last[-1][:200] if last else o.crash}" if not o.crash.startswith("hung") else o.crash)
        return p
    errs = [ln for ln in o.err.splitlines() if ERROR_LINE.match(ln)]
    if "Traceback (most recent call last)" in o.err + o.out:
        p.append("traceback printed")
    if any(ERROR_LINE.match(ln) for ln in o.out.splitlines()):
        p.append("error line on stdout: " + next(ln for ln in o.out.splitlines() if ERROR_LINE.match(ln))[:160])
    if o.code == 0:
        if bad:
            p.append("exit 0 for a bad input: " + (o.out.strip().splitlines() or [""])[-1][:160])
        if errs:
            p.append("exit 0 with an error line")
    elif o.code == 1:
        lines = [ln for ln in o.err.splitlines() if ln.strip()]
        if len(errs) != 1 or len(lines) != 1:
            p.append(f"exit 1 with {len(errs)} error line(s) in {len(lines)} line(s) of stderr: {o.err[:200]!r}")
        elif USAGE_LINE.match(errs[0]):
            p.append("exit 1 with a usage error line")
    elif o.code == 2:
        if len(errs) != 1 or not USAGE_LINE.match(errs[0]):
            p.append(f"exit 2 without one usage error line: {o.err[-200:]!r}")
    else:
        p.append(f"exit status {o.code!r}")
    if any(len(ln) > MAX_LINE for ln in o.err.splitlines()):
        p.append(f"an error line of {max(len(ln) for ln in o.err.splitlines())} characters")
    if o.code != 0 and o.changed and not may_write:
        p.append(f"wrote on failure: {', '.join(o.changed[:3])}")
    if o.seconds > limit:
        p.append(f"slow: {o.seconds:.1f} s")
    return p


# ------------------------------------------------------------------ a command's run


@dataclass
class Case:
    """One input of a command: ``argv``; ``files``: paths (relative to the case folder) written before the run
    (bytes; None: a FIFO); ``setup(case folder, root)``: any other change made before the run (links, folders);
    ``bad``: must be refused; ``limit``: its time bound."""

    label: str
    argv: list[str]
    files: dict[str, bytes | None] = field(default_factory=dict)
    bad: bool = True
    limit: float = SECONDS
    setup: Callable[[Path, Path], None] | None = None
    allow_write: Callable[[Outcome], bool] | None = None  # a failure that may write (a documented side effect)


@dataclass
class Report:
    command: str
    inputs: int = 0
    seconds: float = 0.0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (input, problem)
    exits: dict = field(default_factory=dict)

    def text(self, limit: int = 40) -> str:
        by_problem: dict[str, list[str]] = {}
        for label, prob in self.failures:
            key = re.sub(r"\d+", "N", prob)[:120]
            by_problem.setdefault(key, []).append(f"{label} -> {prob}")
        lines = [f"{self.command}: {len(self.failures)} of {self.inputs} inputs broke the contract "
                 f"({self.seconds:.1f} s; exits {dict(sorted(self.exits.items(), key=str))})"]
        for items in sorted(by_problem.values(), key=len, reverse=True)[:limit]:
            lines.append(f"  [{len(items)}x] {items[0][:300]}")
        return "\n".join(lines)


class Sandbox:
    """A case folder made fresh from ``seed`` (a function filling a folder) whenever a run changed it, inside
    ``root`` (which also holds :data:`DECOY`, the target of ``..`` paths)."""

    def __init__(self, root: Path, seed: Callable[[Path], None]):
        self.root, self.seed = root, seed
        (root / DECOY).parent.mkdir(parents=True, exist_ok=True)
        (root / DECOY).write_text("outside the case folder: never read as input, never written\n")
        self.pristine = root / "pristine"
        seed(self.pristine)
        self.case = root / "case"
        self._fresh()

    def _fresh(self):
        if self.case.exists() or self.case.is_symlink():
            shutil.rmtree(self.case)
        shutil.copytree(self.pristine, self.case, symlinks=True)
        self.state = tree(self.case)

    def run(self, case: Case) -> Outcome:
        for rel, data in case.files.items():
            p = self.case / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if p.exists() or p.is_symlink():
                p.unlink()
            if data is None:
                os.mkfifo(p)
            else:
                p.write_bytes(data)
        if case.setup:
            case.setup(self.case, self.root)
        o = run_main(case.argv, self.case, self.root, case.limit)
        if case.setup:  # what it moved outside the case folder
            for p in (self.root / DECOY).parent.iterdir():
                if p.name != Path(DECOY).name:
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        if case.files or case.setup or o.changed or tree(self.case) != self.state:
            self._fresh()
        return o


def run_cases(command: str, box: Sandbox, cases: list[Case]) -> Report:
    rep = Report(command)
    t0 = time.monotonic()
    for c in cases:
        o = box.run(c)
        rep.inputs += 1
        rep.exits[o.code] = rep.exits.get(o.code, 0) + 1
        may_write = bool(c.allow_write and c.allow_write(o))
        rep.failures += [(c.label, p) for p in problems(o, c.bad, c.limit, may_write)]
    rep.seconds = time.monotonic() - t0
    return rep
