"""The AWQ stage's files, shared by its two engines (pipeline/stages/awq.py, pipeline/stages/awq_llmc.py): the
calibration windows it reads, and the clean HF folder it writes (the source's files, the folded weights under the
source's tensor names)."""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.recipe import Recipe

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def awq_fail(recipe: Recipe, msg: str) -> PipelineError:
    return PipelineError(f"{recipe.path}: awq: {msg}")


def calibration_samples(recipe: Recipe, tokenizer, text_path: Path, n_samples: int, seq_len: int) -> list[list[int]]:
    """``n_samples`` consecutive windows of ``seq_len`` tokens from the start of the text."""
    text = text_path.read_text(encoding="utf-8", errors="replace").lstrip("\ufeff")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    need = n_samples * seq_len
    if len(ids) < need:
        raise awq_fail(recipe, f"calibration text {text_path.name} has {len(ids)} tokens, fewer than n_samples x seq_len "
                                f"= {n_samples} x {seq_len} = {need}; use a longer text or lower awq.n_samples / awq.seq_len")
    return [ids[i * seq_len:(i + 1) * seq_len] for i in range(n_samples)]


def copy_non_weights(src: Path, dest: Path) -> list[str]:
    copied = []
    for item in sorted(src.iterdir()):
        if item.name.startswith(".") or item.name in WEIGHT_INDEXES or item.suffix in WEIGHT_SUFFIXES:
            continue
        if item.is_file():
            shutil.copyfile(item, dest / item.name)
            copied.append(item.name)
    return copied


def save_weights(model, hf_dir: Path, dest: Path) -> None:
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


# transformers loads some checkpoints under other names than the files use (Qwen3.5's text model drops the
# ``language_model`` part: conversion_mapping.py, PrefixChange); the folded tensors are written under the files' names
NAME_FORMS = (("model.language_model.", "model."), ("language_model.", ""))


def save_folded(recipe: Recipe, model, hf_dir: Path, dest: Path) -> list[str]:
    """The model's weights under the source checkpoint's tensor names, one tensor each; source tensors the loaded
    class has no parameter for (an MTP head, a vision tower) are copied unchanged. Returns the prefixes of those (the
    record's ``kept_from_source``). Every tensor of the model must land under a source name, tied ones aside."""
    # safetensors (torch): only this engine loads it
    from safetensors import safe_open
    from safetensors.torch import save_file

    state = model.state_dict()
    out, kept, used = {}, set(), set()
    for f in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():
                forms = [name] + [name.replace(a, b, 1) for a, b in NAME_FORMS if name.startswith(a)]
                hit = next((k for k in forms if k in state), None)
                if hit is None:
                    out[name] = fh.get_tensor(name)
                    parts = name.split(".")
                    kept.add(".".join(parts[:2 if parts[0] == "model" else 1]) + ".*")
                else:
                    out[name] = state[hit].detach().to("cpu").contiguous().clone()
                    used.add(hit)
    if not out:
        raise PipelineError(f"{recipe.path}: awq: engine llmcompressor needs safetensors weights in {hf_dir}")
    written = {t.data_ptr() for k, t in state.items() if k in used}
    lost = sorted(k for k, t in state.items() if k not in used and t.data_ptr() not in written)
    if lost:
        raise PipelineError(f"{recipe.path}: awq: {len(lost)} calibrated tensor(s) match no tensor name of the source "
                            f"checkpoint (first: {lost[0]})")
    save_file(out, str(dest), metadata={"format": "pt"})
    dest.chmod(0o644)
    return sorted(kept)
