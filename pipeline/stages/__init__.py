"""The stages of the build, one entry function each, each declared once beside it (:class:`pipeline.stagedef.Stage`):
fetch, convert, awq, imatrix, quantize, evaluate (eval-base, eval), bench, conformance, draft (vocab, acceptance,
agreement), mix (sensitivity, solve), device slice, split, publish and gate. :func:`registry` collects the
declarations from the modules of this package: a new stage module is found without being listed anywhere."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from pathlib import Path

from pipeline.stagedef import Stage


@cache
def registry() -> dict[str, Stage]:
    """Every declared stage by rule name, in build order (:attr:`Stage.order`)."""
    found: dict[str, Stage] = {}
    for mod in pkgutil.walk_packages(__path__, __name__ + "."):
        # only the modules that declare a stage: the others (numpy's readers, say) stay unloaded in the Snakefile
        spec = mod.module_finder.find_spec(mod.name.rpartition(".")[2])
        if mod.ispkg or "Stage(" not in Path(spec.origin).read_text():
            continue
        for value in vars(importlib.import_module(mod.name)).values():
            if isinstance(value, Stage):
                other = found.setdefault(value.rule, value)
                if other is not value:
                    raise ValueError(f"{mod.name}: stage {value.rule!r} is declared twice")
    clis = [st.cli for st in found.values()]
    if len(set(clis)) != len(clis):
        raise ValueError(f"two stages share a command name: {sorted(clis)}")
    return dict(sorted(found.items(), key=lambda kv: kv[1].order))
