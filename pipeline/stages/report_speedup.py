"""The report's speed-up plot (``speedup.svg`` beside report.md): per pair the measured speed-up (median over rounds,
bar: min-max) against the draft length, with the line at 1 below which a draft only costs. From the manifest's
volatile ``build.draft_speedup`` (pipeline/stages/speedup.py); no plot when nothing was measured."""

from __future__ import annotations

from pathlib import Path

from pipeline.fsutil import write_text_atomic

PLOT_FILE = "speedup.svg"
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
W, H, LEFT, RIGHT, TOP, BOTTOM = 660, 300, 56, 280, 28, 44


def measured_pairs(manifest: dict) -> dict[str, dict]:
    """The pairs whose speed-up was measured (``by_n_max``), keyed ``<main> + <draft>``."""
    speed = (manifest.get("build") or {}).get("draft_speedup") or {}
    return {k: v for k, v in speed.items() if v.get("by_n_max")}


def render_speedup_plot(manifest: dict) -> str | None:
    pairs = measured_pairs(manifest)
    if not pairs:
        return None
    # xml.sax.saxutils loads urllib.request (slow): only the plot needs it
    from xml.sax.saxutils import escape

    ns = sorted({int(n) for sp in pairs.values() for n in sp["by_n_max"]})
    top = max([1.2] + [c["interval"][1] for sp in pairs.values() for c in sp["by_n_max"].values()]) * 1.1
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(n: int) -> float:
        return LEFT + (pw * (ns.index(n) + 0.5) / len(ns))

    def y(v: float) -> float:
        return TOP + ph * (1 - v / top)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>',
           f'<text x="{LEFT}" y="{TOP - 10}" font-size="12">{escape(manifest["name"])}: measured speed-up '
           "(median over rounds, bar: min-max)</text>",
           f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{y(1):.1f}" y2="{y(1):.1f}" stroke="#555" stroke-dasharray="4 3"/>',
           f'<text x="{LEFT + pw + 4}" y="{y(1) + 4:.1f}" fill="#555">1x</text>']
    step = 0.5 if top <= 3 else 1.0
    v = 0.0
    while v <= top:
        out.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        v += step
    for n in ns:
        out.append(f'<text x="{x(n):.1f}" y="{TOP + ph + 16}" text-anchor="middle">{n}</text>')
    out.append(f'<text x="{LEFT + pw / 2:.1f}" y="{H - 8}" text-anchor="middle">draft length (--spec-draft-n-max)</text>')
    for i, (label, sp) in enumerate(pairs.items()):
        color = COLORS[i % len(COLORS)]
        pts = sorted((int(n), c) for n, c in sp["by_n_max"].items())
        out.append('<polyline fill="none" stroke="{}" points="{}"/>'.format(
            color, " ".join(f"{x(n):.1f},{y(c['speedup']):.1f}" for n, c in pts)))
        for n, c in pts:
            lo, hi = c["interval"]
            out.append(f'<line x1="{x(n):.1f}" x2="{x(n):.1f}" y1="{y(lo):.1f}" y2="{y(hi):.1f}" stroke="{color}"/>')
            out.append(f'<circle cx="{x(n):.1f}" cy="{y(c["speedup"]):.1f}" r="3.5" fill="{color}"/>')
        ly = TOP + 14 + 30 * i
        out.append(f'<rect x="{LEFT + pw + 28}" y="{ly - 8}" width="10" height="10" fill="{color}"/>')
        main, _, draft = label.partition(" + ")
        out.append(f'<text x="{LEFT + pw + 42}" y="{ly}">{escape(main)}</text>')
        out.append(f'<text x="{LEFT + pw + 42}" y="{ly + 13}">+ {escape(draft)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_speedup_plot(manifest: dict, folder: str | Path) -> str | None:
    """Write :data:`PLOT_FILE` into ``folder`` (atomically), or remove a stale one; its name, or None."""
    path = Path(folder) / PLOT_FILE
    svg = render_speedup_plot(manifest)
    if svg is None:
        path.unlink(missing_ok=True)
        return None
    write_text_atomic(path, svg)
    return PLOT_FILE
