"""One exception type for every user-facing failure.

A ``PipelineError`` carries one line that names what is wrong (file, field or tool) and, where
possible, what to do. The CLI prints it without a traceback; Snakemake shows it in the job log.
"""


class PipelineError(Exception):
    """A failure the user can act on; ``str()`` is a single readable line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split("\n")).strip())
