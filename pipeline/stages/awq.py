"""Stage awq: activation-aware scaling, folded into FP weights, as a clean HF folder.

Two engines (``awq.engine``, pipeline/stages/awq_llmc.py for the second): AutoAWQ 0.2.9 in its own environment, for
the architectures it supports, and llm-compressor's AWQModifier in the build environment for the rest. AutoAWQ runs
with ``export_compatible=True``: it searches per-channel scales (and, with ``apply_clip``, weight clipping ranges) on
the calibration text and folds them into the weights, without packing them to int4. Either way the result is an
ordinary HF checkpoint that llama.cpp's converter reads; llama-quantize then quantizes it like any other model. The
folder written is the source folder with its weights replaced: the source's own ``config.json`` (so no
``quantization_config: awq``), tokenizer files, chat template, generation config and model card.

Calibration runs on CUDA when torch sees a GPU, otherwise on the CPU (float32, fixed thread count
and seed, torch's deterministic algorithms), so the folded weights are bit-reproducible on one machine
(README, Calibration: Reproducibility).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from pipeline.envs import build_pins, current, env_environ, env_python
from pipeline.errors import PipelineError
from pipeline.fsutil import atomic_output, sha256_file
from pipeline.provenance import python_versions
from pipeline.recipe import Recipe
from pipeline.records import AwqRecord
from pipeline.stagedef import Stage, mem_mb
from pipeline.stages.awq_files import awq_fail, calibration_samples, copy_non_weights, save_weights
from pipeline.tools import find_toolchain

# AutoAWQ's clipping processes output channels in batches of 64 (awq/quantize/quantizer.py,
# _compute_best_clip) and skips the query/key projections.
CLIP_BATCH = 64
CLIP_SKIPPED = ("q_", "k_", "query", "key", "Wqkv")
ERROR_PREFIX = "ggufpipe-awq-error: "  # the line that carries a PipelineError out of the autoawq environment
# AutoAWQ 0.2.9's AWQ_CAUSAL_LM_MODEL_MAP (awq/models/auto.py), read here without its environment to choose the
# engine; tests/integration/test_awq.py checks it against the installed map
AUTOAWQ_MODEL_TYPES = frozenset({
    "Yi", "RefinedWeb", "RefinedWebModel", "aquila", "baichuan", "bloom", "cohere", "deepseek_v2", "deepseek_v3",
    "exaone", "falcon", "gemma", "gemma2", "gpt_bigcode", "gpt_neox", "gptj", "internlm2", "llama", "llava",
    "llava_next", "minicpm", "minicpm3", "mistral", "mixtral", "mpt", "opt", "phi3", "phi3_v", "qwen", "qwen2",
    "qwen2_5_omni", "qwen2_5_vl", "qwen2_vl", "qwen3", "qwen3_moe", "stablelm", "starcoder2"})


def import_awq():
    """Import AutoAWQ 0.2.9 with its compatibility fix-ups (all of them live here).

    AutoAWQ is archived upstream; 0.2.9 is its last release, so its bugs stay. Three fix-ups:

    1. transformers 4.57 renamed ``transformers.activations.PytorchGELUTanh`` to ``GELUTanh`` and
       AutoAWQ imports the old name at import time: the old name is restored before the import.
       (This project pins transformers 4.56.2, where the name still exists.)
    2. On the CPU its scale search corrupts the weights it keeps. ``_compute_best_scale`` snapshots
       the layer weights with ``{k: v.cpu() for k, v in state_dict().items()}`` — a copy on a GPU,
       the very same tensors on the CPU — then scales the live weights in place for the first grid
       point. The snapshot it restores after every grid point, and so the folded model, then carries
       that first point's scales in the weights but not in the norms: the model's function changes
       (on a test model, logits moved by 5%). The fix hands the search a state_dict of copies.
    3. Its ``init_quant`` catches the first layer's inputs by swapping in a ``Catcher`` module, which lacks the
       layer's attributes; transformers 4.56 reads ``decoder_layer.attention_type`` before calling each layer of a
       Qwen2, Qwen3, Gemma 2/3 or Cohere 2 model, so the run failed with an AttributeError there. The Catcher is a
       local class of ``nn.Module`` as the quantizer module names it: that name is given a subclass that forwards
       a missing attribute to the wrapped layer (an instance check against it still accepts every module).
    """
    # transformers, then awq after the fix-up: only the AWQ stage loads them (stage modules load at every start-up)
    import transformers.activations as act

    if not hasattr(act, "PytorchGELUTanh") and hasattr(act, "GELUTanh"):
        act.PytorchGELUTanh = act.GELUTanh
    import awq
    from awq.models.auto import AWQ_CAUSAL_LM_MODEL_MAP
    from awq.quantize.quantizer import AwqQuantizer

    if not getattr(AwqQuantizer, "_ggufpipe_patched", False):
        search = AwqQuantizer._compute_best_scale

        def _compute_best_scale(self, x, w_mean, x_mean, module2inspect, *args, **kwargs):
            live = module2inspect.state_dict
            module2inspect.state_dict = lambda *a, **k: {n: t.clone() for n, t in live(*a, **k).items()}
            try:
                return search(self, x, w_mean, x_mean, module2inspect, *args, **kwargs)
            finally:
                del module2inspect.state_dict

        AwqQuantizer._compute_best_scale = _compute_best_scale
        _forwarding_catcher()
        AwqQuantizer._ggufpipe_patched = True
    return awq, AWQ_CAUSAL_LM_MODEL_MAP


def _forwarding_catcher() -> None:
    """Fix-up 3 of :func:`import_awq`: awq/quantize/quantizer.py's ``nn`` with a ``Module`` whose subclasses (its
    ``Catcher``) read a missing attribute from the module they wrap."""
    # torch, awq: only the AWQ stage loads them
    import types

    import awq.quantize.quantizer as quantizer
    import torch.nn as nn

    class _AnyModule(type(nn.Module)):
        def __instancecheck__(cls, obj):  # the quantizer's isinstance(x, nn.Module) still means any module
            return isinstance(obj, nn.Module)

    class Module(nn.Module, metaclass=_AnyModule):
        def __getattr__(self, name):
            try:
                return super().__getattr__(name)
            except AttributeError:
                wrapped = self._modules.get("module")
                if wrapped is None:
                    raise
                return getattr(wrapped, name)

    quantizer.nn = types.SimpleNamespace(**{**vars(nn), "Module": Module})


@contextlib.contextmanager
def deterministic_torch(cuda: bool):
    """torch's deterministic algorithms for the scale search (warn-only: an op without a deterministic
    kernel warns in the stage log instead of failing the stage); restored afterwards. On the CPU the ops
    AutoAWQ uses are deterministic at a fixed thread count already (measured: bench/calib_determinism.py);
    this pins CUDA's (cuBLAS needs a fixed workspace for it, set before its first use)."""
    # torch: only the AWQ stage loads it
    import torch

    if cuda:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def check_shapes(recipe: Recipe, model, group_size: int, apply_clip: bool) -> None:
    """Refuse, before the hour-long search starts, the layer shapes AutoAWQ cannot handle."""
    # torch: only the AWQ stage loads it
    import torch.nn as nn

    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear) or ".layers." not in f".{name}":
            continue
        if group_size > 0 and mod.in_features % group_size:
            raise awq_fail(recipe, f"q_group_size: layer {name} has {mod.in_features} input features, not a multiple of "
                                    f"{group_size}; choose a q_group_size that divides it")
        if apply_clip and mod.out_features % CLIP_BATCH and not any(s in name for s in CLIP_SKIPPED):
            raise awq_fail(recipe, f"apply_clip: layer {name} has {mod.out_features} output features, not a multiple of "
                                    f"{CLIP_BATCH} (AutoAWQ's clipping needs that); set awq.apply_clip: false")


