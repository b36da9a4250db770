"""Stage awq: AutoAWQ activation-aware scaling, folded into FP weights, as a clean HF folder.

AutoAWQ runs with ``export_compatible=True``: it searches per-channel scales (and, with
``apply_clip``, weight clipping ranges) on the calibration text and folds them into the weights,
without packing them to int4. The result is an ordinary HF checkpoint that llama.cpp's converter
reads; llama-quantize then quantizes it like any other model. The folder written here is the
source folder with its weights replaced: the source's own ``config.json`` (so no
``quantization_config: awq``), tokenizer files, chat template, generation config and model card.

Calibration runs on CUDA when torch sees a GPU, otherwise on the CPU (float32, fixed thread count
and seed, torch's deterministic algorithms), so the folded weights are bit-reproducible on one machine
(README, Calibration: Reproducibility).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

from pipeline.envs import current, env_environ, env_python
from pipeline.errors import PipelineError
from pipeline.fsutil import atomic_output, sha256_file
from pipeline.provenance import python_versions
from pipeline.recipe import Recipe
from pipeline.records import AwqRecord
from pipeline.stagedef import Stage, mem_mb
from pipeline.tools import find_toolchain

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# AutoAWQ's clipping processes output channels in batches of 64 (awq/quantize/quantizer.py,
# _compute_best_clip) and skips the query/key projections.
CLIP_BATCH = 64
CLIP_SKIPPED = ("q_", "k_", "query", "key", "Wqkv")
ERROR_PREFIX = "ggufpipe-awq-error: "  # the line that carries a PipelineError out of the autoawq environment


def import_awq():
    """Import AutoAWQ 0.2.9 with its compatibility fix-ups (all of them live here).

    AutoAWQ is archived upstream; 0.2.9 is its last release, so its bugs stay. Two fix-ups:

    1. transformers 4.57 renamed ``transformers.activations.PytorchGELUTanh`` to ``GELUTanh`` and
       AutoAWQ imports the old name at import time: the old name is restored before the import.
       (This project pins transformers 4.56.2, where the name still exists.)
    2. On the CPU its scale search corrupts the weights it keeps. ``_compute_best_scale`` snapshots
       the layer weights with ``{k: v.cpu() for k, v in state_dict().items()}`` — a copy on a GPU,
       the very same tensors on the CPU — then scales the live weights in place for the first grid
       point. The snapshot it restores after every grid point, and so the folded model, then carries
       that first point's scales in the weights but not in the norms: the model's function changes
       (on a test model, logits moved by 5%). The fix hands the search a state_dict of copies.
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
        AwqQuantizer._ggufpipe_patched = True
    return awq, AWQ_CAUSAL_LM_MODEL_MAP


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


def _fail(recipe: Recipe, msg: str) -> PipelineError:
    return PipelineError(f"{recipe.path}: awq: {msg}")


def calibration_samples(recipe: Recipe, tokenizer, text_path: Path, n_samples: int, seq_len: int) -> list[list[int]]:
    """``n_samples`` consecutive windows of ``seq_len`` tokens from the start of the text."""
    text = text_path.read_text(encoding="utf-8", errors="replace").lstrip("\ufeff")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    need = n_samples * seq_len
    if len(ids) < need:
        raise _fail(recipe, f"calibration text {text_path.name} has {len(ids)} tokens, fewer than n_samples x seq_len "
                            f"= {n_samples} x {seq_len} = {need}; use a longer text or lower awq.n_samples / awq.seq_len")
    return [ids[i * seq_len:(i + 1) * seq_len] for i in range(n_samples)]


def check_shapes(recipe: Recipe, model, group_size: int, apply_clip: bool) -> None:
    """Refuse, before the hour-long search starts, the layer shapes AutoAWQ cannot handle."""
    # torch: only the AWQ stage loads it
    import torch.nn as nn

    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear) or ".layers." not in f".{name}":
            continue
        if group_size > 0 and mod.in_features % group_size:
            raise _fail(recipe, f"q_group_size: layer {name} has {mod.in_features} input features, not a multiple of "
                                f"{group_size}; choose a q_group_size that divides it")
        if apply_clip and mod.out_features % CLIP_BATCH and not any(s in name for s in CLIP_SKIPPED):
            raise _fail(recipe, f"apply_clip: layer {name} has {mod.out_features} output features, not a multiple of "
                                f"{CLIP_BATCH} (AutoAWQ's clipping needs that); set awq.apply_clip: false")


def _copy_non_weights(src: Path, dest: Path) -> list[str]:
    copied = []
    for item in sorted(src.iterdir()):
        if item.name.startswith(".") or item.name in WEIGHT_INDEXES or item.suffix in WEIGHT_SUFFIXES:
            continue
        if item.is_file():
            shutil.copyfile(item, dest / item.name)
            copied.append(item.name)
    return copied


