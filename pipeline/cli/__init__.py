"""``ggufpipe``: the command line. Thin wrappers over the stage entry functions, one
module per command (``pipeline/cli/<command>.py``, each with ``register(sub)``); ``ggufpipe stage`` runs one stage
as its declaration in pipeline/stages/ says (``pipeline/cli/stage.py``).

Errors are printed as one line (``error: ...``) with exit status 1, never as a traceback; a usage error (a flag's
value out of range, an unknown flag) is argparse's ``ggufpipe <command>: error: ...`` after the usage, exit status 2.
Exit status 141 without a word when stdout is closed early (``ggufpipe verify ... | head -c0``), as for a tool that
SIGPIPE ends. docs/troubleshooting.md#the-command-line.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import json
import os
import select
import sys
from pathlib import Path

from pipeline.errors import PipelineError

ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES}
# an OSError naming a path that came from the command line or an input file: the path's fault, not the pipeline's
PATH_ERRNOS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.ELOOP, errno.EEXIST, errno.EPERM,
               errno.ENXIO, errno.ENODEV, errno.EINVAL, errno.EFBIG, errno.ENOTEMPTY, errno.EXDEV, errno.ETXTBSY}
SIGPIPE_STATUS = 128 + 13  # what a shell reports for a process that SIGPIPE ended
LINE_MAX = 2000  # an error line quoting a huge input is cut in the middle, to stay one readable line
# the commands in --help order, one module each
COMMANDS = ("install_tools", "setup_demo", "validate", "build", "clean_logits", "dvc_matrix", "dvc_link", "ci",
            "rebuild_check", "info", "verify", "device_check", "fit", "plan", "init", "hub_publish", "stage")


# a command's name -> its module (device_check's module registers `collect` too)
MODULE_OF = {**{name.replace("_", "-"): name for name in COMMANDS}, "collect": "device_check"}


def one_line(text: str, limit: int = LINE_MAX) -> str:
    """``text`` as one line of at most ``limit`` characters: a huge quoted input is cut in the middle, so that both
    the file and field (first) and what is wrong (last) stay."""
    text = " ".join(str(text).split("\n"))
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3 - 40
    return f"{text[:head]} … ({len(text) - head - tail} characters cut) … {text[-tail:]}"


class _Parser(argparse.ArgumentParser):
    """argparse's usage error (exit status 2), its line kept short: a flag's value is quoted in it."""

    def error(self, message):
        super().error(one_line(message, LINE_MAX - len(self.prog) - 10))

    def _get_values(self, action, arg_strings):
        # `--flag=--`: argparse drops the `--` and gives the flag an empty list (CPython 3.11-3.12)
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings)}: expected one argument")
        return super()._get_values(action, arg_strings)


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader is gone (``| head`` exited): poll reports an error on its end."""
    try:
        fd = sys.stdout.fileno()
        p = select.poll()
        p.register(fd, select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0))
    except (OSError, ValueError, AttributeError):  # not a real file (a test's stream), no poll
        return False


def _stdout_to_devnull() -> None:
    """What is still buffered for a closed stdout goes nowhere: Python's own flush at exit would fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _flush() -> bool:
    """Flush stdout; False when its reader is gone (then it points at /dev/null)."""
    try:
        sys.stdout.flush()
        return True
    except BrokenPipeError:
        if not _stdout_closed():
            raise
    _stdout_to_devnull()
    return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # a file name that is not UTF-8 (a surrogate-escaped argv) is printed escaped, never as an encoding error
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(errors="backslashreplace")
    ap = _Parser(prog="ggufpipe", description="Model-preparation build pipeline for llama.cpp")
    sub = ap.add_subparsers(dest="cmd", required=True)
    # Only the module of the command being run is loaded: every Snakemake job is a fresh `ggufpipe stage` process.
    command = next((a for a in argv if not a.startswith("-")), None)
    for name in [MODULE_OF[command]] if command in MODULE_OF else COMMANDS:
        importlib.import_module(f"pipeline.cli.{name}").register(sub)

    args = ap.parse_args(argv)
    try:
        args.func(args)
        if not _flush():  # here, not at exit: a closed stdout is the command's to report
            return SIGPIPE_STATUS
    except BrokenPipeError:
        if not _stdout_closed():  # another pipe than stdout: not the reader's choice
            raise
        _stdout_to_devnull()
        return SIGPIPE_STATUS  # like a tool that SIGPIPE ends: no message (the reader asked for no more)
    except PipelineError as exc:
        return _fail(args, str(exc))
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except RecursionError:
        # nesting too deep for a reader (JSON, YAML): the input's fault. The readers name the file; this is the
        # line for one that does not
        return _fail(args, f"{args.cmd}: an input is nested too deeply to read (RecursionError)")
    except OSError as exc:
        if exc.errno not in ENVIRONMENT_ERRNOS and not (exc.filename and exc.errno in PATH_ERRNOS):
            _note_failure(args, f"{type(exc).__name__}: {exc}")
            raise
        # the machine (a full disk, a read-only or forbidden folder) or a path given (missing, a folder, too long),
        # not the pipeline. One line, no traceback.
        msg = f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc.strerror or exc)
        return _fail(args, msg)
    except SystemExit:  # build, ci, rebuild-check: their own status
        _flush()
        raise
    except Exception as exc:
        _note_failure(args, f"{type(exc).__name__}: {exc}")
        raise
    return 0


def _fail(args, message: str) -> int:
    _note_failure(args, message)
    _flush()
    print(f"error: {one_line(message)}", file=sys.stderr)
    return 1


def _note_failure(args, message: str) -> None:
    """A failing stage tells `ggufpipe ci` what failed (only when it runs under it): one JSON line into
    ``$GGUFPIPE_CI_ERRORS`` (pipeline/distribution/ci_summary.py ``read_errors``)."""
    dest = os.environ.get("GGUFPIPE_CI_ERRORS")
    if not dest or args.cmd != "stage":
        return
    rec = {k: getattr(args, k, None) for k in ("name", "recipe", "stage", "quant", "draft_quant", "eval_set")}
    rec["name"] = rec["name"] or Path(str(rec["recipe"])).stem
    rec["message"] = " ".join(str(message).split())
    try:
        with open(dest, "a", encoding="utf-8") as fh:  # one short append per failing job
            fh.write(json.dumps(rec) + "\n")
    except OSError:
        pass  # the error line still reaches Snakemake's output


