"""``ggufpipe``: the command line. Thin wrappers over the stage entry functions, one
module per command (``pipeline/cli/<command>.py``, each with ``register(sub)``); ``ggufpipe stage`` runs one stage
as its declaration in pipeline/stages/ says (``pipeline/cli/stage.py``).

Errors are printed as one line (``error: ...``) with exit status 1, never as a traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import sys
from pathlib import Path

from pipeline.errors import PipelineError

ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES}
# the commands in --help order, one module each
COMMANDS = ("install_tools", "setup_demo", "validate", "build", "clean_logits", "dvc_matrix", "dvc_link", "ci",
            "rebuild_check", "info", "verify", "device_check", "fit", "plan", "init", "hub_publish", "stage")


# a command's name -> its module (device_check's module registers `collect` too)
MODULE_OF = {**{name.replace("_", "-"): name for name in COMMANDS}, "collect": "device_check"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="ggufpipe", description="Model-preparation build pipeline for llama.cpp")
    sub = ap.add_subparsers(dest="cmd", required=True)
    # Only the module of the command being run is loaded: every Snakemake job is a fresh `ggufpipe stage` process.
    command = next((a for a in argv if not a.startswith("-")), None)
    for name in [MODULE_OF[command]] if command in MODULE_OF else COMMANDS:
        importlib.import_module(f"pipeline.cli.{name}").register(sub)

    args = ap.parse_args(argv)
    try:
        args.func(args)
    except PipelineError as exc:
        _note_failure(args, str(exc))
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        if exc.errno not in ENVIRONMENT_ERRNOS:
            _note_failure(args, f"{type(exc).__name__}: {exc}")
            raise
        # the machine, not the pipeline: a full disk, a read-only or forbidden folder. One line, no traceback.
        msg = f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc.strerror or exc)
        _note_failure(args, msg)
        print(f"error: {msg}", file=sys.stderr)
        return 1
    except Exception as exc:
        _note_failure(args, f"{type(exc).__name__}: {exc}")
        raise
    return 0


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


