"""Which measurement-free error tracks a group's measured KLD across the bands (issue #32)?

Run:  python bench/fisher_screen.py RECIPE --work W --artifacts A [--samples 4] [--threads 2]
Needs RECIPE built with `search: exhaustive` into W (its sensitivity file measures every group at every candidate),
a llama-architecture source (W/<name>/hf) and torch. Compares, per role and candidate, the measured mean KLD a group
adds over the floor's (the truth, from the exhaustive search) with errors computed without any evaluation:

1. the screened search's: the relative activation-weighted squared error (pipeline/stages/mix/screen.py), importance
   from one llama-imatrix pass over the sensitivity text;
2. Fisher-weighted ones: 1/2 sum_ij F_ij (dW_ij^2 - dW_floor,ij^2), the second-order expansion of the KL divergence
   (an absolute mean KLD), with F_ij = mean over the scored tokens of delta_i^2 x_j^2 (x a matrix's input, delta the
   gradient of the log-likelihood of a label sampled from the model's own distribution, at the matrix's output;
   llama-perplexity's scored positions, the second half of each chunk): ``full`` per weight; ``factored`` (mean
   delta_i^2 x mean x_j^2, what an importance matrix and one vector per output could give), the same without the
   BOS position, and ``tensor`` (one mean delta^2 per matrix x the importance matrix).

The screened search measures one scale (KLD per unit of error) per segment, so what matters is how far the ratio
measured / error varies across one role's bands: printed as min-max and max/min per role and candidate, and the
KLD-weighted mean absolute deviation from one scale per role and candidate (the median ratio). Neither error is
fitted to the measurements. Results:
bench/RESULTS.md#a-fisher-weighted-error-and-what-the-gate-test-can-resolve-2026-12-05-later.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROLES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down"}


def gguf_name(hf: str) -> str | None:
    if hf == "lm_head":
        return "output.weight"
    parts = hf.split(".")
    if len(parts) == 5 and parts[:2] == ["model", "layers"]:
        role = ROLES.get(".".join(parts[3:]))
        return f"blk.{parts[2]}.{role}.weight" if role else None
    return None


def gguf_rows(g: str, w: np.ndarray, cfg) -> np.ndarray:
    """``w`` (tensor ``g``, HF row order) in the row order the base GGUF holds it."""
    from pipeline.stages.mix.fisher import permute_rows

    if ".attn_q." in g:
        return permute_rows(w, cfg.num_attention_heads)
    if ".attn_k." in g:
        return permute_rows(w, cfg.num_key_value_heads or cfg.num_attention_heads)
    return w


def fisher(hf_dir: Path, text: Path, ctx: int, chunks: int, samples: int, threads: int,
           gguf_weights: dict[str, np.ndarray]) -> dict[str, dict]:
    """form -> GGUF tensor name -> diagonal Fisher estimate, in the GGUF file's row order. Forms: ``full`` (per
    weight), ``factored`` (mean delta_i^2 x mean x_j^2: one vector per side), ``tensor`` (one mean delta^2 per
    matrix x mean x_j^2: the importance matrix scaled per tensor). Each mapped weight, reordered as the converter
    writes it, must equal ``gguf_weights``' (the base GGUF's) to F16 precision, or the names or rows are wrong."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    torch.set_num_threads(max(1, threads))
    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    model.eval()
    cfg = model.config
    if cfg.model_type != "llama":
        raise SystemExit(f"{hf_dir}/config.json: model_type {cfg.model_type!r}: this bench maps llama tensors only")
    for name, w in model.state_dict().items():
        g = "token_embd.weight" if name == "model.embed_tokens.weight" else gguf_name(name.removesuffix(".weight"))
        if g not in gguf_weights:
            continue
        w = gguf_rows(g, w.numpy(), cfg)
        if w.shape != gguf_weights[g].shape or np.abs(w - gguf_weights[g]).max() > 1e-2 * np.abs(w).max():
            raise SystemExit(f"{hf_dir}: {name} does not match {g} of the base GGUF")
    bos = tok.bos_token_id
    ids = [bos, *tok(text.read_text(), add_special_tokens=False)["input_ids"]]
    if len(ids) < ctx * chunks:
        raise SystemExit(f"{text}: {len(ids)} tokens, fewer than {chunks} x {ctx}")
    acc: dict[str, object] = {}
    inputs: dict[str, object] = {}
    for name, mod in model.named_modules():
        g = gguf_name(name)
        if g is None or not isinstance(mod, torch.nn.Linear):
            continue

        def keep(mod, inp, out, g=g):
            inputs[g] = inp[0].detach()[0]

        def add(mod, gin, gout, g=g):
            d, x = gout[0].detach()[0], inputs.pop(g)
            d2, x2 = d * d, x * x
            full, rows, cols, rows1, cols1 = acc.get(g, (0, 0, 0, 0, 0))
            acc[g] = (full + d2.T @ x2, rows + d2.sum(0), cols + x2.sum(0), rows1 + d2[1:].sum(0), cols1 + x2[1:].sum(0))

        mod.register_forward_hook(keep)
        mod.register_full_backward_hook(add)
    emb = model.get_input_embeddings()
    acc_emb = torch.zeros_like(emb.weight)
    first = ctx // 2  # llama-perplexity scores the second half of each chunk (tools/perplexity/perplexity.cpp:540)
    scored = 0
    t = time.monotonic()
    for c in range(chunks):
        chunk = torch.tensor([bos, *ids[c * ctx + 1:(c + 1) * ctx]])[None]
        for _ in range(samples):
            e = emb(chunk).detach().requires_grad_(True)
            logits = model(inputs_embeds=e).logits[0, first:ctx - 1]
            with torch.no_grad():
                y = torch.multinomial(torch.softmax(logits, -1), 1)[:, 0]
            torch.nn.functional.cross_entropy(logits, y, reduction="sum").backward()
            acc_emb.index_add_(0, chunk[0], e.grad[0] ** 2)
            model.zero_grad()
        scored += ctx - 1 - first
        print(f"[fisher] chunk {c + 1}/{chunks} ({time.monotonic() - t:.0f} s)", flush=True)
    n = samples * scored
    out: dict[str, dict] = {"full": {}, "factored": {}, "factored, BOS out": {}, "tensor": {}}
    for g, (full, rows, cols, rows1, cols1) in acc.items():
        rows, cols = rows.numpy()[:, None] / n, cols.numpy()[None, :] / n
        rows1, cols1 = rows1.numpy()[:, None] / n, cols1.numpy()[None, :] / n
        forms = {"full": full.numpy() / n, "factored": rows * cols, "factored, BOS out": rows1 * cols1,
                 "tensor": np.broadcast_to(rows.mean() * cols, full.shape)}
        for k, f in forms.items():
            out[k][g] = gguf_rows(g, f, cfg)
    for k in out:  # a lookup: each row is one token's, so the full form is the only one
        out[k]["token_embd.weight"] = acc_emb.numpy() / n
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--work", default="work")
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--samples", type=int, default=4, help="labels sampled per scored token (default 4)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    from bench.mix_bench import quantize_map
    from pipeline.layout import Layout
    from pipeline.recipe import load_recipe
    from pipeline.stages.imatrix import run_imatrix
    from pipeline.stages.mix.screen import column_importance, tensor_reader, weight_errors
    from pipeline.tools import find_toolchain

    r = load_recipe(a.recipe)
    L = Layout(Path(a.artifacts), Path(a.work))
    sens = json.loads(L.sensitivity(r.name, "plain").read_text())
    groups, floor, cands = sens["groups"], sens["floor"], sens["candidates"]
    if any(v.get("source", "measured") != "measured" for g in groups for v in g["kld"].values()):
        raise SystemExit(f"{L.sensitivity(r.name, 'plain')}: not an exhaustive sensitivity (build with search: "
                         "exhaustive first)")
    fk = sens["floor_kld"]["kld_mean"] if isinstance(sens["floor_kld"], dict) else sens["floor_kld"]
    s = r.sensitivity
    base = L.source_gguf(r, "plain").resolve()
    names = [t for g in groups for t in g["tensors"]]
    tc = find_toolchain()
    read_base = tensor_reader(base)
    W = {n: read_base(n).astype(np.float64) for n in names}
    F = fisher(L.hf(r.name), Path(s.text), s.ctx, s.chunks, a.samples, a.threads, W)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        im = tmp / "screen.imatrix"
        run_imatrix(tc, base, Path(s.text).resolve(), im, s.ctx, s.chunks, a.threads, None, "fisher_screen")
        importance = column_importance(im)
        errs: dict[str, dict[str, dict[str, float]]] = {k: {} for k in ("relative (screen)", *F)}
        for c in (floor, *cands):
            out = quantize_map(tc, base, dict.fromkeys(names, c), tmp / "all.gguf", a.threads)
            read = tensor_reader(out)
            d2 = {n: (read(n).astype(np.float64).reshape(W[n].shape) - W[n]) ** 2 for n in names}
            for k, f in F.items():
                errs[k][c] = {n: 0.5 * float((f[n] * d2[n]).sum()) for n in names}
            errs["relative (screen)"][c] = weight_errors(base, out, names, importance, a.threads)
            out.unlink()
    print(f"{r.name}: {len(groups)} groups, floor {floor} (mean KLD {fk:.6f}), samples {a.samples}")
    summary = {}
    for label, err in errs.items():
        print(f"\n== {label}: measured added KLD / error, over each role's bands")
        by: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for g in groups:
            for c in cands:
                m = g["kld"][c]["kld_mean"] - fk
                e = sum(err[c][t] - err[floor][t] for t in g["tensors"])
                if m > 0 and e > 0:
                    by.setdefault((g["role"], c), []).append((m, m / e))
        dev = tot = 0.0
        for (role, c), rows in sorted(by.items()):
            ratios = [x for _, x in rows]
            mid = statistics.median(ratios)
            dev += sum(m * abs(x / mid - 1) for m, x in rows)
            tot += sum(m for m, _ in rows)
            if len(rows) > 1:
                print(f"  {role:12s} {c}: {min(ratios):.3g}-{max(ratios):.3g} (x{max(ratios) / min(ratios):.1f})")
        summary[label] = dev / tot
        print(f"  KLD-weighted mean |ratio / role median - 1|: {dev / tot:.3f}")
    fis = errs["full"]
    ratio_fis = [(g["kld"][c]["kld_mean"] - fk) / e for g in groups for c in cands
                 if (e := sum(fis[c][t] - fis[floor][t] for t in g["tensors"])) > 0 and g["kld"][c]["kld_mean"] > fk]
    print(f"\nfull Fisher, no scale at all: measured / predicted median {statistics.median(ratio_fis):.2f}, "
          f"range {min(ratio_fis):.2f}-{max(ratio_fis):.2f}")
    print("summary: " + ", ".join(f"{k} {v:.3f}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
