"""The user-facing failures: ``PipelineError`` and the few kinds that carry fields.

Every failure the user can act on is a ``PipelineError``; ``str()`` is one line that names what is wrong (file,
field or tool) and, where possible, what to do. The CLI prints it as ``error: <line>`` without a traceback
(pipeline/cli/__init__.py); Snakemake shows it in the job log. Code that only reports a failure catches
``PipelineError``; code (and tests) that needs to know *what* failed catches a subclass and reads its fields:

- :class:`RecipeError` (``path``, ``field``, ``message``): a recipe is wrong, at a field;
- :class:`ToolError` (``tool``, ``returncode``, ``log``): a run of a llama.cpp tool or helper failed;
- :class:`GateFailure` (``checks``, ``published``): the build's gate failed, naming each failed check;
- :class:`ArtifactError` (``path``): a file of a build is missing or differs from its manifest or stage record.

A failed conformance check raises nothing of its own: the stage records it and the gate fails with it, a
``GateFailure`` check named ``conformance``. The rest (toolchain, hub, arguments...) stay plain ``PipelineError``.
The line of a subclass is the line a plain ``PipelineError`` gave before the subclasses existed: fields are added,
the text is unchanged.
"""

from __future__ import annotations

from pathlib import Path


def _one_line(text) -> str:
    return " ".join(str(text).split("\n")).strip()


class PipelineError(Exception):
    """A failure the user can act on; ``str()`` is a single readable line."""

    def __init__(self, message: str):
        super().__init__(_one_line(message))


class RecipeError(PipelineError):
    """A recipe is wrong: ``path`` (the recipe file, as given), ``field`` (where in it: a key path such as
    ``quants[0].type`` or ``draft.pairs[1]``, ``line N`` for malformed YAML, ``None`` when the file as a whole is
    unreadable) and ``message`` (what is wrong there). ``str()``: ``<path>: <field>: <message>``, or
    ``<path>: <message>`` without a field."""

    def __init__(self, path: str | Path, field: str | None, message: str):
        # only the end is stripped: the line is the one PipelineError(f"{path}: {field}: {message}") gave
        self.path, self.field, self.message = path, field, " ".join(str(message).split("\n")).rstrip()
        super().__init__(f"{path}: {field}: {self.message}" if field is not None else f"{path}: {self.message}")

    def __reduce__(self):
        return type(self), (self.path, self.field, self.message)


class ToolError(PipelineError):
    """A run of a llama.cpp tool (or converter, helper, server) failed: ``tool`` (its name, e.g. ``llama-quantize``),
    ``returncode`` (its exit status; ``None`` when it could not start or ran over its time; 0 when it exited cleanly
    but printed an error or left no result), ``log`` (the log holding its output, a ``Path``, or ``None``). ``str()`` is
    ``message``, the whole line (it names the tool and quotes the end of its output)."""

    def __init__(self, tool: str, returncode: int | None, log: str | Path | None, message: str):
        self.tool, self.returncode, self.log = tool, returncode, Path(log) if log is not None else None
        super().__init__(message)

    def __reduce__(self):
        return type(self), (self.tool, self.returncode, self.log, str(self))


class GateFailure(PipelineError):
    """The gate of a build failed (pipeline/stages/publish.py ``check_gates``): ``checks`` holds each failed check
    of the manifest (a dict with ``check``, e.g. ``max_kld_mean``, ``conformance``, ``device``, and ``message``;
    ``file`` for a rejected quant's), ``published`` counts the quants published all the same. ``str()``: each
    distinct message once, joined by ``; ``, then ``(<published> quant(s) published)``."""

    def __init__(self, checks, published: int):
        self.checks, self.published = tuple(checks), published
        super().__init__("; ".join(self.messages) + f" ({published} quant(s) published)")

    @property
    def messages(self) -> list[str]:
        """The distinct messages of the failed checks, in order (a failed conformance rejects every file alike)."""
        return list(dict.fromkeys(c["message"] for c in self.checks))

    def __reduce__(self):
        return type(self), (self.checks, self.published)


class ArtifactError(PipelineError):
    """A file of a build (a GGUF, a shard, a mix map, the device slice, a manifest) is missing, unreadable or
    differs from what its manifest or stage record says: ``path`` is that file. ``str()`` is ``message``, the whole
    line (it starts with the file, and says how it differs)."""

    def __init__(self, path: str | Path, message: str):
        self.path = path
        super().__init__(message)

    def __reduce__(self):
        return type(self), (self.path, str(self))
