"""Helpers for the Snakefile: configuration, recipe lookup and file layout in one place.

Config keys (``--config key=value``, all optional):

* ``recipes``: comma-separated recipe files or folders (default ``recipes``)
* ``artifacts``: artifact root (default ``artifacts``); ``work``: intermediates (default ``work``)
* ``llama_cpp_dir``: a user's own llama.cpp build (same as the ``LLAMA_CPP_DIR`` variable)
* ``hf_hub_cache``: Hugging Face hub cache folder (default: huggingface_hub's own)
* ``quantized_by``: written into the GGUFs' ``general.quantized_by`` (default ``ggufpipe``)
* ``threads``: threads per llama.cpp job (default 4, capped by ``--cores``)
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import PipelineError
from .recipe import Recipe, load_recipe, load_recipes
from .tools import find_toolchain


@dataclass
class Layout:
    artifacts: Path
    work: Path

    def art(self, name: str, file: str = "") -> str:
        return str(self.artifacts / name / file) if file else str(self.artifacts / name)

    def wrk(self, name: str, file: str) -> str:
        return str(self.work / name / file)


class Workflow:
    def __init__(self, config: dict):
        self.config = config
        llama_dir = config.get("llama_cpp_dir")
        if llama_dir:
            os.environ["LLAMA_CPP_DIR"] = str(llama_dir)
        self.toolchain = find_toolchain()
        exe = str(self.toolchain.tool("llama-quantize"))
        self.recipes: dict[str, Recipe] = {}
        for item in str(config.get("recipes", "recipes")).split(","):
            p = Path(item.strip())
            if not item.strip():
                continue
            found = load_recipes(p, exe) if p.is_dir() else [load_recipe(p, exe)]
            for r in found:
                if r.name in self.recipes:
                    raise PipelineError(f"{r.path}: name: {r.name!r} is already used by {self.recipes[r.name].path}")
                self.recipes[r.name] = r
        self.layout = Layout(Path(config.get("artifacts", "artifacts")), Path(config.get("work", "work")))
        self.threads = int(config.get("threads", 4))
        self.quantized_by = str(config.get("quantized_by", "ggufpipe"))
        self.hub_cache = config.get("hf_hub_cache") or os.environ.get("HF_HUB_CACHE") or ""
        self.python = shlex.quote(sys.executable)

    # wildcard constraints: only declared names and quant keys match
    def name_regex(self) -> str:
        return "|".join(re.escape(n) for n in sorted(self.recipes)) or "(?!)"

    def quant_regex(self) -> str:
        keys = sorted({q.key for r in self.recipes.values() for q in r.quants})
        return "|".join(re.escape(k) for k in keys) or "(?!)"

    def recipe(self, name: str) -> Recipe:
        return self.recipes[name]

    def targets(self) -> list[str]:
        return [self.layout.art(n, "manifest.json") for n in self.recipes]

    def base_file(self, name: str) -> str:
        return self.layout.art(name, self.recipes[name].base_file)

    def convert_record(self, name: str) -> str:
        return self.layout.wrk(name, f"records/convert-{self.recipes[name].outtype.upper()}.json")

    def quant_files(self, name: str) -> list[str]:
        r = self.recipes[name]
        return [self.layout.art(name, r.file_for(q.key)) for q in r.quants]

    def quant_records(self, name: str) -> list[str]:
        return [self.layout.wrk(name, f"records/quant-{q.key}.json") for q in self.recipes[name].quants]

    def quant_record_args(self, name: str) -> str:
        r = self.recipes[name]
        return " ".join(
            f"--quant-record {shlex.quote(q.key + '=' + self.layout.wrk(name, f'records/quant-{q.key}.json'))}"
            for q in r.quants
        )

    # params that decide whether a stage's output is stale (Snakemake's params rerun trigger)
    def fetch_params(self, name: str) -> str:
        r = self.recipes[name]
        return repr((r.source.describe(), r.source.allow_pickle, r.source.trust_remote_code))

    def convert_params(self, name: str) -> str:
        r = self.recipes[name]
        return repr((r.outtype, r.license, self.quantized_by, self.toolchain.build_number, self.toolchain.commit))

    def quant_params(self, name: str, key: str) -> str:
        return repr((self.recipes[name].quant(key).describe(), self.toolchain.build_number, self.toolchain.commit))


def mem_mb(input_mb: float, factor: float, floor: int = 512) -> int:
    return int(max(floor, input_mb * factor + floor))