def _not_autoawq(recipe: Recipe, config: dict, supported) -> PipelineError:
    arch, model_type = (config.get("architectures") or ["?"])[0], config.get("model_type")
    return awq_fail(recipe, f"architecture {arch} (model_type {model_type!r}) is not supported by AutoAWQ 0.2.9 (it "
                            f"supports: {', '.join(sorted(supported))}); use engine: llmcompressor or remove the awq "
                            "section")


def choose_engine(recipe: Recipe, config: dict) -> str:
    """The engine that calibrates a model of ``config`` (its config.json): the recipe's, or AutoAWQ where it supports
    the model_type and llm-compressor otherwise; one line naming engine and architecture where the one asked for (or
    neither) maps it."""
    model_type, asked = config.get("model_type"), recipe.awq.engine
    engine = asked or ("autoawq" if model_type in AUTOAWQ_MODEL_TYPES else "llmcompressor")
    if engine == "autoawq":
        if model_type not in AUTOAWQ_MODEL_TYPES:
            raise _not_autoawq(recipe, config, AUTOAWQ_MODEL_TYPES)
        return engine
    from pipeline.stages.awq_llmc import mapped_architectures

    archs = config.get("architectures") or ["?"]
    if not set(archs) & mapped_architectures():
        who = "engine llmcompressor" if asked else "neither engine (autoawq, llmcompressor)"
        raise awq_fail(recipe, f"{who} maps architecture {archs[0]} (model_type {model_type!r}): llm-compressor's AWQ "
                               f"has no mappings for it{'' if asked else ' and AutoAWQ 0.2.9 no model class'}; remove "
                               "the awq section")
    if recipe.awq.apply_clip:
        raise awq_fail(recipe, f"apply_clip: llm-compressor has no clipping search, and AutoAWQ does not support "
                               f"model_type {model_type!r}; set awq.apply_clip: false")
    return engine


