"""Helpers for the Snakefile: configuration, recipe lookup and file layout in one place.

Config keys (``--config key=value``, all optional):

* ``recipes``: comma-separated recipe files or folders (default ``recipes``)
* ``artifacts``: artifact root (default ``artifacts``); ``work``: intermediates (default ``work``)
* ``llama_cpp_dir``: a user's own llama.cpp build (same as the ``LLAMA_CPP_DIR`` variable)
* ``hf_hub_cache``: Hugging Face hub cache folder (default: huggingface_hub's own)
* ``quantized_by``: written into the GGUFs' ``general.quantized_by`` (default ``ggufpipe``)
* ``threads``: threads per quantize job (default 4, capped by ``--cores``)
* ``eval_threads``: threads of every llama-perplexity and llama-bench run (default 2). The eval-base and
  eval jobs cap it by ``--cores`` (so ``--cores 1`` uses one core): their base logits and statistics are
  bit-identical at 1 and 2 threads (measured, b11312 CPU; ``bench/pipeline_bench.py`` compares the
  SHA256s of a ``--cores 1`` and a ``--cores 2`` build). llama-bench, acceptance and agreement keep it fixed.
* ``calib_threads``: threads of the AWQ (CPU) and llama-imatrix runs (default 2); fixed for the same
  reason: the folded weights and the importance matrix then do not depend on ``--cores``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import PipelineError
from .layout import Layout
from .recipe import Recipe, load_recipe, load_recipes
from .tools import find_toolchain


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
                for rr in (r, r.draft_recipe()):  # a built draft is a recipe of its own: <name>-draft
                    if rr is None:
                        continue
                    if rr.name in self.recipes:
                        raise PipelineError(f"{rr.path}: name: {rr.name!r} is already used by "
                                            f"{self.recipes[rr.name].path}")
                    self.recipes[rr.name] = rr
        self.layout = Layout(Path(config.get("artifacts", "artifacts")), Path(config.get("work", "work")))
        self.threads = int(config.get("threads", 4))
        self.eval_threads = int(config.get("eval_threads", 2))
        self.calib_threads = int(config.get("calib_threads", 2))
        self.quantized_by = str(config.get("quantized_by", "ggufpipe"))
        self.hub_cache = config.get("hf_hub_cache") or os.environ.get("HF_HUB_CACHE") or ""

    # wildcard constraints: only declared names, quant keys and eval sets match
    def name_regex(self) -> str:
        return "|".join(re.escape(n) for n in sorted(self.recipes)) or "(?!)"

    def quant_regex(self) -> str:
        keys = sorted({q.key for r in self.recipes.values() for q in r.quants})
        return "|".join(re.escape(k) for k in keys) or "(?!)"

    def evalset_regex(self) -> str:
        sets = sorted({es.name for r in self.recipes.values() for es in r.eval_sets})
        return "|".join(re.escape(s) for s in sets) or "(?!)"

    def split_key_regex(self) -> str:
        """Keys of the model files some recipe splits (base, quants, MTP draft)."""
        keys = sorted({k for r in self.recipes.values() for k in r.model_keys if r.split_for(k)})
        return "|".join(re.escape(k) for k in keys) or "(?!)"

    def pair_key_regex(self) -> str:
        return self.quant_regex() + "|F16|BF16|gguf"

    def main_gguf(self, name: str, key: str) -> str:
        return str(self.layout.main_gguf(self.recipes[name], key))

    def draft_gguf(self, name: str, key: str) -> str:
        return str(self.layout.draft_gguf(self.recipes[name], key))

    def agreement_inputs(self, name: str, dkey: str) -> dict[str, str]:
        r = self.recipes[name]
        es = r.eval_sets[0].name
        return {"draft": self.draft_gguf(name, dkey), "logits": str(self.layout.base_logits(name, es)),
                "base_record": str(self.layout.base_record(name, es))}

    def draft_params(self, name: str) -> str:
        d = self.recipes[name].draft
        return repr((str(d.eval_text), d.n_max, d.prompts, d.n_predict, self.eval_threads, self.toolchain.build_number))

    def calibration_text(self, name: str, section: str) -> str:
        return str(getattr(self.recipes[name], section).calibration)

    def quant_inputs(self, name: str, key: str) -> dict[str, str]:
        return self.layout.quant_inputs(self.recipes[name], key)

    def source_gguf(self, name: str, base: str) -> str:
        return str(self.layout.source_gguf(self.recipes[name], base))

    def recipe(self, name: str) -> Recipe:
        return self.recipes[name]

    def targets(self) -> list[str]:
        return [str(self.layout.gate_ok(n)) for n in self.recipes]

    def base_file(self, name: str) -> str:
        return str(self.layout.base_gguf(self.recipes[name]))

    def publish_inputs(self, name: str) -> dict[str, list[str]]:
        return self.layout.publish_inputs(self.recipes[name])

    # params that decide whether a stage's output is stale (Snakemake's params rerun trigger)
    def fetch_params(self, name: str) -> str:
        r = self.recipes[name]
        return repr((r.source.describe(), r.source.allow_pickle, r.source.trust_remote_code))

    def convert_params(self, name: str) -> str:
        r = self.recipes[name]
        mtp = () if r.mtp == "keep" else (r.mtp,)  # keep (the default) leaves existing builds' trigger as it was
        return repr((r.outtype, r.license, *mtp, self.quantized_by, self.toolchain.build_number, self.toolchain.commit))

    def quant_params(self, name: str, key: str) -> str:
        q = self.recipes[name].quant(key)
        extra = (q.base, q.imatrix) if (q.awq or q.imatrix) else ()  # unchanged for plain quants
        return repr((q.type, q.quantize_args(), self.toolchain.build_number, self.toolchain.commit, *extra))

    def awq_params(self, name: str) -> str:
        r = self.recipes[name]
        return repr((r.awq.describe(), self.calib_threads))

    def imatrix_params(self, name: str) -> str:
        r = self.recipes[name]
        return repr((r.imatrix.describe(), self.calib_threads, self.toolchain.build_number))

    def eval_base_params(self, name: str, es: str) -> str:
        e = self.recipes[name].eval_set(es)
        return repr((str(e.text), e.ctx, e.chunks, self.eval_threads, self.toolchain.build_number))

    def split_params(self, name: str, key: str) -> str:
        s = self.recipes[name].split_for(key)
        return repr((s.args() if s else None, self.toolchain.build_number, self.toolchain.commit))

    def publish_params(self, name: str) -> str:
        return self.recipes[name].sha256  # thresholds, eval sets, bench...: any recipe change re-publishes


def mem_mb(input_mb: float, factor: float, floor: int = 512) -> int:
    return int(max(floor, input_mb * factor + floor))
