"""``ggufpipe clean-logits``: the base logits of finished builds emptied to 0-byte stubs, in place.

Every target is checked before the first is changed, and only a regular file of its own inside the work folder is
emptied: a link (or a hard link) would empty a file elsewhere. An eval that needs emptied logits recomputes them
first (:func:`pipeline.stages.evaluate.restore_base_logits`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pipeline.errors import PipelineError


def clean_logits(work: str | Path, names: list[str] | None = None, dry_run: bool = False) -> list[tuple[Path, int]]:
    """Empty the base logits (``<work>/<name>/eval/<set>/base.logits``), the largest intermediates, to
    0-byte stubs that keep their mtime; return (path, bytes freed) of each. Snakemake sees no change
    (nothing re-runs); an eval that needs them later (a quant added) recomputes them first, once
    (:func:`pipeline.stages.evaluate.restore_base_logits`). Deleting them instead would make Snakemake re-run
    eval-base and then every eval of the set. Refused while a Snakemake run holds the project's lock."""
    work = Path(work)
    locks = work.resolve().parent / ".snakemake" / "locks"
    if locks.is_dir() and any(locks.iterdir()):
        raise PipelineError(f"{locks} is not empty: a Snakemake run is using {work}; clean the logits after it ends "
                            "(or `snakemake --unlock` if a run was killed)")
    found = sorted(work.glob("*/eval/*/base.logits"))
    if names:
        found = [p for p in found if p.parts[-4] in set(names)]
    root = work.resolve()
    targets = [(p, _logits_target(p, root)) for p in found]  # every one checked before the first is emptied
    out = []
    for p, st in targets:
        if st.st_size == 0:
            continue
        if not dry_run:
            _empty_in_place(p, st)
        out.append((p, st.st_size))
    return out


def _logits_target(path: Path, root: Path) -> os.stat_result:
    """The stat of a base logits file that clean-logits may empty: a regular file of its own inside ``root``; one
    line naming it otherwise (emptying through a link would empty a file elsewhere)."""
    try:
        st = os.lstat(path)
        real = path.resolve()
    except OSError as exc:
        raise PipelineError(f"{path}: cannot read it: {exc.strerror or exc}; nothing was emptied") from None
    if stat.S_ISLNK(st.st_mode):
        raise PipelineError(f"{path}: is a symlink to {real}: clean-logits empties only files of its own; replace "
                            "the link by a copy or remove it; nothing was emptied")
    if stat.S_ISDIR(st.st_mode):
        raise PipelineError(f"{path}: is a folder, not a base logits file: move it away; nothing was emptied")
    if not stat.S_ISREG(st.st_mode):
        raise PipelineError(f"{path}: is not a regular file (a FIFO, socket or device): move it away; "
                            "nothing was emptied")
    if not real.is_relative_to(root):
        raise PipelineError(f"{path}: resolves to {real}, outside {root} (a symlinked folder on the way): "
                            "nothing was emptied")
    if st.st_nlink > 1:
        raise PipelineError(f"{path}: has {st.st_nlink} hard links: emptying it would empty the other names too "
                            "(a copy made with `cp -l`?); give it a copy of its own; nothing was emptied")
    return st


def _empty_in_place(path: Path, st: os.stat_result) -> None:
    """Truncate ``path`` to 0 bytes, keeping its times, only if it is still the file that was checked: O_NOFOLLOW
    refuses a link swapped in since, the inode check a swapped folder on the way or a hard link."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise PipelineError(f"{path}: cannot open it to empty it: {exc.strerror or exc} (replaced by a link since "
                            "it was checked?)") from None
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(now.st_mode) or now.st_nlink > 1:
            raise PipelineError(f"{path}: was replaced since it was checked: not emptied")
        os.ftruncate(fd, 0)
        os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
    except OSError as exc:
        raise PipelineError(f"{path}: cannot empty it: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
