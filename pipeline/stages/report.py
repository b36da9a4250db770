"""Human-readable outputs of a recipe: report (markdown table + size-vs-KLD plot) and model card."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from pipeline.fsutil import write_text_atomic
from pipeline.recipe.naming import hub_label
from pipeline.stages.report_axes import axis, eval_desc, length_table
from pipeline.stages.report_devices import device_check_text, fits_table, launch_table
from pipeline.stages.report_mix import mixes_markdown, pareto_front, write_heatmaps
from pipeline.stages.report_speedup import PLOT_FILE, write_speedup_plot
from pipeline.stages.split import model_path

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
                f"{f['unreadable']} (not a finite number)" if f.get("unreadable") else
                f"{f['metric']} {f['value']:.4g} vs {f['threshold']} {f['limit']:.4g}"
                for f in e.get("failures", []) if f.get("eval_set") == eval_set)
        yield e, m, b, verdict


def label(entry: dict) -> str | None:
    """The Hub's label of a model file (pipeline/recipe/naming.py ``hub_label``; a split file: its first shard's)."""
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
    """What the plot shows: (eval set index, eval set, label, size MiB, mean KLD, published, mix) per quant and set."""
    out = []
    for i, es in enumerate(es["name"] for es in manifest.get("eval_sets", [])):
        for e, m, _b, _v in _rows(manifest, es):
            if e.get("role") == "base" or "kld_mean" not in m:
                continue
            out.append((i, es, e["file"].removeprefix(manifest["name"] + "-").removesuffix(".gguf"),
                        e["size_bytes"] / MIB, max(m["kld_mean"], 1e-6), e in manifest["artifacts"], bool(e.get("mix"))))
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


KV_PLOT = "kv.svg"


def kv_points(manifest: dict) -> list[tuple]:
    """The KV plot's points (as :func:`plot_points`, a KV type for an eval set): file plus KV cache bytes at the
    ``kv_costs`` context (MiB) and mean KLD per quant and KV type; outside the thresholds drawn as a failed quant."""
    kc = manifest.get("kv_costs") or {"rows": []}
    types = list(dict.fromkeys(r["kv_type"] for r in kc["rows"]))
    return [(types.index(r["kv_type"]), f"KV {r['kv_type']}",
             r["file"].removeprefix(manifest["name"] + "-").removesuffix(".gguf"),
             (r["file_bytes"] + r["kv_bytes"]) / MIB, max(r["kld_mean"], 1e-6), r["inside"], False) for r in kc["rows"]]


def kv_table(manifest: dict, short: bool = False) -> str:
    """The report's KV-cache table (manifest ``kv_costs``); ``short`` (the card): mean KLD per file and KV type.
    Empty without it."""
    kc = manifest.get("kv_costs")
    if not kc:
        return ""
    if short:
        types = list(dict.fromkeys(r["kv_type"] for r in kc["rows"]))
        cell = {(r["file"], r["kv_type"]): f"{r['kld_mean']:.4f}" + ("" if r["inside"] else " ✗") for r in kc["rows"]}
        files = list(dict.fromkeys(r["file"] for r in kc["rows"]))
        return "\n".join([f"Mean KLD on `{kc['eval_set']}` with each KV cache type (`-ctk/-ctv`); ✗: outside the "
                          "file's thresholds.", "", "| file | " + " | ".join(types) + " |", "|---|" + "---|" * len(types),
                          *(f"| `{f}` | " + " | ".join(cell[f, t] for t in types) + " |" for f in files)])
    where = f"device `{kc['device']}`'s ctx {kc['ctx']}" if kc["device"] else f"ctx {kc['ctx']}"
    lines = [f"Each quant measured with a quantized KV cache (`-ctk/-ctv`) on eval set `{kc['eval_set']}`, against the "
             f"same base logits (F16 file, f16 cache). Memory: the file plus the KV cache at {where} "
             "(`pipeline/memory.py`). Inside: within the quant's own thresholds (a device with `kv_type: auto` takes "
             "the smallest type inside for every quant).", "",
             "| file | KV | file + KV (MiB) | mean KLD | same top p | inside |", "|---|---|---|---|---|---|"]
    lines += [f"| `{r['file']}` | {r['kv_type']} | {(r['file_bytes'] + r['kv_bytes']) / MIB:.1f} | "
              f"{r['kld_mean']:.5f} | {100 * r['same_top_p']:.2f} % | {'✓' if r['inside'] else '✗'} |"
              for r in kc["rows"]]
    return "\n".join(lines)


def render_plot(manifest: dict, width: int = 700, height: int = 450, points: list[tuple] | None = None,
                title: str = "size vs quality (x = failed gate)", xlabel: str = "file size (MiB)",
                legend: str = "eval set") -> str:
    """SVG text: file size (MiB, linear) against mean KLD (log) per quant and eval set, the usual Pareto
    picture: stock types as dots, measured mixes as diamonds, a failed quant as a red x, and per eval set the Pareto
    front of the published files (none smaller and closer at once) as a dashed line. Drawn here, not with matplotlib, whose import alone took 0.4 s of
    every publish; the output is plain text, byte-identical for identical inputs. ``points``: another plot's (the KV
    types', :func:`kv_points`), with its ``title``, ``xlabel`` and ``legend``."""
    from xml.sax.saxutils import escape

    points = plot_points(manifest) if points is None else points
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
    for i in sorted({p[0] for p in points}):  # the Pareto front of each eval set's published files
        pub = [p for p in points if p[0] == i and p[5]]
        front = [pub[k] for k in pareto_front([(p[3], p[4]) for p in pub])]
        if len(front) > 1:
            xy = " ".join(f"{round(px(p[3]), 2)},{round(py(p[4]), 2)}" for p in front)
            out.append(f'<polyline points="{xy}" fill="none" stroke="{COLORS[i % len(COLORS)]}" stroke-width="1.2" '
                       'stroke-dasharray="5,3"/>')
    for i, _es, label, x, y, published, mix in points:
        cx, cy = round(px(x), 2), round(py(y), 2)
        if published and mix:
            out.append(f'<path d="M{cx},{cy - 6}L{cx + 6},{cy}L{cx},{cy + 6}L{cx - 6},{cy}Z" '
                       f'fill="{COLORS[i % len(COLORS)]}" stroke="#000" stroke-width="0.8"/>')
        elif published:
            out.append(f'<circle cx="{cx}" cy="{cy}" r="4.5" fill="{COLORS[i % len(COLORS)]}"/>')
        else:
            out.append(f'<path d="M{cx - 4},{cy - 4}L{cx + 4},{cy + 4}M{cx - 4},{cy + 4}L{cx + 4},{cy - 4}" '
                       'stroke="red" stroke-width="2"/>')
        end = x > mid  # labels of the right half extend to the left, inside the axes
        anchor = ' text-anchor="end"' if end else ""
        out.append(f'<text x="{cx - 6 if end else cx + 6}" y="{cy - 6}" font-size="10"{anchor}>{escape(label)}</text>')
    base = manifest.get("base_quant_type", "F16")
    out.append(f'<text x="{(left + right) / 2}" y="{top - 14}" text-anchor="middle" font-size="14">'
               f'{escape(manifest["name"])}: {escape(title)}</text>')
    out.append(f'<text x="{(left + right) / 2}" y="{height - 12}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(f'<text transform="translate(18,{(top + bottom) / 2}) rotate(-90)" text-anchor="middle">'
               f'mean KL divergence vs {escape(base)} (log)</text>')
    sets = list(dict.fromkeys((i, es) for i, es, *_ in points))
    if sets:
        extra = ["Pareto front"] + (["measured mix"] if any(p[6] for p in points) else [])
        w = 12 + 8 * max(len(legend), *(len(es) for _, es in sets), *map(len, extra)) + 18
        h = 24 + 16 * (len(sets) + len(extra))
        lx, ly = right - w - 8, top + 8
        out.append(f'<rect x="{lx}" y="{ly}" width="{w}" height="{h}" fill="white" stroke="#ccc" rx="3"/>')
        out.append(f'<text x="{lx + w / 2}" y="{ly + 15}" text-anchor="middle">{escape(legend)}</text>')
        for k, (i, es) in enumerate(sets):
            yy = ly + 30 + 16 * k
            out.append(f'<circle cx="{lx + 12}" cy="{yy - 4}" r="4.5" fill="{COLORS[i % len(COLORS)]}"/>')
            out.append(f'<text x="{lx + 24}" y="{yy}" font-size="11">{escape(es)}</text>')
        yy = ly + 30 + 16 * len(sets)
        out.append(f'<line x1="{lx + 4}" y1="{yy - 4}" x2="{lx + 20}" y2="{yy - 4}" stroke="#444" stroke-dasharray="5,3"/>'
                   f'<text x="{lx + 24}" y="{yy}" font-size="11">Pareto front</text>')
        if len(extra) > 1:
            yy += 16
            out.append(f'<path d="M{lx + 12},{yy - 10}L{lx + 18},{yy - 4}L{lx + 12},{yy + 2}L{lx + 6},{yy - 4}Z" '
                       f'fill="#fff" stroke="#000" stroke-width="0.8"/><text x="{lx + 24}" y="{yy}" font-size="11">'
                       'measured mix</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def draft_table(manifest: dict) -> str:
    d = manifest.get("draft")
    if not d:
        return ""
    agree = d.get("top1_agreement", {})
    speed = (manifest.get("build") or {}).get("draft_speedup") or {}
    lines = [f"Draft-eval text `{d['eval_text']}`; draft lengths measured: {', '.join(map(str, d['n_max']))}.", "",
             "| main | draft | vocab | acceptance | n_max | top-1 agreement | speed-up (interval) | deploy |",
             "|---|---|---|---|---|---|---|---|"]
    for p in d["pairs"]:
        a = p.get("acceptance") or {}
        ag = agree.get(p["draft"], {})
        sp = speed.get(f"{p['main']} + {p['draft']}") or {}
        vocab = "compatible" + (f" ({len(p['warnings'])} warning(s))" if p["warnings"] else "") if p["compatible"] \
            else f"INCOMPATIBLE ({p['rule']}): {p['reason']}"
        lines.append(f"| `{p['main']}` | `{p['draft']}` | {vocab} | "
                     f"{_fmt(a.get('acceptance_rate'), '.3f')} ({a.get('accepted', '–')}/{a.get('drafted', '–')}) | "
                     f"{sp.get('best_n_max', a.get('best_n_max', '–'))} | {_fmt(ag.get('top1_agreement'), '.4f')} | "
                     f"{_speedup_cell(sp)} | {_deploy_cell(p, sp)} |")
    if d.get("speedup"):  # draft.speedup: false
        lines += ["", f"Speed-up {d['speedup']}."]
    lines += speedup_lines(speed)
    run = [p["acceptance"]["command"] for p in d["pairs"] if (p.get("acceptance") or {}).get("command")]
    if run:  # each deploy line is the leading arguments of the command the acceptance stage ran
        lines += ["", "Measured with (greedy, at each pair's best draft length; llama-server takes the same "
                      "speculative arguments):", "", "```sh", *run, "```"]
    served = [(p["acceptance"]["served"]) for p in d["pairs"] if (p.get("acceptance") or {}).get("served")]
    if served:  # the deploy lines themselves, run by llama-server on the published files (pipeline/stages/draft.py)
        lines += ["", "Each deploy line was run by `llama-server` on these files (one greedy completion):", ""]
        lines += [f"- `{s['command']}`: {s['predicted_n']} tokens, {s['draft_n_accepted']} of {s['draft_n']} drafted "
                  "accepted" for s in served]
    if d.get("mtp"):
        lines += ["", "The draft is the model's own multi-token-prediction heads (`--spec-type draft-mtp`)."]
    return "\n".join(lines)


def _speedup_cell(sp: dict) -> str:
    if not sp:
        return "–"
    if "skipped" in sp:
        return sp["skipped"]
    lo, hi = sp["interval"]
    return f"{sp['speedup']:.2f}x ({lo:.2f}-{hi:.2f})"


def _deploy_cell(p: dict, sp: dict) -> str:
    """The measured decision: the line where the whole interval is above 1, else the verdict; an unmeasured line says
    so."""
    if sp.get("deploy"):
        return f"`{sp['deploy']}`"
    if sp.get("verdict"):
        return sp["verdict"]
    return f"`{p['deploy']}` (speed-up not measured)" if p.get("deploy") else "–"


def speedup_lines(speed: dict) -> list[str]:
    """Per pair: decode t/s without and with the draft, and the speed-up (median, min-max over rounds), against the
    draft length; then the chosen length sampled and with concurrent requests."""
    out = []
    for label, sp in speed.items():
        if "by_n_max" not in sp:
            continue
        out += ["", f"Speed-up of `{label}` on {sp['box']} (llama-server, {sp['rounds']} rounds alternating with and "
                    f"without the draft, {sp['prompts']} prompt(s) x {sp['n_predict']} tokens, -t {sp['threads']}; "
                    "build-box figures, volatile):", "",
                "| condition (-np 1 unless said) | n_max | t/s without | t/s with | speed-up (min-max) | acceptance |", "|---|---|---|---|---|---|"]
        rows = [(f"greedy{' (chosen)' if int(n) == sp['best_n_max'] else ''}", n, c) for n, c in sp["by_n_max"].items()]
        tuning = sp.get("tuning") or {}
        rows += [("greedy, tuning rounds" + ("" if k.startswith("n_max") else f", {k}")
                  + (" (chosen)" if k == tuning["chosen"] else ""), sp["best_n_max"], c)
                 for k, c in tuning.get("by_config", {}).items()]
        rows.append((f"sampled, temperature {sp['sampled']['temperature']:g}, seed {sp['sampled']['seed']}",
                     sp["best_n_max"], sp["sampled"]))
        if sp.get("concurrent"):  # `parallel` slots (-np) and as many requests at once
            rows.append((f"-np {sp['concurrent']['parallel']}, {sp['concurrent']['parallel']} concurrent requests",
                         sp["best_n_max"], sp["concurrent"]))
        for what, n, c in rows:
            med = statistics.median
            out.append(f"| {what} | {n} | {med(c['baseline_tokens_per_s']):.1f} | {med(c['tokens_per_s']):.1f} | "
                       f"{c['speedup']:.2f}x ({c['interval'][0]:.2f}-{c['interval'][1]:.2f}) | "
                       f"{c['acceptance_rate']:.3f} |")
        out += ["", f"Baseline: `{sp['baseline']}`; with the draft: `{sp['command']}`."]
    if out:
        out += ["", f"![measured speed-up against the draft length]({PLOT_FILE})"]
    return out


def _mtp_lines(manifest: dict) -> list[str]:
    """The MTP draft's deploy lines: when the recipe measures the heads (``draft: {mtp: true}``), the measured ones
    (a measured speed-up's only where it helps: maybe none), else the manifest's ``mtp.deploy``."""
    d = manifest.get("draft") or {}
    if not d.get("mtp"):
        return manifest["mtp"]["deploy"]
    speed = (manifest.get("build") or {}).get("draft_speedup") or {}
    if speed:
        return [sp["deploy"] for sp in speed.values() if sp.get("deploy")]
    return [p["deploy"] for p in d.get("pairs", []) if p.get("deploy")] or manifest["mtp"]["deploy"]


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
             "with any of the files above:", ""]
    run = _mtp_lines(manifest)
    lines += ["```sh", *run, "```"] if run else [
        "No deploy line: with the heads the files decoded no faster than without on the build box (the speed-ups "
        "below)."]
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
    for cause, v in ((c.get("checks", {}).get("tokenizer") or {}).get("causes") or {}).items():
        share = "; ".join(f"{cause.upper()} changes {s:.2%} of {t}" for t, s in (v.get("text_share") or {}).items())
        share = f" ({share})" if share else ""
        if cause == "nfc" and v["status"] == "known limitation":
            lines += ["", f"**Send NFC-normalized text.** The Hugging Face tokenizer normalizes its input to Unicode "
                          f"NFC and llama.cpp's does not (a known llama.cpp limitation), so text that is not NFC, "
                          f"such as a decomposed `e` + U+0301, tokenizes differently{share}."]
        elif v["status"] == "accepted":
            lines += ["", f"**Known difference, accepted by the recipe (`conformance.accept`): {cause}.** Text it "
                          f"touches tokenizes differently in llama.cpp than in the Hugging Face tokenizer{share}; "
                          f"probes: {', '.join(v['probes'])}."]
    for w in c.get("warnings", []):
        lines += ["", f"Warning: {w}"]
    overrides = manifest.get("vocab_overrides")
    if overrides:
        parts = [f"chat template (SHA256 {overrides['chat_template']['sha256'][:16]}…)"] if "chat_template" in overrides else []
        parts += [f"end-of-generation ids {overrides['eos_token_ids']}"] if "eos_token_ids" in overrides else []
        parts += [f"add_bos {str(overrides['add_bos']).lower()}"] if "add_bos" in overrides else []
        parts += [f"pre-tokenizer {overrides['tokenizer_pre']}"] if "tokenizer_pre" in overrides else []
        lines += ["", f"Written into every file by the recipe (fix path): {', '.join(parts)}."]
    return "\n".join(lines)


