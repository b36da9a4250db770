"""Human-readable outputs of a recipe: report (markdown table + size-vs-KLD plot) and model card."""

from __future__ import annotations

from pathlib import Path

from .fsutil import atomic_output, write_text_atomic
from .split import model_path

MIB = 1024 * 1024


def _fmt(v, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def _file_cell(e: dict) -> str:
    """A file, or a split file's folder with its shard count."""
    s = e.get("split")
    return f"`{e['file']}/` ({s['count']} shards, max {s['max_size']})" if s else f"`{e['file']}`"


def _rows(manifest: dict, eval_set: str | None):
    bench = manifest.get("build", {}).get("bench", {})
    entries = [(e, True) for e in manifest["artifacts"] if e.get("role") != "mtp-draft"] + \
        [(e, False) for e in manifest.get("rejected", [])]
    for e, published in entries:
        m = (e.get("metrics") or {}).get(eval_set, {}) if eval_set else {}
        b = bench.get(e["file"], {})
        if e.get("role") == "base":
            verdict = "reference"
        elif not eval_set:
            verdict = "published (no gates)"
        else:
            verdict = "pass" if published else "FAIL: " + "; ".join(
                f"{f['metric']} {f['value']:.4g} vs {f['threshold']} {f['limit']:.4g}"
                for f in e.get("failures", []) if f.get("eval_set") == eval_set)
        yield e, m, b, verdict


def markdown_table(manifest: dict, eval_set: str | None, speed: bool = True) -> str:
    head = ["quant", "file", "size MiB", "bpw", "PPL", "PPL ratio", "mean KLD", "99% KLD", "same top p"]
    if speed:
        head += ["pp t/s", "tg t/s"]
    head.append("gate")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e, m, b, verdict in _rows(manifest, eval_set):
        is_base = e.get("role") == "base"
        ppl = m.get("ppl_q") if not is_base else (manifest.get("eval_base", {}).get(eval_set, {}) or {}).get("ppl")
        cells = [e["quant_type"] + (f" ({e['requested']['variant']})" if e.get("requested", {}).get("variant") else ""),
                 _file_cell(e), f"{e['size_bytes'] / MIB:.1f}", f"{e['bits_per_weight']:.2f}",
                 _fmt(ppl, ".3f"), "1" if is_base else _fmt(m.get("ppl_ratio"), ".4f"),
                 "0" if is_base else _fmt(m.get("kld_mean"), ".5f"), "0" if is_base else _fmt(m.get("kld_p99"), ".4f"),
                 "100%" if is_base else (_fmt(m["same_top_p"] * 100, ".2f") + "%" if "same_top_p" in m else "–")]
        if speed:
            cells += [_fmt(b.get("pp_tokens_per_s"), ".1f"), _fmt(b.get("tg_tokens_per_s"), ".1f")]
        cells.append(verdict)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(manifest: dict, out: str | Path) -> None:
    """PNG: file size against mean KLD per quant and eval set (the usual Pareto picture)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    sets = [es["name"] for es in manifest.get("eval_sets", [])]
    for i, es in enumerate(sets):
        for e, m, _b, _v in _rows(manifest, es):
            if e.get("role") == "base" or "kld_mean" not in m:
                continue
            published = e in manifest["artifacts"]
            x, y = e["size_bytes"] / MIB, max(m["kld_mean"], 1e-6)
            ax.scatter([x], [y], marker="o" if published else "x", color=f"C{i}" if published else "red", zorder=3,
                       label=es if published else None)
            ax.annotate(e["file"].removeprefix(manifest["name"] + "-").removesuffix(".gguf"), (x, y),
                        textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("file size (MiB)")
    ax.set_ylabel("mean KL divergence vs " + manifest.get("base_quant_type", "F16") + " (log)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"{manifest['name']}: size vs quality (x = failed gate)")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles, strict=False))
    if uniq:
        ax.legend(uniq.values(), uniq.keys(), title="eval set", fontsize=8)
    fig.tight_layout()
    with atomic_output(out) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)


def _eval_desc(manifest: dict) -> str:
    out = []
    for es in manifest.get("eval_sets", []):
        out.append(f"- **{es['name']}**: `{es['text']}` (SHA256 `{es['text_sha256'][:16]}…`), ctx {es['ctx']}, "
                   f"{es['chunks']} chunks ({es['scored_tokens']} scored tokens); KLD against the "
                   f"{manifest.get('base_quant_type', 'F16')} file with `llama-perplexity --kl-divergence`")
    return "\n".join(out)


def draft_table(manifest: dict) -> str:
    d = manifest.get("draft")
    if not d:
        return ""
    agree = d.get("top1_agreement", {})
    lines = [f"Draft-eval text `{d['eval_text']}`; draft lengths measured: {', '.join(map(str, d['n_max']))}.", "",
             "| main | draft | vocab | acceptance | best n_max | top-1 agreement | deploy |", "|---|---|---|---|---|---|---|"]
    for p in d["pairs"]:
        a = p.get("acceptance") or {}
        ag = agree.get(p["draft"], {})
        vocab = "compatible" + (f" ({len(p['warnings'])} warning(s))" if p["warnings"] else "") if p["compatible"] \
            else f"INCOMPATIBLE ({p['rule']}): {p['reason']}"
        lines.append(f"| `{p['main']}` | `{p['draft']}` | {vocab} | "
                     f"{_fmt(a.get('acceptance_rate'), '.3f')} ({a.get('accepted', '–')}/{a.get('drafted', '–')}) | "
                     f"{a.get('best_n_max', '–')} | {_fmt(ag.get('top1_agreement'), '.4f')} | "
                     f"`{p.get('deploy', '–')}` |")
    return "\n".join(lines)


def mtp_text(manifest: dict) -> str:
    """What the build did with multi-token-prediction heads (recipe ``mtp: strip | separate``)."""
    m = manifest.get("mtp")
    if not m:
        return ""
    if m["mode"] == "strip":
        return "Multi-token-prediction (MTP) heads were left out of every file on purpose (recipe `mtp: strip`)."
    d = next(e for e in manifest["artifacts"] if e.get("role") == "mtp-draft")
    lines = [f"The multi-token-prediction (MTP) heads are not in the model files: they are published alone as "
             f"{_file_cell(d)} ({d['quant_type']}, {d['size_bytes'] / MIB:.1f} MiB, {d['mtp']['tensors']} nextn tensors "
             f"on layer(s) {', '.join(map(str, d['mtp']['layers']))}), a draft for llama.cpp's speculative decoding "
             "with any of the files above:", "", "```sh", *m["deploy"], "```"]
    return "\n".join(lines)


def write_report(manifest: dict, out_md: str | Path, out_png: str | Path) -> None:
    plot(manifest, out_png)
    parts = [f"# {manifest['name']}: quantization report", "",
             f"Build `{manifest['build_id']}` · llama.cpp b{manifest['tools']['llama_cpp_build']} · "
             f"built {manifest['build']['timestamp']}", ""]
    sets = [es["name"] for es in manifest.get("eval_sets", [])] or [None]
    if manifest.get("eval_sets"):
        parts += ["Eval sets:", _eval_desc(manifest), ""]
    for es in sets:
        if es:
            parts += [f"## Eval set `{es}`", ""]
        parts += [markdown_table(manifest, es, speed=True), ""]
    if manifest.get("mtp"):
        parts += ["## MTP heads", "", mtp_text(manifest), ""]
    if manifest.get("draft"):
        parts += ["## Draft model (speculative decoding)", "", draft_table(manifest), ""]
    parts += ["pp/tg t/s: `llama-bench` prompt processing / generation tokens/s on the build box (CPU), same "
              "threads for all quants: build-box figures, not device speed.", "", f"![size vs mean KLD]({Path(out_png).name})", ""]
    write_text_atomic(out_md, "\n".join(parts))


def write_card(manifest: dict, out: str | Path) -> None:
    """HF-style model card README.md: front matter, quality table, how to run each file."""
    src = manifest.get("source", {})
    meta = manifest.get("gguf_metadata", {})
    front = ["---"]
    if src.get("repo"):
        front.append(f"base_model: {src['repo']}")
    if meta.get("general.license"):
        front.append(f"license: {meta['general.license']}")
    front += ["tags:", "  - gguf", "  - llama.cpp", f"quantized_by: {meta.get('general.quantized_by', 'ggufpipe')}",
              "library_name: gguf", "---", ""]
    base = src.get("repo") or manifest["name"]
    origin = (f"GGUF quantizations of [{base}](https://huggingface.co/{base}) at commit `{src.get('commit', '')}`"
              if src.get("repo") else f"GGUF files of {base}")
    body = [f"# {manifest['name']} — GGUF", "",
            f"{origin}, built by ggufpipe with llama.cpp b{manifest['tools']['llama_cpp_build']} "
            f"({manifest['tools']['llama_cpp_commit']}). Build `{manifest['build_id']}`; every file's SHA256 is in "
            "`manifest.json`.", ""]
    sets = [es["name"] for es in manifest.get("eval_sets", [])] or [None]
    if manifest.get("eval_sets"):
        body += ["Quality against the unquantized file:", _eval_desc(manifest), ""]
    for es in sets:
        if es and len(sets) > 1:
            body += [f"### {es}", ""]
        body += [markdown_table(manifest, es, speed=False), ""]
    body += ["## Run with llama.cpp", "", "```sh"]
    models = [e for e in manifest["artifacts"] if e.get("role") != "mtp-draft"]
    for e in models:
        body.append(f"llama-cli -m {model_path(e)} -cnv            # {e['quant_type']}")
    first = model_path(models[-1])
    body += ["```", "", "Serve one file over HTTP (OpenAI-compatible API):", "", "```sh",
             f"llama-server -m {first} --port 8080", "```", ""]
    split = [e for e in models if e.get("split")]
    if split:
        body += ["Split files are folders of `llama-gguf-split` shards: download the whole folder and give llama.cpp "
                 "its first shard (it finds the others beside it). `ggufpipe verify <folder>` checks every shard; "
                 "`llama-gguf-split --merge <first shard> <out>.gguf` makes one file again.", ""]
    if manifest.get("mtp"):
        body += ["## MTP heads", "", mtp_text(manifest), ""]
    if manifest.get("ollama"):
        name = manifest["name"]
        body += ["## Run with Ollama", "", "Each file has an Ollama Modelfile beside it (`FROM ./<file>`, stop tokens, the "
                 "chat template for ChatML models). Download the GGUF and its Modelfile into one folder, then:", "", "```sh"]
        for m in manifest["ollama"]:
            key = m["file"].removeprefix("Modelfile.")
            body.append(f"ollama create {name}:{key.lower()} -f {m['file']} && ollama run {name}:{key.lower()}")
        body += ["```", ""]
    if manifest.get("ollama") is not None and split:
        body += ["Split files have no Modelfile: Ollama imports single GGUF files only; merge the shards first "
                 "(`llama-gguf-split --merge`).", ""]
    if manifest.get("draft"):
        body += ["## Speculative decoding with the draft model", "", draft_table(manifest), ""]
    write_text_atomic(out, "\n".join(front + body))
