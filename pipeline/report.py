"""Human-readable outputs of a recipe: report (markdown table + size-vs-KLD plot) and model card."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from .fsutil import write_text_atomic
from .naming import hub_label
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


def label(entry: dict) -> str | None:
    """The Hub's label of a model file (pipeline/naming.py ``hub_label``; a split file: its first shard's)."""
    return hub_label(model_path(entry) if (entry.get("split") or {}).get("shards") else entry["file"])


def markdown_table(manifest: dict, eval_set: str | None, speed: bool = True, labels: bool = False) -> str:
    """The quality table; ``labels``: the Hub label first (the card), in place of the quant type (the report)."""
    head = ["label" if labels else "quant", "file", "size MiB", "bpw", "PPL", "PPL ratio", "mean KLD", "99% KLD",
            "same top p"]
    if speed:
        head += ["pp t/s", "tg t/s"]
    head.append("gate")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e, m, b, verdict in _rows(manifest, eval_set):
        is_base = e.get("role") == "base"
        ppl = m.get("ppl_q") if not is_base else (manifest.get("eval_base", {}).get(eval_set, {}) or {}).get("ppl")
        quant = e["quant_type"] + (f" ({e['requested']['variant']})" if e.get("requested", {}).get("variant") else "")
        cells = [(f"`{lab}`" if (lab := label(e)) else quant) if labels else quant,
                 _file_cell(e), f"{e['size_bytes'] / MIB:.1f}", f"{e['bits_per_weight']:.2f}",
                 _fmt(ppl, ".3f"), "1" if is_base else _fmt(m.get("ppl_ratio"), ".4f"),
                 "0" if is_base else _fmt(m.get("kld_mean"), ".5f"), "0" if is_base else _fmt(m.get("kld_p99"), ".4f"),
                 "100%" if is_base else (_fmt(m["same_top_p"] * 100, ".2f") + "%" if "same_top_p" in m else "–")]
        if speed:
            cells += [_fmt(b.get("pp_tokens_per_s"), ".1f"), _fmt(b.get("tg_tokens_per_s"), ".1f")]
        cells.append(verdict)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_points(manifest: dict) -> list[tuple]:
    """What the plot shows: (eval set index, eval set, label, size MiB, mean KLD, published) per quant and set."""
    out = []
    for i, es in enumerate(es["name"] for es in manifest.get("eval_sets", [])):
        for e, m, _b, _v in _rows(manifest, es):
            if e.get("role") == "base" or "kld_mean" not in m:
                continue
            out.append((i, es, e["file"].removeprefix(manifest["name"] + "-").removesuffix(".gguf"),
                        e["size_bytes"] / MIB, max(m["kld_mean"], 1e-6), e in manifest["artifacts"]))
    return out


# matplotlib's tab10, the colours of the eval sets
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")


def _nice_step(span: float, n: int = 6) -> float:
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def _num(v: float) -> str:
    return f"{v:.6g}"


def render_plot(manifest: dict, width: int = 700, height: int = 450) -> str:
    """SVG text: file size (MiB, linear) against mean KLD (log) per quant and eval set, the usual Pareto
    picture; a failed quant is a red x. Drawn here, not with matplotlib, whose import alone took 0.4 s of
    every publish; the output is plain text, byte-identical for identical inputs."""
    from xml.sax.saxutils import escape

    points = plot_points(manifest)
    left, right, top, bottom = 78, width - 20, 40, height - 50
    xs = [p[3] for p in points] or [0.0, 1.0]
    ys = [p[4] for p in points] or [1e-3, 1e-1]
    x0, x1 = min(xs), max(xs)
    pad = (x1 - x0) * 0.06 or max(abs(x0) * 0.05, 1.0)
    x0, x1 = x0 - pad, x1 + pad
    step = _nice_step(x1 - x0)
    l0, l1 = math.log10(min(ys)), math.log10(max(ys))
    lpad = (l1 - l0) * 0.08 or 0.15
    l0, l1 = l0 - lpad, l1 + lpad

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (right - left)

    def py(y: float) -> float:
        return bottom - (math.log10(y) - l0) / (l1 - l0) * (bottom - top)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    grid = 'stroke="#000" stroke-opacity="0.12"'
    # x: linear ticks
    t = math.ceil(x0 / step) * step
    while t <= x1 + 1e-9:
        x = round(px(t), 2)
        out.append(f'<line x1="{x}" y1="{top}" x2="{x}" y2="{bottom}" {grid}/>')
        out.append(f'<text x="{x}" y="{bottom + 17}" text-anchor="middle">{_num(round(t, 9))}</text>')
        t += step
    # y: log ticks, decades labelled; 2x and 5x too when the range holds fewer than two decades, and more
    # under 1.2 decades
    decades = range(math.floor(l0), math.ceil(l1) + 1)
    labelled = {1}
    if sum(1 for d in decades if l0 <= d <= l1) < 2:
        labelled = {1, 2, 3, 4, 5, 6, 8} if l1 - l0 < 1.2 else {1, 2, 5}
    for d in decades:
        for m in range(1, 10):
            v = m * 10.0 ** d
            if not l0 <= math.log10(v) <= l1:
                continue
            y = round(py(v), 2)
            out.append(f'<line x1="{left}" y1="{y}" x2="{right}" y2="{y}" {grid}'
                       + ('' if m == 1 else ' stroke-dasharray="2,3"') + '/>')
            if m in labelled:
                lab = f'{m}×10' if m > 1 else '10'
                out.append(f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{lab}'
                           f'<tspan dy="-6" font-size="9">{d}</tspan></text>')
    out.append(f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="none" stroke="#000"/>')
    mid = (min(xs) + max(xs)) / 2
    for i, _es, label, x, y, published in points:
        cx, cy = round(px(x), 2), round(py(y), 2)
        if published:
            out.append(f'<circle cx="{cx}" cy="{cy}" r="4.5" fill="{COLORS[i % len(COLORS)]}"/>')
        else:
            out.append(f'<path d="M{cx - 4},{cy - 4}L{cx + 4},{cy + 4}M{cx - 4},{cy + 4}L{cx + 4},{cy - 4}" '
                       'stroke="red" stroke-width="2"/>')
        end = x > mid  # labels of the right half extend to the left, inside the axes
        anchor = ' text-anchor="end"' if end else ""
        out.append(f'<text x="{cx - 6 if end else cx + 6}" y="{cy - 6}" font-size="10"{anchor}>{escape(label)}</text>')
    base = manifest.get("base_quant_type", "F16")
    out.append(f'<text x="{(left + right) / 2}" y="{top - 14}" text-anchor="middle" font-size="14">'
               f'{escape(manifest["name"])}: size vs quality (x = failed gate)</text>')
    out.append(f'<text x="{(left + right) / 2}" y="{height - 12}" text-anchor="middle">file size (MiB)</text>')
    out.append(f'<text transform="translate(18,{(top + bottom) / 2}) rotate(-90)" text-anchor="middle">'
               f'mean KL divergence vs {escape(base)} (log)</text>')
    sets = list(dict.fromkeys((i, es) for i, es, *_ in points))
    if sets:
        w, h = 12 + 8 * max(len("eval set"), *(len(es) for _, es in sets)) + 18, 24 + 16 * len(sets)
        lx, ly = right - w - 8, top + 8
        out.append(f'<rect x="{lx}" y="{ly}" width="{w}" height="{h}" fill="white" stroke="#ccc" rx="3"/>')
        out.append(f'<text x="{lx + w / 2}" y="{ly + 15}" text-anchor="middle">eval set</text>')
        for k, (i, es) in enumerate(sets):
            yy = ly + 30 + 16 * k
            out.append(f'<circle cx="{lx + 12}" cy="{yy - 4}" r="4.5" fill="{COLORS[i % len(COLORS)]}"/>')
            out.append(f'<text x="{lx + 24}" y="{yy}" font-size="11">{escape(es)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


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


def conformance_text(manifest: dict) -> str:
    """The conformance verdict of the base file against the HF model, a line per check (recipe ``conformance:``)."""
    c = manifest.get("conformance")
    if not c:
        return ""
    if c.get("skipped"):
        return f"Not checked against the Hugging Face model: {c['skipped']}."
    verdict = "passed" if c.get("passed") else "**failed: no file is published**"
    lines = [f"The {manifest.get('base_quant_type', 'F16')} file against the Hugging Face model it was converted "
             f"from, before any quant is measured against it: {verdict}.", "", "| check | verdict | measured |",
             "|---|---|---|"]
    for name, check in c.get("checks", {}).items():
        mark = "not run" if check.get("not_run") else ("pass" if check.get("passed") else "FAIL")
        lines.append(f"| {name} | {mark} | {check.get('summary') or check.get('not_run') or ''} |")
    for w in c.get("warnings", []):
        lines += ["", f"Warning: {w}"]
    overrides = manifest.get("vocab_overrides")
    if overrides:
        parts = [f"chat template (SHA256 {overrides['chat_template']['sha256'][:16]}…)"] if "chat_template" in overrides else []
        parts += [f"end-of-generation ids {overrides['eos_token_ids']}"] if "eos_token_ids" in overrides else []
        parts += [f"add_bos {str(overrides['add_bos']).lower()}"] if "add_bos" in overrides else []
        lines += ["", f"Written into every file by the recipe (fix path): {', '.join(parts)}."]
    return "\n".join(lines)


def write_report(manifest: dict, out_md: str | Path, out_svg: str | Path) -> None:
    """report.md and its plot (report.svg)."""
    write_text_atomic(out_svg, render_plot(manifest))
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
    if manifest.get("conformance"):
        parts += ["## Conformance", "", conformance_text(manifest), ""]
    if manifest.get("mtp"):
        parts += ["## MTP heads", "", mtp_text(manifest), ""]
    if manifest.get("draft"):
        parts += ["## Draft model (speculative decoding)", "", draft_table(manifest), ""]
    parts += ["pp/tg t/s: `llama-bench` prompt processing / generation tokens/s on the build box (CPU), same "
              "threads for all quants: build-box figures, not device speed.", "", f"![size vs mean KLD]({Path(out_svg).name})", ""]
    write_text_atomic(out_md, "\n".join(parts))


# --------------------------------------------------------------------------- the model card

_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+-]*$")


def _yaml(value) -> str:
    """A YAML scalar: plain when YAML reads it back as the same string, else JSON's double-quoted form (valid YAML)."""
    import yaml

    text = str(value)
    return text if _PLAIN.match(text) and yaml.safe_load(text) == text else json.dumps(text, ensure_ascii=False)