def run_awq(recipe: Recipe, hf_dir: str | Path, out_dir: str | Path, record: str | Path, threads: int = 2) -> dict:
    """Entry function: AWQ-calibrate the HF folder ``hf_dir`` into ``out_dir`` (a clean HF folder) with the engine
    :func:`choose_engine` picks: llm-compressor in this process, AutoAWQ in the autoawq environment (pipeline/envs.py),
    where this function runs itself."""
    cfg = recipe.awq
    if cfg is None:
        raise PipelineError(f"{recipe.path}: awq: the recipe has no awq section")
    hf_dir, out_dir, record = Path(hf_dir), Path(out_dir), Path(record)
    config_file = hf_dir / "config.json"
    if not config_file.is_file():
        raise awq_fail(recipe, f"{hf_dir} has no config.json (run the fetch stage first)")
    config = json.loads(config_file.read_text())
    if current() != "autoawq":
        if choose_engine(recipe, config) == "autoawq":
            return _run_in_env(recipe, hf_dir, out_dir, record, threads)
        from pipeline.stages.awq_llmc import run_llmcompressor

        return run_llmcompressor(recipe, hf_dir, out_dir, record, threads, (config.get("architectures") or ["?"])[0])
    # torch: only the AWQ stage loads it
    import torch

    _, supported = import_awq()
    if config.get("model_type") not in supported:
        raise _not_autoawq(recipe, config, supported)
    # awq, transformers: only the AWQ stage; after import_awq()'s fix-ups
    from awq import AutoAWQForCausalLM
    from transformers import AutoTokenizer

    cuda = torch.cuda.is_available()
    torch.manual_seed(0)
    if not cuda:
        torch.set_num_threads(max(1, threads))
    trust = recipe.source.trust_remote_code
    # the slow tokenizer when there is no tokenizer.json (converting a SentencePiece model to a fast
    # one needs protobuf); it only cuts the calibration text into token windows
    tokenizer = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=trust,
                                              use_fast=(hf_dir / "tokenizer.json").is_file())
    samples = calibration_samples(recipe, tokenizer, cfg.calibration, cfg.n_samples, cfg.seq_len)
    start = time.monotonic()
    model = AutoAWQForCausalLM.from_pretrained(
        str(hf_dir), safetensors=not recipe.source.allow_pickle, trust_remote_code=trust,
        torch_dtype=torch.float16 if cuda else torch.float32, device_map=None, low_cpu_mem_usage=True)
    check_shapes(recipe, model.model, cfg.q_group_size, cfg.clip("autoawq"))
    quant_config = {"w_bit": cfg.w_bit, "q_group_size": cfg.q_group_size, "zero_point": cfg.zero_point,
                    "version": cfg.version.upper()}
    print(f"awq: {hf_dir} -> {out_dir} on {'cuda' if cuda else f'cpu ({threads} threads)'}: {quant_config}, "
          f"{cfg.n_samples} x {cfg.seq_len} calibration tokens from {cfg.calibration.name}", flush=True)
    try:
        with deterministic_torch(cuda):
            model.quantize(tokenizer, quant_config=quant_config, calib_data=samples, export_compatible=True,
                           apply_clip=cfg.clip("autoawq"), max_calib_samples=cfg.n_samples, max_calib_seq_len=cfg.seq_len,
                           # all samples in one batch: 0.2.9's n_parallel_calib_samples reuses the attention
                           # mask of the full batch for each part and fails in SDPA
                           n_parallel_calib_samples=None)
    except (RuntimeError, AssertionError, ValueError, KeyError, IndexError, AttributeError, TypeError) as exc:
        traceback.print_exc()
        raise awq_fail(recipe, f"AutoAWQ failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
                            "(traceback in the stage log)") from exc
    seconds = time.monotonic() - start
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}.get(
        config.get("torch_dtype") or config.get("dtype") or "float16", torch.float16)
    model.model.to(dtype)
    with atomic_output(out_dir) as tmp:
        tmp.mkdir()
        save_weights(model.model, hf_dir, tmp / "model.safetensors")
        copied = copy_non_weights(hf_dir, tmp)
    versions = python_versions(("autoawq", "transformers"))
    rec = AwqRecord(params={**cfg.describe(), "engine": "autoawq"}, calibration_sha256=sha256_file(cfg.calibration),
                    device="cuda" if cuda else "cpu", threads=None if cuda else threads, torch=torch.__version__,
                    engine="autoawq", autoawq=versions.get("autoawq"), transformers=versions.get("transformers"), copied_from_source=copied,
                    seconds=round(seconds, 1))
    rec.write(record)
    print(f"awq: done in {seconds:.0f} s", flush=True)
    return rec.to_dict()