def run_awq(recipe: Recipe, hf_dir: str | Path, out_dir: str | Path, record: str | Path, threads: int = 2) -> dict:
    """Entry function: AWQ-calibrate the HF folder ``hf_dir`` into ``out_dir`` (a clean HF folder), in the autoawq
    environment (pipeline/envs.py): this function runs itself there when called from another."""
    if current() != "autoawq":
        return _run_in_env(recipe, hf_dir, out_dir, record, threads)
    # torch: only the AWQ stage loads it
    import torch

    cfg = recipe.awq
    if cfg is None:
        raise PipelineError(f"{recipe.path}: awq: the recipe has no awq section")
    hf_dir, out_dir, record = Path(hf_dir), Path(out_dir), Path(record)
    config_file = hf_dir / "config.json"
    if not config_file.is_file():
        raise _fail(recipe, f"{hf_dir} has no config.json (run the fetch stage first)")
    config = json.loads(config_file.read_text())
    _, supported = import_awq()
    model_type = config.get("model_type")
    if model_type not in supported:
        raise _fail(recipe, f"architecture {config.get('architectures', ['?'])[0]} (model_type {model_type!r}) is not "
                            f"supported by AutoAWQ 0.2.9 (it supports: {', '.join(sorted(supported))}); remove the awq "
                            "section")
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
    check_shapes(recipe, model.model, cfg.q_group_size, cfg.apply_clip)
    quant_config = {"w_bit": cfg.w_bit, "q_group_size": cfg.q_group_size, "zero_point": cfg.zero_point,
                    "version": cfg.version.upper()}
    print(f"awq: {hf_dir} -> {out_dir} on {'cuda' if cuda else f'cpu ({threads} threads)'}: {quant_config}, "
          f"{cfg.n_samples} x {cfg.seq_len} calibration tokens from {cfg.calibration.name}", flush=True)
    try:
        with deterministic_torch(cuda):
            model.quantize(tokenizer, quant_config=quant_config, calib_data=samples, export_compatible=True,
                           apply_clip=cfg.apply_clip, max_calib_samples=cfg.n_samples, max_calib_seq_len=cfg.seq_len,
                           # all samples in one batch: 0.2.9's n_parallel_calib_samples reuses the attention
                           # mask of the full batch for each part and fails in SDPA
                           n_parallel_calib_samples=None)
    except (RuntimeError, AssertionError, ValueError, KeyError, IndexError) as exc:
        traceback.print_exc()
        raise _fail(recipe, f"AutoAWQ failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
                            "(traceback in the stage log)") from exc
    seconds = time.monotonic() - start
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}.get(
        config.get("torch_dtype") or config.get("dtype") or "float16", torch.float16)
    model.model.to(dtype)
    with atomic_output(out_dir) as tmp:
        tmp.mkdir()
        _save_weights(model.model, hf_dir, tmp / "model.safetensors")
        copied = _copy_non_weights(hf_dir, tmp)
    versions = python_versions(("autoawq", "transformers"))
    rec = AwqRecord(params=cfg.describe(), calibration_sha256=sha256_file(cfg.calibration),
                    device="cuda" if cuda else "cpu", threads=None if cuda else threads, torch=torch.__version__,
                    autoawq=versions.get("autoawq"), transformers=versions.get("transformers"), copied_from_source=copied,
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


def _save_weights(model, hf_dir: Path, dest: Path) -> None:
    """The model's weights under the names the source checkpoint used, one tensor each. (A tied
    embedding is one tensor under two names; safetensors' save_model keeps whichever name it likes,
    and a checkpoint holding ``lm_head.weight`` but no ``model.embed_tokens.weight`` converts to a
    GGUF without token_embd that llama.cpp cannot load.)"""
    # safetensors (torch): only the AWQ stage loads it
    from safetensors import safe_open
    from safetensors.torch import save_file, save_model

    names: set[str] = set()
    for f in hf_dir.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as fh:
            names |= set(fh.keys())
    state = model.state_dict()
    if not names:  # pickled source (allow_pickle): no names to follow
        save_model(model, str(dest))
    else:
        missing = sorted(names - state.keys())
        if missing:
            raise PipelineError(f"awq: the calibrated model lacks {len(missing)} tensor(s) of the source (first: "
                                f"{missing[0]})")
        save_file({k: state[k].detach().to("cpu").contiguous().clone() for k in sorted(names)}, str(dest),
                  metadata={"format": "pt"})
    dest.chmod(0o644)


STAGE = Stage(
    "awq", "awq", order=30, log="awq", output="log", threads="calib_threads", directories=("hf",), envs=("autoawq",),
    run=lambda j: run_awq(j.recipe, j.input["hf"], j.output["hf"], j.output["record"], threads=j.threads),
    inputs=lambda r, wc, L: {"hf": L.hf(r.name), "text": r.awq.calibration},
    outputs=lambda L: {"hf": L.hf_awq("{name}"), "record": L.awq_record("{name}")},
    trigger=lambda r, wc, s: {"awq": r.awq.describe(), "calib_threads": s.calib_threads},
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