def _code(text: str) -> str:
    """``text`` as inline code, fenced with more backticks than it holds."""
    n = max((len(r) for r in re.findall(r"`+", text)), default=0) + 1
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{'`' * n}{pad}{text}{pad}{'`' * n}"


def used_imatrix(manifest: dict) -> bool:
    """Whether any published quant was made with an importance matrix."""
    return any(e.get("requested", {}).get("imatrix") or "imatrix" in (e.get("calibration") or {})
               for e in manifest["artifacts"] if e.get("role") == "quant")


def front_matter(manifest: dict) -> str:
    """The card's YAML front matter, as quantized GGUF repos on the Hub have it: ``base_model`` (the source repo)
    with ``base_model_relation: quantized``, ``license`` (and ``license_name``/``license_link`` for ``other``),
    ``tags`` (``gguf``, ``llama-cpp``, ``imatrix`` when a published quant used one), ``language`` and
    ``pipeline_tag`` (the manifest's ``hub.card``: from the source's model card), ``quantized_by``,
    ``library_name: gguf``. No ``datasets``: no recipe key names a Hub dataset."""
    src = manifest.get("source", {})
    meta = manifest.get("gguf_metadata", {})
    card = (manifest.get("hub") or {}).get("card") or {}
    lic = card.get("license") or meta.get("general.license")
    lines = ["---"]
    if src.get("repo"):
        lines.append(f"base_model: {_yaml(src['repo'])}")
    if lic:
        lines.append(f"license: {_yaml(lic)}")
    lines += ["tags:", "  - gguf", "  - llama-cpp", *(["  - imatrix"] if used_imatrix(manifest) else [])]
    if src.get("repo"):
        lines.append("base_model_relation: quantized")
    lines += [f"{k}: {_yaml(card[k])}" for k in ("license_name", "license_link") if card.get(k)]
    if card.get("language"):
        lines += ["language:", *(f"  - {_yaml(x)}" for x in card["language"])]
    if card.get("pipeline_tag"):
        lines.append(f"pipeline_tag: {_yaml(card['pipeline_tag'])}")
    lines += [f"quantized_by: {_yaml(meta.get('general.quantized_by', 'ggufpipe'))}", "library_name: gguf", "---", ""]
    return "\n".join(lines)


