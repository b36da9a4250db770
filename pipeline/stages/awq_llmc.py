"""The AWQ stage's ``llmcompressor`` engine: llm-compressor's ``AWQModifier`` in the build environment.

llm-compressor is AutoAWQ's maintained successor and maps the 2026 architectures AutoAWQ never will (Qwen3.5's
hybrid layers among them). Its AWQ searches per-channel scales against a quantization scheme on compressed-tensors'
integer grid, as AutoAWQ does against its own: ``w_bit``, ``q_group_size`` and ``zero_point`` make that scheme. The
search runs layer by layer (its sequential pipeline) with quantization disabled in the forward passes, so each layer
sees the float outputs of the layers before it. The scales are then folded into the float weights and the
quantization metadata is removed, so the folder written is a dense HF checkpoint under the source's tensor names, like
the AutoAWQ engine's. llm-compressor has no clipping search: ``apply_clip: true`` is refused with this engine.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.fsutil import atomic_output, sha256_file
from pipeline.provenance import python_versions
from pipeline.recipe import Recipe
from pipeline.records import AwqRecord
from pipeline.stages.awq_files import calibration_samples, copy_non_weights, save_folded

# llm-compressor logs each grid point at INFO and "no accelerator" at WARNING per layer, and draws tqdm bars: a stage
# log of the lines that matter
QUIET = {"LLM_COMPRESSOR_LOG_LEVEL": "ERROR", "TQDM_DISABLE": "1"}


def _quiet() -> list[str]:
    """:data:`QUIET` set where unset (llm-compressor reads its level at import); returns the keys it set."""
    added = [key for key in QUIET if key not in os.environ]
    os.environ.update({key: QUIET[key] for key in added})
    return added


def mapped_architectures() -> set[str]:
    """The model classes llm-compressor's AWQ has mappings for. It falls back to Llama's mappings for any other class
    without failing (dynamic_mappings.py, get_layer_mappings_from_model), so the stage refuses those itself."""
    added = _quiet()
    try:
        from llmcompressor.modifiers.transform.awq import AWQ_DYNAMIC_MAPPING_REGISTRY, AWQ_MAPPING_REGISTRY
    except ImportError as exc:
        raise PipelineError(f"the llmcompressor AWQ engine needs llm-compressor in the build environment, which "
                            f"cannot import it ({exc}): run `make setup`") from None
    finally:
        # restored: processes started later (AutoAWQ's, a test's builds) still draw their progress
        for key in added:
            os.environ.pop(key, None)
    return set(AWQ_MAPPING_REGISTRY) | set(AWQ_DYNAMIC_MAPPING_REGISTRY)


def _scheme(cfg):
    """The compressed-tensors scheme the scales are searched against (only its grid matters: nothing is packed)."""
    # compressed_tensors: only this engine loads it
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    group = cfg.q_group_size
    weights = QuantizationArgs(num_bits=cfg.w_bit, type="int", symmetric=not cfg.zero_point,
                               strategy="channel" if group == -1 else "group", group_size=None if group == -1 else group)
    return QuantizationScheme(targets=["Linear"], weights=weights)


def _no_pinning() -> None:
    """llm-compressor pins cached activations for faster host-to-device copies (IntermediatesCache.pin_memory);
    without CUDA, torch cannot pin memory and the search fails, and on the CPU there is no copy to speed up."""
    # torch, llmcompressor: only this engine loads them
    import torch
    from llmcompressor.pipelines.cache import IntermediatesCache

    if not torch.cuda.is_available():
        IntermediatesCache.pin_memory = lambda self, *a, **k: None


def _strip_quantization(model) -> None:
    """The scales are folded into the weights already; what llm-compressor attached for its search (qparams, schemes,
    wrapped forwards, its compressing save_pretrained) goes, leaving the model transformers loaded."""
    # compressed_tensors: only this engine loads it
    from compressed_tensors.quantization import QuantizationMetadata

    for module in model.modules():
        QuantizationMetadata.clear_quantization(module)
        for attr in ("quantization_status", "quantization_enabled"):
            if attr in vars(module):
                delattr(module, attr)
    vars(model).pop("save_pretrained", None)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def run_llmcompressor(recipe: Recipe, hf_dir: Path, out_dir: Path, record: Path, threads: int, architecture: str) -> dict:
    """AWQ-calibrate ``hf_dir`` into ``out_dir`` with llm-compressor (CPU or CUDA), as
    :func:`pipeline.stages.awq.run_awq` does with AutoAWQ."""
    added = _quiet()
    try:
        return _run_llmcompressor(recipe, hf_dir, out_dir, record, threads, architecture)
    finally:
        # restored for a caller that goes on in this process (a test worker): AutoAWQ's bar in a build it starts
        # later vanished under the TQDM_DISABLE left behind
        for key in added:
            os.environ.pop(key, None)


def _run_llmcompressor(recipe: Recipe, hf_dir: Path, out_dir: Path, record: Path, threads: int, architecture: str) -> dict:
    # torch, transformers, datasets, llmcompressor: only this engine loads them
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform.awq import AWQModifier
    from transformers import AutoModelForCausalLM

    from pipeline.stages.conformance.hf_tokenizer import load_hf_tokenizer

    cfg = recipe.awq
    cuda = torch.cuda.is_available()
    torch.manual_seed(0)
    if not cuda:
        torch.set_num_threads(max(1, threads))
    trust = recipe.source.trust_remote_code
    # the tokenizer as its files define it (transformers 5's AutoTokenizer rebuilds some from class defaults)
    tokenizer = load_hf_tokenizer(hf_dir, trust, f"{recipe.path}: awq")
    samples = calibration_samples(recipe, tokenizer, cfg.calibration, cfg.n_samples, cfg.seq_len)
    start = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32, trust_remote_code=trust,
                                                 use_safetensors=not recipe.source.allow_pickle)
    if type(model).__name__ not in mapped_architectures():
        raise PipelineError(f"{recipe.path}: awq: engine llmcompressor has no AWQ mappings for {type(model).__name__} "
                            f"(architectures {architecture}); neither engine maps it: remove the awq section")
    model.eval()
    _no_pinning()
    data = Dataset.from_dict({"input_ids": samples, "attention_mask": [[1] * len(s) for s in samples]})
    print(f"awq: {hf_dir} -> {out_dir} with llm-compressor on {'cuda' if cuda else f'cpu ({threads} threads)'}: "
          f"int{cfg.w_bit} {'asym' if cfg.zero_point else 'sym'} groups of {cfg.q_group_size}, {cfg.n_samples} x "
          f"{cfg.seq_len} calibration tokens from {cfg.calibration.name}, class {type(model).__name__}", flush=True)
    modifiers = [AWQModifier(), QuantizationModifier(config_groups={"group_0": _scheme(cfg)}, ignore=["lm_head"])]
    try:
        oneshot(model=model, processor=tokenizer, dataset=data, recipe=modifiers, num_calibration_samples=len(samples),
                max_seq_length=cfg.seq_len, shuffle_calibration_samples=False, pipeline="sequential",
                sequential_offload_device="cuda" if cuda else "cpu")
    except (RuntimeError, AssertionError, ValueError, KeyError, IndexError, TypeError) as exc:
        import traceback

        traceback.print_exc()
        raise PipelineError(f"{recipe.path}: awq: llm-compressor failed: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''} (traceback in the stage log)") from exc
    seconds = time.monotonic() - start
    _strip_quantization(model)
    config = json.loads((hf_dir / "config.json").read_text())
    dtype = {"float16": torch.float16, "float32": torch.float32}.get(
        config.get("torch_dtype") or config.get("dtype") or "float16", torch.float16)
    # bfloat16 sources are saved in float16: bfloat16's 8-bit mantissa rounds the folded scales away (the function
    # moves), and the converter writes F16 (or what outtype says) either way
    model.to(dtype)
    with atomic_output(out_dir) as tmp:
        tmp.mkdir()
        kept = save_folded(recipe, model, hf_dir, tmp / "model.safetensors")
        copied = copy_non_weights(hf_dir, tmp)
    versions = python_versions(("llmcompressor", "compressed-tensors", "transformers"))
    # the engine and the clipping as run, also where the recipe left them to the stage
    rec = AwqRecord(params={**cfg.describe(), "engine": "llmcompressor", "apply_clip": False}, calibration_sha256=sha256_file(cfg.calibration),
                    device="cuda" if cuda else "cpu", threads=None if cuda else threads, torch=torch.__version__,
                    engine="llmcompressor", autoawq=None, llmcompressor=versions.get("llmcompressor"),
                    transformers=versions.get("transformers"), copied_from_source=copied, seconds=round(seconds, 1),
                    extra={"kept_from_source": kept} if kept else {})
    rec.write(record)
    print(f"awq: done in {seconds:.0f} s", flush=True)
    return rec.to_dict()
