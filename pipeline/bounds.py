"""Numbers from outside (a recipe, a manifest, a device-check result, a command-line flag): finite and in range, each
range declared once and checked here. Standard library only (``ggufpipe verify`` on a device imports it).

A comparison with NaN is false, so ``value > limit`` lets a NaN threshold or a NaN metric through; every number that
decides something is checked by :meth:`Range.problem` before it is compared. The upper bounds are llama.cpp's own
where it has one (the pinned tree, b11312).
"""

from __future__ import annotations

import argparse
import math

# llama.cpp's int32 parameters: n_ctx, n_chunks, n_predict (common/common.h:451-456), llama_token (include/llama.h:69)
INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1  # the sampling seed (common/common.h:227)
LLAMA_MAX_SEQ = 256  # sequences, llama-server's -np slots: src/llama-cparams.h:8, refused above it at llama-context.cpp:101
LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h:11
LLAMA_MAX_EXPERTS = 1024  # src/llama-hparams.h:12
GGML_MAX_N_THREADS = 512  # ggml/include/ggml.h:225
SIZE_MAX = 2**63 - 1  # a byte count: st_size is a signed 64-bit off_t


class Range:
    """The values a number may take: finite (a float NaN or infinity never is), ``lo`` to ``hi`` (each end closed
    unless ``lo_open`` / ``hi_open``), an integer when ``integer``; ``note`` says where a bound comes from, in the
    error line."""

    __slots__ = ("lo", "hi", "integer", "lo_open", "hi_open", "note")

    def __init__(self, lo: float, hi: float, *, integer: bool = False, lo_open: bool = False, hi_open: bool = False,
                 note: str = ""):
        self.lo, self.hi, self.integer, self.lo_open, self.hi_open, self.note = lo, hi, integer, lo_open, hi_open, note

    def describe(self) -> str:
        """As the error line and the recipe reference say it, e.g. ``an integer 16..2147483647``."""
        what = "an integer" if self.integer else "a number"
        if not (self.lo_open or self.hi_open):
            return f"{what} {_num(self.lo)}..{_num(self.hi)}"
        lo = f"> {_num(self.lo)}" if self.lo_open else f">= {_num(self.lo)}"
        hi = f"< {_num(self.hi)}" if self.hi_open else f"<= {_num(self.hi)}"
        return f"{what} {lo} and {hi}"

    def contains(self, value) -> bool:
        return self.problem(value) is None

    def problem(self, value) -> str | None:
        """None when ``value`` is in range; else what is wrong (``must be ..., got ...``)."""
        ok_type = isinstance(value, int) if self.integer else isinstance(value, (int, float))
        bad = isinstance(value, bool) or not ok_type or (isinstance(value, float) and not math.isfinite(value))
        if not bad:
            below = value <= self.lo if self.lo_open else value < self.lo
            bad = below or (value >= self.hi if self.hi_open else value > self.hi)
        return f"must be {self.describe()}{self._note()}, got {shown(value)}" if bad else None

    def check(self, value, where: str, error=None):
        """``value`` when in range, else raise ``error(f"{where}: {problem}")`` (a PipelineError by default)."""
        msg = self.problem(value)
        if msg is not None:
            if error is None:
                from pipeline.errors import PipelineError as error
            raise error(f"{where}: {msg}")
        return value

    def arg(self, flag: str):
        """An argparse ``type=`` for ``flag``: the value parsed as an int or float and checked; argparse prints one line
        ``ggufpipe: error: argument --flag: ...`` and exits 2 otherwise."""

        def parse(text: str):
            try:
                value = int(text) if self.integer else float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"must be {self.describe()}{self._note()}, got {text!r}") from None
            msg = self.problem(value)
            if msg is not None:
                raise argparse.ArgumentTypeError(msg)
            return value

        parse.__name__ = self.describe()
        return parse

    def _note(self) -> str:
        return f" ({self.note})" if self.note else ""

    def __repr__(self) -> str:
        return f"Range({self.describe()})"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e18 else repr(v)


def shown(value) -> str:
    """``value`` for an error line: short, and one line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def finite(value) -> bool:
    """A real number that a comparison can decide on: an int or float, not a bool, not NaN or infinite."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def above(value, limit) -> bool:
    """``value > limit`` for a gate, failing closed: also True when either is not a finite number."""
    return not (finite(value) and finite(limit)) or value > limit


def below(value, limit) -> bool:
    """``value < limit`` for a gate, failing closed: also True when either is not a finite number."""
    return not (finite(value) and finite(limit)) or value < limit


def cores_arg(text: str) -> str:
    """An argparse ``type=`` for a ``--cores`` that Snakemake gets: ``all`` or a count of cores (:data:`CORES`)."""
    if text == "all":
        return text
    if text.isascii() and text.isdigit() and CORES.contains(int(text)):
        return str(int(text))
    raise argparse.ArgumentTypeError(f"must be 'all' or {CORES.describe()}, got {text!r}")


def integer(lo: int, hi: int, note: str = "") -> Range:
    return Range(lo, hi, integer=True, note=note)


# Ranges shared by several inputs (recipe fields, flags, result fields)
CTX = integer(16, INT32_MAX, "llama.cpp's n_ctx is an int32")
CHUNKS = integer(1, INT32_MAX, "llama.cpp's n_chunks is an int32")
THREADS = integer(1, GGML_MAX_N_THREADS, "ggml's GGML_MAX_N_THREADS")
PARALLEL = integer(1, LLAMA_MAX_SEQ, "llama-server -np; llama.cpp's LLAMA_MAX_SEQ")
FRACTION = Range(0, 1)
CORES = integer(1, 1 << 16, "cores")
BYTES = integer(0, SIZE_MAX)
COUNT = integer(0, SIZE_MAX)

# A device-check result's numbers (pipeline/stages/device_results.py) and the slice values they are judged against;
# llama.cpp bounds none but the build number: the other upper ends only keep an absurd value from a comparison
KLD_MEAN = Range(0, 1e6, note="a mean KL divergence, in nats")
PPL = Range(1, 1e30, note="a perplexity")
RATE = Range(0, 1e7, lo_open=True, note="tokens per second")
LLAMA_BUILD = integer(0, INT32_MAX, "llama.cpp's LLAMA_BUILD_NUMBER is an int (common/build-info.cpp.in)")