def hub_repo(manifest: dict) -> tuple[str, bool]:
    """(the repo the usage lines name, whether it is a placeholder): ``publish.hf_repo``, else ``<user>/<name>-GGUF``."""
    repo = (manifest.get("hub") or {}).get("repo")
    return (repo, False) if repo else (f"<user>/{manifest['name']}-GGUF", True)


def usage_table(manifest: dict) -> str:
    """One row per published model file: its label, ``llama-cli -hf <repo>:<LABEL>``, ``ollama run
    hf.co/<repo>:<LABEL>`` and the ``huggingface-cli download`` line (a split file: its folder)."""
    models = [e for e in manifest["artifacts"] if e.get("role") != "mtp-draft"]
    if not models:
        return ""
    repo, placeholder = hub_repo(manifest)
    prefix = (manifest.get("hub") or {}).get("path_in_repo") or ""
    prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
    labels = [label(e) for e in models]
    lines = []
    if placeholder:
        lines += [f"`{repo}` is a placeholder: the recipe names no repo (`publish.hf_repo`); put the one these files "
                  "are uploaded to in its place.", ""]
    lines += ["| label | llama.cpp | Ollama | download |", "|---|---|---|---|"]
    for e, lab in zip(models, labels, strict=True):
        path = prefix + e["file"]
        unique = lab is not None and labels.count(lab) == 1
        llama = _code(f"llama-cli -hf {repo}:{lab}") if unique else "– (label not unique: download the file)"
        if e.get("split"):
            ollama = "– (split file: Ollama imports single files)"
        else:
            ollama = _code(f"ollama run hf.co/{repo}:{lab if unique else path}")
        include = f'"{path}/*"' if e.get("split") else path
        lines.append(f"| {_code(lab) if lab else '–'} | {llama} | {ollama} | "
                     f"{_code(f'huggingface-cli download {repo} --include {include}')} |")
    if prefix:
        lines += ["", f"The files are in the repo's folder `{prefix}`: a label also matches the files of any other "
                  "folder of the repo that carry it."]
    return "\n".join(lines)


