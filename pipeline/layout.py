"""Where every file of a recipe lives: one place for the Snakefile and the stages.

``artifacts/<name>/`` holds what devices pull (published GGUFs, manifest, metrics, report, card);
``work/<name>/`` holds intermediates (git-ignored, not published).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.recipe import Recipe
from pipeline.recipe.mix import Flavour

# A recipe name (or a derived ``<name>-draft``): one plain path segment under artifacts/ and work/.
_FOLDER_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")  # used with fullmatch: `$` also matches before a final newline


def plain_name(name: str, what: str) -> str:
    """``name`` if it is one plain path segment (no separator, not ``.``/``..``, not hidden); else one line."""
    if not name or "/" in name or "\\" in name or name.startswith(".") or "\0" in name:
        raise PipelineError(f"{name!r} is not a plain {what} name: artifact paths never leave artifacts/<name>/")
    return name


# A quant key, eval set name or flavour given on the command line: one segment of a file name under work/<name>/
_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def recipe_name_arg(text: str) -> str:
    """An argparse ``type=`` for a recipe name on the command line (``<name>`` or ``<name>-draft``): argparse refuses
    (``error: argument --name: ...``, exit 2) anything that could leave work/ or artifacts/."""
    if not (_FOLDER_RE.fullmatch(text) and ".." not in text and len(text) <= 128):
        raise argparse.ArgumentTypeError(f"{text!r} is not a recipe name (a-z 0-9 . _ -, starting with a letter or "
                                         "digit, no '..'): paths never leave work/ and artifacts/")
    return text


def key_arg(text: str) -> str:
    """An argparse ``type=`` for a quant key, eval set name or flavour on the command line: one plain file-name part."""
    if not (_KEY_RE.fullmatch(text) and ".." not in text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a key or name (A-Z a-z 0-9 . _ -, starting with a letter or "
                                         "digit, no '..'): paths never leave work/<name>/")
    return text


@dataclass(frozen=True)
class Layout:
    artifacts: Path = Path("artifacts")
    work: Path = Path("work")

    # artifacts (published)
    def art_dir(self, name: str) -> Path:
        # recipe names are checked when loaded; this guards CLI arguments. "{name}": the Snakefile's wildcard
        if not (_FOLDER_RE.fullmatch(name) and ".." not in name) and name != "{name}":
            raise PipelineError(f"{name!r} is not a recipe name: artifact paths never leave artifacts/")
        return self.artifacts / name

    def check_art_dir(self, name: str) -> Path:
        """``artifacts/<name>/``, refusing to publish through a symlink: the folder itself must not be a link,
        and no entry in it may be a link to a folder (a split file's shard folder is written into). Links to
        files are fine: publishing replaces them, never writes through them (DVC's symlink cache makes them)."""
        art = self.art_dir(name)
        if art.is_symlink():
            raise PipelineError(f"{art}: is a symlink to {art.resolve()}: publishing would write through it, "
                                f"outside {art}/; make it a real folder (or remove it)")
        if art.is_dir():
            for p in sorted(art.iterdir()):
                if p.is_symlink() and p.is_dir():
                    raise PipelineError(f"{p}: is a symlink to the folder {p.resolve()}: publishing would write "
                                        f"through it; remove the link")
        return art

    # Every GGUF is built under work/<name>/quants/ and published (hard-linked) into artifacts/<name>/
    # under the same name by the publish stage: DVC, which tracks the published files, may re-link
    # or copy them, and that must never touch the files Snakemake judges staleness by.
    def built(self, name: str, file: str) -> Path:
        return self.wrk(name, "quants", file)

    # The ``*_at`` methods take plain strings: called with Snakemake wildcards (``"{name}"``, ``"{outtype}"``)
    # they return the patterns of the rules' outputs (the stages' declarations), with values the paths the stages write.
    def gguf(self, name: str, key: str) -> Path:
        """The whole GGUF of a model key (base ``F16``, a quant key, ``mtp-F16_MTP``): ``Recipe.file_for``."""
        return self.built(name, f"{name}-{key}.gguf")

    def base_gguf(self, r: Recipe) -> Path:
        """The F16/BF16 file the quants are made from (published as ``artifacts/<name>/<base_file>``)."""
        return self.gguf(r.name, r.base_key)

    def mtp_gguf_at(self, name: str, outtype: str) -> Path:
        return self.gguf(name, f"mtp-{outtype}_MTP")  # naming.mtp_key

    def mtp_gguf(self, r: Recipe) -> Path:
        """The MTP-head draft of ``mtp: separate``, written by the convert-mtp stage."""
        return self.mtp_gguf_at(r.name, r.base_key)

    def published(self, r: Recipe, key: str) -> Path:
        """The published file ``<name>-<KEY>.gguf``, or the folder ``<name>-<KEY>/`` of a split file."""
        return self.art_dir(r.name) / r.artifact_for(key)

    def split_dir(self, name: str, key: str) -> Path:
        """The shards of ``<name>-<KEY>.gguf`` (recipe ``split:``), written by the split stage from the
        whole file in ``quants/`` and published (hard-linked) as ``artifacts/<name>/<name>-<KEY>/``."""
        return self.wrk(name, "split", f"{name}-{key}")

    def manifest(self, name: str) -> Path:
        return self.art_dir(name) / "manifest.json"

    def metrics(self, name: str) -> Path:
        return self.art_dir(name) / "metrics.json"

    def report(self, name: str) -> Path:
        return self.art_dir(name) / "report.md"

    def plot(self, name: str) -> Path:
        return self.art_dir(name) / "report.svg"

    def card(self, name: str) -> Path:
        return self.art_dir(name) / "README.md"

    def modelfile(self, name: str, key: str) -> Path:
        """Ollama Modelfile of the model file ``<name>-<key>.gguf`` (``publish.ollama``), beside it so that
        its ``FROM ./<file>`` resolves in the folder and in the Hub repo alike."""
        return self.art_dir(name) / f"Modelfile.{key}"

    # work (intermediates)
    def wrk(self, name: str, *parts: str) -> Path:
        return self.work.joinpath(name, *parts)

    def hf(self, name: str) -> Path:
        return self.wrk(name, "hf")

    def fetch_record(self, name: str) -> Path:
        return self.wrk(name, "records", "fetch.json")

    def convert_record_at(self, name: str, outtype: str) -> Path:
        return self.wrk(name, "records", f"convert-{outtype}.json")

    def convert_record(self, r: Recipe) -> Path:
        return self.convert_record_at(r.name, r.base_key)

    # calibration: AWQ-scaled weights and importance matrices
    def hf_awq(self, name: str) -> Path:
        return self.wrk(name, "hf-awq")

    def awq_record(self, name: str) -> Path:
        return self.wrk(name, "records", "awq.json")

    def awq_gguf_at(self, name: str, outtype: str) -> Path:
        return self.wrk(name, "awq", f"{name}-{outtype}-awq.gguf")

    def awq_gguf(self, r: Recipe) -> Path:
        """The base GGUF converted from the AWQ-scaled weights (an intermediate: the published
        base file stays the unmodified model, the reference every quant is measured against)."""
        return self.awq_gguf_at(r.name, r.base_key)

    def awq_convert_record_at(self, name: str, outtype: str) -> Path:
        return self.wrk(name, "records", f"convert-{outtype}-awq.json")

    def awq_convert_record(self, r: Recipe) -> Path:
        return self.awq_convert_record_at(r.name, r.base_key)

    def source_gguf(self, r: Recipe, base: str) -> Path:
        """The base GGUF a quant of base ``plain`` or ``awq`` is made from."""
        return self.awq_gguf(r) if base == "awq" else self.base_gguf(r)

    def imatrix(self, name: str, base: str) -> Path:
        return self.wrk(name, "imatrix", f"imatrix-{base}.gguf")

    def imatrix_record(self, name: str, base: str) -> Path:
        return self.wrk(name, "records", f"imatrix-{base}.json")

    def _base_inputs(self, r: Recipe, base: str, imatrix: bool) -> dict[str, str]:
        """The base GGUF a file is made from and, with ``imatrix``, that base's importance matrix."""
        out = {"base": str(self.source_gguf(r, base))}
        if imatrix:
            out["imatrix"] = str(self.imatrix(r.name, base))
        return out

    def quant_inputs(self, r: Recipe, key: str) -> dict[str, str]:
        q = r.quant(key)
        out = self._base_inputs(r, q.base, q.imatrix)
        if q.mix:
            out["map"] = str(self.mix_map(r.name, key))
            out["layout"] = str(self.mix_layout(r.name, key))
        return out

    # measured mixes (pipeline/stages/mix/): per flavour its sensitivity, per mix its map and layout record
    def sensitivity(self, name: str, flavour: str) -> Path:
        return self.wrk(name, "mix", f"sensitivity-{flavour}.json")

    def sensitivity_record(self, name: str, flavour: str) -> Path:
        """The measurement's cost (seconds, runs): apart from the reproducible sensitivity file."""
        return self.wrk(name, "records", f"sensitivity-{flavour}.json")

    def sensitivity_dir(self, name: str, flavour: str) -> Path:
        """Scratch of the sensitivity stage: the reference logits and the cache of every measurement."""
        return self.wrk(name, "mix", flavour)

    def sensitivity_inputs(self, r: Recipe, flavour: str) -> dict[str, str]:
        f = Flavour.parse(flavour)
        out = self._base_inputs(r, f.base, f.imatrix)
        if r.sensitivity.search == "fisher":  # the checkpoint the base GGUF was converted from
            out["hf"] = str(self.hf_awq(r.name) if f.base == "awq" else self.hf(r.name))
        return {**out, "ref": str(self.base_gguf(r)), "text": str(r.sensitivity.text)}

    def mix_map(self, name: str, key: str) -> Path:
        """The solved tensor-type map, published beside the GGUF under this name."""
        return self.wrk(name, "mix", f"{name}-{key}.tensor-types.txt")

    def mix_layout(self, name: str, key: str) -> Path:
        return self.wrk(name, "mix", f"{key}.layout.json")

    def solve_inputs(self, r: Recipe, key: str) -> dict[str, str]:
        q = r.quant(key)
        return {"sensitivity": str(self.sensitivity(r.name, q.flavour)), **self._base_inputs(r, q.base, q.imatrix)}

    def mtp_record_at(self, name: str, outtype: str) -> Path:
        return self.wrk(name, "records", f"convert-mtp-{outtype}.json")

    def mtp_record(self, r: Recipe) -> Path:
        return self.mtp_record_at(r.name, r.base_key)

    def quant(self, r: Recipe, key: str) -> Path:
        return self.gguf(r.name, key)

    def quant_record(self, name: str, key: str) -> Path:
        return self.wrk(name, "records", f"quant-{key}.json")

    def base_logits(self, name: str, es: str) -> Path:
        return self.wrk(name, "eval", es, "base.logits")

    def base_record(self, name: str, es: str) -> Path:
        return self.wrk(name, "eval", es, "base.json")

    def eval_record(self, name: str, es: str, key: str) -> Path:
        return self.wrk(name, "eval", es, f"{key}.json")

    def bench_record(self, name: str, key: str) -> Path:
        return self.wrk(name, "bench", f"{key}.json")

    # the device slice (pipeline/stages/device_slice.py) and what devices measured on it (`ggufpipe collect`)
    def device_slice(self, name: str) -> Path:
        """Published as ``artifacts/<name>/device-slice.logits`` (DVC-tracked)."""
        return self.wrk(name, "device-check", "device-slice.logits")

    def device_slice_record(self, name: str) -> Path:
        return self.wrk(name, "records", "device-slice.json")

    def device_results(self, name: str) -> Path:
        """``ggufpipe collect``'s results of ``ggufpipe device-check`` runs: an input of publish, git-tracked."""
        return self.art_dir(name) / "devices.json"

    # drafts (speculative decoding)
    def main_gguf(self, r: Recipe, key: str) -> Path:
        """The file of key ``key``: the base file (key = outtype) or a quant in work/."""
        return self.base_gguf(r) if key == r.base_key else self.quant(r, key)

    def draft_gguf(self, r: Recipe, key: str, mkey: str | None = None) -> Path:
        """A draft file: the given GGUF, a quant of the derived ``<name>-draft`` recipe, or the file holding the
        MTP heads of ``draft: {mtp: true}`` (the ``mtp: separate`` export, or with ``mtp: keep`` the main file
        ``mkey`` itself)."""
        if r.draft.mtp:
            return self.mtp_gguf(r) if r.mtp == "separate" else self.main_gguf(r, mkey)
        if r.draft.gguf is not None:
            return r.draft.gguf
        return self.quant(r.draft_recipe(), key)

    def vocab_record(self, name: str, mkey: str, dkey: str) -> Path:
        return self.wrk(name, "draft", f"vocab-{mkey}--{dkey}.json")

    def spec_record(self, name: str, mkey: str, dkey: str) -> Path:
        return self.wrk(name, "draft", f"acceptance-{mkey}--{dkey}.json")

    def speedup_record(self, name: str, mkey: str, dkey: str) -> Path:
        return self.wrk(name, "draft", f"speedup-{mkey}--{dkey}.json")

    def agreement_record(self, name: str, dkey: str) -> Path:
        return self.wrk(name, "draft", f"agreement-{dkey}.json")

    def hub_record(self, name: str) -> Path:
        """Written by ``ggufpipe hub-publish`` only after the Hub commit succeeded (not an artifact)."""
        return self.wrk(name, "records", "hub-publish.json")

    def conformance_record(self, name: str) -> Path:
        return self.wrk(name, "records", "conformance.json")

    def conformance_dir(self, name: str) -> Path:
        """Scratch of the conformance stage: base logits of a recipe without eval sets (a built draft)."""
        return self.wrk(name, "conformance")

    def conformance_inputs(self, r: Recipe) -> dict[str, str]:
        """What the conformance stage reads: the base GGUF, the HF folder, the first eval set's base logits and their
        record (when the recipe has eval sets), those of the ``ctx: long`` set, the AWQ-folded folder (with ``awq:``)."""
        out = {"base": str(self.base_gguf(r)), "hf": str(self.hf(r.name))}
        if r.eval_sets:
            es = r.first_eval_set.name
            out["logits"], out["base_record"] = str(self.base_logits(r.name, es)), str(self.base_record(r.name, es))
        if r.long_eval_set:  # the logit check at one long chunk too (a long-range conversion error)
            es = r.long_eval_set.name
            out["logits_long"], out["base_record_long"] = (str(self.base_logits(r.name, es)),
                                                           str(self.base_record(r.name, es)))
        if "awq" in r.bases:
            out["awq"] = str(self.hf_awq(r.name))
        return out

    def gate_ok(self, name: str) -> Path:
        return self.wrk(name, "gate.ok")

    def log(self, name: str, stage: str) -> Path:
        return self.wrk(name, "logs", f"{stage}.log")

    # everything the publish stage reads, for the Snakefile's input lists
    def publish_inputs(self, r: Recipe) -> dict[str, list[str]]:
        keys = [q.key for q in r.quants]
        out = {
            "base": [str(self.base_gguf(r))],
            "quants": [str(self.quant(r, k)) for k in keys],
            "quant_records": [str(self.quant_record(r.name, k)) for k in keys],
            "fetch_record": [str(self.fetch_record(r.name))],
            "convert_record": [str(self.convert_record(r))],
            "awq_record": [str(self.awq_record(r.name))] if "awq" in r.bases else [],
            "imatrix_records": [str(self.imatrix_record(r.name, b)) for b in r.imatrix_bases],
            "base_records": [str(self.base_record(r.name, es.name)) for es in r.eval_sets],
            "evals": [str(self.eval_record(r.name, es.name, k)) for es in r.eval_sets for k in keys],
            "bench": [str(self.bench_record(r.name, k)) for k in [r.base_key, *keys]] if r.bench else [],
            "conformance": [str(self.conformance_record(r.name))] if r.conformance.enabled else [],
            "device_slice": [str(self.device_slice(r.name)), str(self.device_slice_record(r.name))] if r.device_slice else [],
            "device_results": [str(self.device_results(r.name))] if self.device_results(r.name).is_file() else [],
        }
        mixes = [q.key for q in r.quants if q.mix]
        if mixes:
            out["mix"] = ([str(self.mix_map(r.name, k)) for k in mixes] + [str(self.mix_layout(r.name, k)) for k in mixes]
                          + [str(p) for f in r.mix_flavours for p in (self.sensitivity(r.name, f),
                                                                      self.sensitivity_record(r.name, f))])
        if r.mtp == "separate":
            out["mtp"] = [str(self.mtp_gguf(r)), str(self.mtp_record(r))]
        split = [str(self.split_dir(r.name, k)) for k in r.model_keys if r.split_for(k)]
        if split:
            out["split"] = split
        if r.draft:
            pairs = r.draft.pairs
            out["vocab"] = [str(self.vocab_record(r.name, m, d)) for m, d in pairs]
            out["acceptance"] = [str(self.spec_record(r.name, m, d)) for m, d in pairs]
            if r.draft.speedup is not None:
                out["speedup"] = [str(self.speedup_record(r.name, m, d)) for m, d in pairs]
            if r.eval_sets and not r.draft.mtp:  # MTP heads have no logits of their own over a text
                out["agreement"] = [str(self.agreement_record(r.name, d)) for d in sorted({d for _, d in pairs})]
            if r.draft.source is not None:
                out["draft_manifest"] = [str(self.manifest(r.draft_name))]
        return out
