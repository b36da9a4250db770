"""The Fisher-weighted screen of ``search: fisher`` (issue #32, docs/mixes.md#the-fisher-weighted-search).

The screened search's error weighs a tensor's columns by their mean squared input only; what a weight's change does
to the output distribution also depends on how much the loss moves with the row it feeds. The diagonal Fisher
``F_ij = mean_t delta_ti^2 x_tj^2`` (``x_t``: the layer's input at token ``t``, ``delta_t``: the gradient of the
log-likelihood of a token sampled from the model itself at the positions llama-perplexity scores, with respect to the
layer's output) weighs both; ``1/2 sum_ij F_ij dW_ij^2`` is then a second-order estimate of the KLD a tensor's
quantization adds. On the rotated demo it tracks the measured KLD across a role's bands far more closely than the
activation-weighted error (bench/RESULTS.md#a-fisher-weighted-error-and-what-the-gate-test-can-resolve-2026-12-05-later).

One pass of torch over the HF checkpoint the base GGUF was converted from, forward and backward, on the sensitivity
text: safetensors only, no remote code unless the recipe opts in. Every HF weight used is first checked
against the base GGUF's tensor of that name (gguf-py's tensor map; llama's q/k rows in the converter's order), so a
wrong name or row order fails instead of skewing the weights. Memory: the model in float32 plus one float32 per
quantized weight.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from pipeline.errors import PipelineError

# What the Fisher estimate is (labels sampled with SEED, positions, the q/k order); part of its cache key.
FISHER_VERSION = 1
SEED = 0
# The base GGUF holds the checkpoint's weights rounded to F16 or BF16: a mapped weight may differ by this share of
# its largest magnitude; a wrong name or row order differs by about the whole of it.
MATCH_TOLERANCE = 1e-2


def fisher_key(base_sha: str, text_sha: str, ctx: int, chunks: int, threads: int) -> str:
    """The cache key of a Fisher estimate: what it is computed from (the weights and the tokenizer through
    ``base_sha``: the weights are checked equal, the tokens are llama.cpp's) and with (torch, transformers)."""
    import torch
    import transformers

    return hashlib.sha256(json.dumps([base_sha, text_sha, ctx, chunks, threads, torch.__version__,
                                      transformers.__version__, FISHER_VERSION]).encode()).hexdigest()


def permute_rows(w, n_head: int):
    """llama's q/k row order as the converter writes it (conversion/llama.py:176-181 of the pinned tree)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _row_order(name: str, w, g, heads: tuple[int, ...], where: str):
    """How ``w`` (HF, float32 numpy) is laid out in ``g`` (the base GGUF's tensor, float32): ``None`` (as is) or the
    head count of the converter's q/k permutation; PipelineError if neither matches."""
    import numpy as np

    if w.shape != g.shape:
        raise PipelineError(f"{where}: {name} has shape {list(w.shape)}, the base GGUF's tensor {list(g.shape)}")
    tol = MATCH_TOLERANCE * (_max_diff(w, None) or 1.0)
    if _max_diff(w, g) <= tol:
        return None
    for n in heads:
        if w.shape[0] % (2 * n) == 0 and _max_diff(w, g, permute_rows(np.arange(w.shape[0]), n)) <= tol:
            return n
    raise PipelineError(f"{where}: {name} does not equal the base GGUF's tensor of that name in any row order the "
                        f"converter writes: the checkpoint is not the one the base file was converted from")


def _max_diff(w, g, rows=None, block: int = 256) -> float:
    """max |w[rows] - g| (``g`` None: max |w|), a block of rows at a time: whole-tensor temporaries spend most of
    their time faulting in fresh pages (bench/RESULTS.md#the-fisher-weighted-search-in-the-stage-2026-12-05)."""
    import numpy as np

    out = 0.0
    for i in range(0, w.shape[0], block):
        a = w[i:i + block] if rows is None else w[rows[i:i + block]]
        out = max(out, float(np.abs(a if g is None else a - g[i:i + block]).max()))
    return out


def diagonal_fisher(hf_dir: str | Path, base_gguf: str | Path, names: list[str], ids: list[int], bos: int | None,
                    ctx: int, chunks: int, threads: int, trust_remote_code: bool, where: str) -> dict[str, object]:
    """GGUF tensor name -> its diagonal Fisher (float32 numpy, the base GGUF's shape and row order), for every name
    in ``names``, from the first ``chunks`` x ``ctx`` of ``ids`` cut as llama-perplexity cuts them (``bos`` first in
    each chunk, the second half scored: tools/perplexity/perplexity.cpp:1772-1800)."""
    merged = sorted(n for n in names if "_exps." in n)
    if merged:  # one GGUF tensor per layer holds every expert: no one HF matrix to check it against
        raise PipelineError(f"{where}: {merged[0]} merges a mixture's experts, which the Fisher pass does not map: "
                            f"use search: screened")
    import torch
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
    from transformers import AutoModelForCausalLM

    from pipeline.gguf.reader import read_header
    from pipeline.stages.mix.screen import tensor_reader

    hf_dir = Path(hf_dir)
    header = read_header(base_gguf)
    arch = header.get("general.architecture")
    n_blocks = int(header.get(f"{arch}.block_count", 0))
    heads = tuple(int(header.get(k)) for k in (f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv")
                  if isinstance(header.get(k), int))
    arch_enum = {v: k for k, v in MODEL_ARCH_NAMES.items()}.get(arch)
    if arch_enum is None:
        raise PipelineError(f"{where}: gguf-py has no tensor map for architecture {arch}: use search: screened")
    tmap = get_tensor_name_map(arch_enum, n_blocks)
    in_base = {t.name for t in header.tensors}
    base_tensor = tensor_reader(base_gguf)

    torch.manual_seed(SEED)
    torch.set_num_threads(max(1, threads))
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32, trust_remote_code=trust_remote_code,
                                                 use_safetensors=True)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    wanted = set(names)
    order: dict[str, int | None] = {}
    acc: dict[str, object] = {}  # summed in place: a fresh tensor per chunk costs page faults (bench/RESULTS.md)
    hooked = []
    for mod_name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        g = tmap.get_name(f"{mod_name}.weight", try_suffixes=(".weight",))
        if g == "output.weight" and g not in in_base and getattr(model.config, "tie_word_embeddings", False):
            g = "token_embd.weight"  # no output tensor: the embedding is the output too
        if g is None or g not in wanted:
            continue
        order[g] = _row_order(f"{mod_name}.weight", mod.weight.detach().float().numpy(), base_tensor(g), heads, where)
        acc[g] = torch.zeros_like(mod.weight, dtype=torch.float32)

        def keep(mod, inp, out, g=g):
            x = inp[0].detach()[0].float()

            def on_grad(grad, x=x):
                acc[g].addmm_(grad[0].float().square().T, x.square())
            out.register_hook(on_grad)
        hooked.append(mod.register_forward_hook(keep))
    emb = model.get_input_embeddings()
    emb_name = tmap.get_name(f"{_module_name(model, emb)}.weight", try_suffixes=(".weight",))
    lookups = sorted({n for n in (emb_name, "token_embd.weight") if n in wanted})
    missing = sorted(wanted - set(order) - set(lookups))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise PipelineError(f"{where}: no weight of {hf_dir} maps to {missing[0]}{more} in gguf-py's tensor map for "
                            f"{arch}: use search: screened")

    if len(ids) < ctx * chunks:
        raise PipelineError(f"{where}: the sensitivity text is {len(ids)} tokens, fewer than {chunks} x {ctx}")
    first = ctx // 2
    femb = torch.zeros_like(emb.weight)
    gen = torch.Generator().manual_seed(SEED)
    scored = 0
    t0 = time.monotonic()
    for c in range(chunks):
        chunk = torch.tensor(ids[c * ctx:(c + 1) * ctx])[None]
        if bos is not None:
            chunk[0, 0] = bos
        e = emb(chunk).detach().requires_grad_(True)
        logits = _scored_logits(model, e, ctx - first)
        with torch.no_grad():
            y = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)[:, 0]
        torch.nn.functional.cross_entropy(logits, y, reduction="sum").backward()
        femb.index_add_(0, chunk[0], e.grad[0] ** 2)
        scored += ctx - 1 - first
        print(f"[fisher] chunk {c + 1}/{chunks} ({time.monotonic() - t0:.0f} s)", flush=True)
    for h in hooked:
        h.remove()
    out = {}
    for g, n_head in order.items():
        f = acc[g].numpy() / scored
        out[g] = f if n_head is None else permute_rows(f, n_head)
    for g in lookups:
        out[g] = out.get(g, 0) + femb.numpy() / scored  # a tied output adds its own Fisher
    return out


def _scored_logits(model, e, keep: int):
    """The logits of the last ``keep`` positions but the final one (whose next token lies beyond the chunk); only
    those go through the output matrix where the model takes ``logits_to_keep``."""
    try:
        out = model(inputs_embeds=e, logits_to_keep=keep).logits
    except TypeError:
        out = model(inputs_embeds=e).logits
    return out[0, -keep:-1].float()


def _module_name(model, module) -> str:
    return next(n for n, m in model.named_modules() if m is module)