def prompt_format(manifest: dict) -> str:
    """The prompt format the conformance stage verified (manifest ``hub.chat``): a conversation both engines
    rendered identically, the chat template's family and the end-of-generation texts; or why it is not verified."""
    chat = (manifest.get("hub") or {}).get("chat")
    if chat is None:
        return ""
    c = manifest.get("conformance") or {}
    ct = c.get("checks", {}).get("chat_template", {})
    stops = ", ".join(_code(t) for t in chat.get("stop", []))
    lines = []
    if not chat.get("template"):
        lines.append("The GGUF has no chat template (`tokenizer.chat_template`): a completion model, prompted with "
                     "plain text.")
    else:
        family = ("ChatML (`<|im_start|>` role, newline, content, `<|im_end|>`)" if chat["template"] == "chatml"
                  else "the model's own (not ChatML)")
        lines.append(f"Chat template: {family}, `tokenizer.chat_template` of every file (SHA256 "
                     f"{chat.get('template_sha256', '')[:16]}…).")
        lines.append("")
        if c.get("skipped"):
            lines.append(f"It was not checked against the Hugging Face model: {c['skipped']}.")
        elif ct.get("not_run") or not ct:
            lines.append(f"It was not checked against the Hugging Face model: {ct.get('not_run') or 'no conformance record'}.")
        elif chat.get("sample"):
            s = chat["sample"]
            fence = "`" * max(3, max((len(r) for r in re.findall(r"`+", s["text"])), default=0) + 1)
            lines += [f"Verified: transformers' `apply_chat_template` and llama.cpp's chat engine (`llama-server`, "
                      f"`llama-cli -cnv`) render the conformance conversations identically, text and token ids "
                      f"({ct.get('summary', '')}). The conversation `{s['conversation']}` as both render it (the "
                      "model's reply follows):", "", fence + "text", s["text"].rstrip("\n"), fence]
        elif ct.get("passed"):
            lines.append(f"Verified against the Hugging Face model: {ct.get('summary', 'passed')}.")
    if chat.get("stop_from") == "eog":
        lines += ["", f"Generation ends at llama.cpp's end-of-generation tokens, checked against the Hugging Face "
                  f"`eos_token_id` and the template's turn end: {stops}."]
    elif stops:
        lines += ["", f"Stop texts (the GGUF's EOS/EOT tokens; not checked against the Hugging Face model): {stops}."]
    return "\n".join(lines)