def expert_coverage_text(manifest: dict) -> str:
    """Per importance matrix of a mixture-of-experts model: each layer's experts the calibration text reached
    (pipeline/stages/imatrix_coverage.py). Empty for dense models."""
    seen, lines = set(), []
    for e in manifest.get("artifacts", []) + manifest.get("rejected", []):
        imx = (e.get("calibration") or {}).get("imatrix") or {}
        if not imx.get("experts") or imx["file"] in seen:
            continue
        seen.add(imx["file"])
        gate = imx.get("min_expert_coverage")
        lines += [f"`{imx['file']}` ({imx['calibration']}, {imx['chunks']} x {imx['ctx']} tokens; a covered expert got "
                  f"at least {imx.get('min_expert_tokens', 1)} routed token(s); "
                  + (f"gate: at least {gate:g} of each layer's experts)" if gate is not None else "not gated)"), "",
                  "| layer | experts covered | fraction | cold experts | tokens per expert (min-max) |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['layer']} | {r['covered']}/{r['experts']} | {r['fraction']:.3f} | "
                  f"{', '.join(map(str, r['cold'])) or '–'} | {r['min_tokens']}-{r['max_tokens']} |" for r in imx["experts"]]
        lines.append("")
    return "\n".join(lines).rstrip()


def write_report(manifest: dict, out_md: str | Path, out_svg: str | Path, measured: list[dict] | None = None) -> None:
    """report.md, its plot (report.svg) and, with measured mixes, the sensitivity heat maps beside them."""
    write_text_atomic(out_svg, render_plot(manifest))
    write_heatmaps(manifest, Path(out_svg).parent)
    write_speedup_plot(manifest, Path(out_svg).parent)
    parts = [f"# {manifest['name']}: quantization report", "",
             f"Build `{manifest['build_id']}` · llama.cpp b{manifest['tools']['llama_cpp_build']} · "
             f"built {manifest['build']['timestamp']}", ""]
    sets = [es["name"] for es in manifest.get("eval_sets", [])] or [None]
    if manifest.get("eval_sets"):
        parts += ["Eval sets:", eval_desc(manifest), ""]
    axes = {es["name"]: axis(es) for es in manifest.get("eval_sets", [])}
    for es in sets:
        if es:
            parts += [f"## Eval set `{es}`: {axes[es]}", ""]
        parts += [markdown_table(manifest, es, speed=True), ""]
    lengths = length_table(manifest)
    if lengths:
        parts += ["## KLD per context length", "", lengths, ""]
    mixes = mixes_markdown(manifest)
    if mixes:
        parts += ["## Measured mixes", "", mixes, ""]
    coverage = expert_coverage_text(manifest)
    if coverage:
        parts += ["## Expert coverage", "", coverage, ""]
    kv = kv_table(manifest)
    if kv:
        kc = manifest["kv_costs"]
        write_text_atomic(Path(out_svg).parent / KV_PLOT, render_plot(
            manifest, points=kv_points(manifest), title="size + KV cache vs quality (x = outside thresholds)",
            xlabel=f"file + KV cache at ctx {kc['ctx']} (MiB)", legend="KV cache"))
        parts += ["## KV cache types", "", kv, "", f"![file + KV cache vs mean KLD]({KV_PLOT})", ""]
    else:
        (Path(out_svg).parent / KV_PLOT).unlink(missing_ok=True)  # a recipe that no longer measures KV types
    fits = fits_table(manifest)
    if fits:
        parts += ["## Fits on", "", fits, ""]
    launch = launch_table(manifest)
    if launch:
        parts += ["## Launch on a device", "", launch, ""]
    on_device = device_check_text(manifest, measured)
    if on_device:
        parts += ["## On-device check", "", on_device, ""]
    if manifest.get("conformance"):
        parts += ["## Conformance", "", conformance_text(manifest), ""]
    if manifest.get("mtp"):
        parts += ["## MTP heads", "", mtp_text(manifest), ""]
    if manifest.get("draft"):
        title = "MTP heads as the draft" if manifest["draft"].get("mtp") else "Draft model"
        parts += [f"## {title} (speculative decoding)", "", draft_table(manifest), ""]
    parts += ["pp/tg t/s: `llama-bench` prompt processing / generation tokens/s on the build box (CPU), same "
              "threads for all quants: build-box figures, not device speed.", "", f"![size vs mean KLD]({Path(out_svg).name})", ""]
    write_text_atomic(out_md, "\n".join(parts))