def _run_in_env(recipe: Recipe, hf_dir, out_dir, record, threads: int) -> dict:
    """:func:`run_awq` in a process of the autoawq environment, its output passed through; its one-line error, if
    any, raised here as it was there."""
    args = [str(env_python("autoawq")), "-m", "pipeline.stages.awq", str(recipe.path), recipe.name, str(hf_dir),
            str(out_dir), str(record), str(threads)]
    # the pinned tree's gguf-py too: loading the recipe there checks its quant types against it
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env_environ("autoawq", (find_toolchain().gguf_py,)))
    last_error = None
    for line in proc.stdout:
        if line.startswith(ERROR_PREFIX):
            last_error = line[len(ERROR_PREFIX):].strip()
        else:
            print(line, end="", flush=True)
    if proc.wait() != 0:
        raise PipelineError(last_error or f"{recipe.path}: awq: the autoawq environment's process exited "
                                          f"{proc.returncode} (its output is above, in the stage log)")
    return AwqRecord.read(record).to_dict()


def _engine_pins(recipe: Recipe) -> dict:
    """The build environment's packages that shape llm-compressor's output, where that engine may run (the autoawq
    environment's lock is in the trigger through ``envs``)."""
    if recipe.awq.engine == "autoawq":
        return {}
    return {"llmcompressor": build_pins(("llmcompressor", "compressed-tensors", "transformers", "torch"))}


STAGE = Stage(
    "awq", "awq", order=30, log="awq", output="log", threads="calib_threads", directories=("hf",), envs=("autoawq",),
    run=lambda j: run_awq(j.recipe, j.input["hf"], j.output["hf"], j.output["record"], threads=j.threads),
    inputs=lambda r, wc, L: {"hf": L.hf(r.name), "text": r.awq.calibration},
    outputs=lambda L: {"hf": L.hf_awq("{name}"), "record": L.awq_record("{name}")},
    trigger=lambda r, wc, s: {"awq": r.awq.describe(), "calib_threads": s.calib_threads, **_engine_pins(r)},
    # float32 model (2 x the FP16 folder) + the FP16 copy written + activations: 3.5 x (AutoAWQ, docs/planning.md)
    resources={"mem_mb": lambda s: mem_mb(s.total, 3.5, 2048), "disk_mb": lambda s: mem_mb(s.total, 2),
               "runtime": lambda s: int(30 + s.total / 5)},
)


if __name__ == "__main__":  # run_awq in the autoawq environment: RECIPE NAME HF OUT RECORD THREADS
    from pipeline.recipe import load_recipe

    path, name, hf, out, rec, n = sys.argv[1:]
    try:
        loaded = load_recipe(path)
        if loaded.name != name:
            raise PipelineError(f"{path}: awq: the recipe is named {loaded.name!r}, not {name!r}")
        run_awq(loaded, hf, out, rec, threads=int(n))
    except PipelineError as exc:
        print(ERROR_PREFIX + str(exc), flush=True)
        sys.exit(1)