def hub_ollama_text(manifest: dict) -> str:
    """What the Hub's Ollama files (manifest ``hub.files``) are, for the card's Ollama section."""
    hub = manifest.get("hub") or {}
    files = [f["file"] for f in hub.get("files", [])]
    if not files:
        return ""
    chat = hub.get("chat") or {}
    repo, _ = hub_repo(manifest)
    parts = ["`params` (the stop texts above)"] if "params" in files else []
    tf = next((f for f in hub["files"] if f["file"] == "template"), None)
    if tf is not None:
        check = chat.get("ollama_template") or {}
        why = ("the recipe's `publish.ollama_template`" if tf.get("from") == "recipe" else
               f"Ollama's ChatML Go template, which renders the {check.get('checked')} conversation(s) verified by "
               "the conformance stage (plain messages, no tools) exactly as the model's template does")
        parts.append(f"`template` ({why})")
    if "system" in files:
        parts.append("`system` (the chat template's default system prompt)")
    out = [f"`ollama run hf.co/{repo}:<label>` reads the repo's {', '.join(parts)}."]
    if "template" not in files and chat.get("template"):
        check = chat.get("ollama_template") or {}
        if check.get("differ"):
            why = f"Ollama's ChatML template renders {', '.join(check['differ'])} unlike the model's template"
        elif chat["template"] == "chatml":
            why = "no conversation verified by the conformance stage to check Ollama's ChatML template against"
        else:
            why = "the chat template is not ChatML, and no Go translation of it is claimed"
        out.append(f"No `template` ({why}): Ollama picks one matching the GGUF's chat template itself.")
    return " ".join(out)


def card_text(manifest: dict) -> str:
    """The model card README.md: front matter, quality table (the Hub label first), conformance, prompt format,
    the Hub usage lines per label, how to run each file locally, MTP, Ollama and draft sections."""
    src = manifest.get("source", {})
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
        body += [markdown_table(manifest, es, speed=False, labels=True), ""]
    if manifest.get("conformance"):
        body += ["## Conformance", "", conformance_text(manifest), ""]
    prompt = prompt_format(manifest)
    if prompt:
        body += ["## Prompt format", "", prompt, ""]
    usage = usage_table(manifest)
    if usage:
        body += ["## Use from the Hugging Face Hub", "", usage, ""]
    models = [e for e in manifest["artifacts"] if e.get("role") != "mtp-draft"]
    if models:
        body += ["## Run with llama.cpp", "", "Downloaded files, from the folder that holds them:", "", "```sh"]
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
        hub_files = hub_ollama_text(manifest)
        body += ["## Run with Ollama", "", *([hub_files, ""] if hub_files else []),
                 "Each file has an Ollama Modelfile beside it (`FROM ./<file>`, stop tokens, the "
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
    return front_matter(manifest) + "\n".join(body)


def write_card(manifest: dict, out: str | Path) -> None:
    """Write :func:`card_text` to ``out`` (atomically)."""
    write_text_atomic(out, card_text(manifest))
