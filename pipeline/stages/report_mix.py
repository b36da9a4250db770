"""The measured mixes in the human-readable outputs (docs/mixes.md): the Pareto front of the size-vs-KLD plot, the
report's "Measured mixes" section, the sensitivity heat map (``sensitivity-<flavour>.svg``) and the card's two lines
per mix. Everything here is read from the manifest and is deterministic: no timestamps, no seconds in the SVGs."""

from __future__ import annotations

import math
from pathlib import Path

from pipeline.fsutil import write_text_atomic
from pipeline.recipe.mix import Flavour

MIB = 1024 * 1024
HEATMAP_PREFIX = "sensitivity-"
# A sequential colour ramp (viridis at 0, 1/4, 1/2, 3/4, 1), interpolated linearly in RGB: low added KLD is dark.
RAMP = ((0x44, 0x01, 0x54), (0x3b, 0x52, 0x8b), (0x21, 0x91, 0x8c), (0x5e, 0xc9, 0x62), (0xfd, 0xe7, 0x25))
MIN_KLD = 1e-6  # what a zero (or negative, measurement noise) added KLD is drawn as on the log scale


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates in (size, mean KLD), both smaller-is-better, in size order
    (then KLD, then index). A point is dominated by one at most as large and at most as far off, better in one of the
    two; equal points do not dominate each other: both stay on the front."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    return [i for i in order
            if not any(bx <= points[i][0] and by <= points[i][1] and (bx, by) != points[i] for bx, by in points)]


def mix_entries(manifest: dict) -> list[tuple[dict, bool]]:
    """(entry, published) of every mix quant, published first, in manifest order."""
    return [(e, True) for e in manifest.get("artifacts", []) if e.get("mix")] + \
        [(e, False) for e in manifest.get("rejected", []) if e.get("mix")]


def goal_text(mix: dict) -> str:
    """``size of Q4_K_M (105454272 bytes)``, ``4 bits per weight (…)``, ``at most 90 MB (…)``, ``mean KLD ≤ 0.02``."""
    g = mix["goal"]
    if "target" in g:
        (k, v), = g["target"].items()
        return f"mean KLD ≤ {v:g}" if k == "max_kld_mean" else f"{k} {v}"
    (k, v), = g["budget"].items()
    if k == "size_of":
        what = f"the size of {v}"
    else:
        what = {"bpw": f"{v:g} bits per weight", "max_mb": f"at most {v:g} MB"}.get(k, f"{k} {v}")
    return f"{what} ({g['bytes']} bytes)"


def _written_bytes(e: dict) -> int:
    """The bytes of the GGUF as llama-quantize wrote it (a split file: the whole file it was cut from)."""
    return (e.get("split") or {}).get("unsplit", {}).get("size_bytes", e["size_bytes"])


def heatmap_name(flavour: str) -> str:
    return f"{HEATMAP_PREFIX}{flavour}.svg"


def smallest(group: dict, candidates: list[str]) -> str:
    """The candidate that makes the group smallest (the earlier in the ladder on a tie)."""
    have = [c for c in candidates if c in group["kld_mean"]]
    return min(have, key=lambda c: (group["bytes"][c], have.index(c)))


def added_kld(group: dict, section: dict) -> tuple[str, float]:
    """(the group's smallest candidate, its mean KLD added over the floor's) from a manifest sensitivity section."""
    c = smallest(group, section["candidates"])
    return c, group["kld_mean"][c] - section["floor_kld_mean"]


def _colour(t: float) -> str:
    t = min(1.0, max(0.0, t)) * (len(RAMP) - 1)
    i = min(int(t), len(RAMP) - 2)
    f = t - i
    return "#" + "".join(f"{round(a + (b - a) * f):02x}" for a, b in zip(RAMP[i], RAMP[i + 1], strict=True))


def render_heatmap(name: str, flavour: str, section: dict) -> str:
    """SVG text: one cell per measured group, rows the tensor roles (block roles in name order, then each non-block
    group such as ``token_embd`` / ``output`` as a row of its own, one cell across every band), columns the bands of
    layers; colour and figure: the mean KLD the group's smallest candidate adds over the floor (log scale, legend)."""
    # xml.sax.saxutils loads urllib.request (slow): only the heatmap needs it
    from xml.sax.saxutils import escape

    bands = [tuple(b) for b in section["bands"]]
    cells = {}
    for g in section["groups"]:
        cells[(g["role"], tuple(g["band"]) if g["band"] else None)] = (g["group"], *added_kld(g, section))
    block = sorted({r for r, b in cells if b is not None})
    other = sorted({r for r, b in cells if b is None})
    rows = block + other
    vals = [max(v, MIN_KLD) for _, _, v in cells.values()] or [MIN_KLD]
    l0, l1 = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
    l1 = max(l1, l0 + 1)
    cw, ch, left, top = max(64, 560 // max(1, len(bands))), 26, 110, 56
    width, height = left + cw * len(bands) + 100, top + ch * len(rows) + 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    cands = sorted({c for _, c, _ in cells.values()}, key=section["candidates"].index)
    out.append(f'<text x="{left}" y="18" font-size="13">{escape(name)}: sensitivity ({escape(flavour)})</text>')
    out.append(f'<text x="{left}" y="36">mean KLD added over the {escape(section["floor"])} floor '
               f'({section["floor_kld_mean"]:g}) by each group alone at its smallest candidate '
               f'({escape(", ".join(cands))})</text>')
    for j, (lo, hi) in enumerate(bands):
        out.append(f'<text x="{left + cw * j + cw / 2}" y="{top - 6}" text-anchor="middle">layers {lo}-{hi}</text>')
    for i, role in enumerate(rows):
        y = top + ch * i
        out.append(f'<text x="{left - 6}" y="{y + ch / 2 + 4}" text-anchor="end">{escape(role)}</text>')
        spans = [((lo, hi), left + cw * j, cw) for j, (lo, hi) in enumerate(bands)] if role in block \
            else [(None, left, cw * len(bands))]
        for band, x, w in spans:
            cell = cells.get((role, band))
            if cell is None:  # no tensor of this role in that band
                out.append(f'<rect x="{x}" y="{y}" width="{w}" height="{ch}" fill="#eee" stroke="white"/>')
                continue
            group, cand, v = cell
            t = (math.log10(max(v, MIN_KLD)) - l0) / (l1 - l0)
            ink = "black" if t > 0.6 else "white"
            out.append(f'<rect x="{x}" y="{y}" width="{w}" height="{ch}" fill="{_colour(t)}" stroke="white">'
                       f'<title>{escape(group)} at {escape(cand)}: +{v:.6g}</title></rect>')
            out.append(f'<text x="{x + w / 2}" y="{y + ch / 2 + 4}" text-anchor="middle" fill="{ink}" '
                       f'font-size="10">{v:.2g}</text>')
    # legend: the ramp in ten steps, decades labelled
    lx, ly, lh = left + cw * len(bands) + 30, top, max(ch * len(rows), 100)
    for k in range(10):
        out.append(f'<rect x="{lx}" y="{ly + lh - (k + 1) * lh / 10:.2f}" width="14" height="{lh / 10:.2f}" '
                   f'fill="{_colour((k + 0.5) / 10)}"/>')
    for d in range(l0, l1 + 1):
        yy = ly + lh - (d - l0) / (l1 - l0) * lh
        out.append(f'<text x="{lx + 18}" y="{yy + 4:.2f}">10<tspan dy="-5" font-size="8">{d}</tspan></text>')
    out.append(f'<text x="{lx}" y="{ly + lh + 18}">added KLD (log)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_heatmaps(manifest: dict, folder: str | Path) -> list[str]:
    """Write ``sensitivity-<flavour>.svg`` per flavour of the manifest's ``sensitivity`` section into ``folder``
    (atomically); remove the heat maps of flavours no longer measured. Returns the file names written."""
    folder = Path(folder)
    written = []
    for flavour, section in (manifest.get("sensitivity") or {}).items():
        fname = heatmap_name(flavour)
        write_text_atomic(folder / fname, render_heatmap(manifest["name"], flavour, section))
        written.append(fname)
    for stale in folder.glob(f"{HEATMAP_PREFIX}*.svg"):
        if stale.name not in written and stale.is_file():
            stale.unlink()
    return written


def mixes_markdown(manifest: dict) -> str:
    """The report's "Measured mixes" section: per mix its goal, predicted against measured bytes and mean KLD, and
    per flavour what measuring the sensitivity cost, with its heat map."""
    mixes = mix_entries(manifest)
    if not mixes:
        return ""
    sets = [es["name"] for es in manifest.get("eval_sets", [])]
    head = ["mix", "goal", "predicted bytes", "written bytes", "predicted mean KLD"] + \
        [f"measured mean KLD ({s})" for s in sets] + ["gate"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e, published in mixes:
        m = e["mix"]
        measured = [f"{(e.get('metrics') or {}).get(s, {}).get('kld_mean', float('nan')):.5f}" for s in sets]
        lines.append(f"| `{e['file']}` | {goal_text(m)} | {m['predicted']['bytes']} | {_written_bytes(e)} | "
                     f"{m['predicted']['kld_mean']:.5f} | " + " | ".join(measured) + (" | " if sets else "")
                     + ("pass" if published else "FAIL") + " |")
    texts = {(s["text"], s["ctx"], s["chunks"]) for e, _ in mixes for s in [e["mix"]["sensitivity"]]}
    where = "; ".join(f"`{t}` (ctx {c} × {n} chunks)" for t, c, n in sorted(texts))
    lines += ["", f"Predicted: the solver's additive model on the sensitivity text {where}; measured: "
              "`llama-perplexity --kl-divergence` of the file on each gate set's text, which the solver never saw. "
              "Each mix's map (`<name>-<KEY>.tensor-types.txt` beside its GGUF) names every quantized tensor's type.", ""]
    for flavour, s in (manifest.get("sensitivity") or {}).items():
        c = s.get("cost", {})
        lines.append(f"- Sensitivity `{flavour}`: {len(s['groups'])} groups × {len(s['candidates'])} candidates "
                     f"({', '.join(s['candidates'])}) over the {s['floor']} floor; {c.get('measurements', '–')} "
                     f"measurements ({c.get('runs', '–')} run, {c.get('reused', '–')} reused, {c.get('skipped', '–')} "
                     f"written as the floor), {c.get('seconds', '–')} s on the build box (quantize "
                     f"{c.get('quantize_seconds', '–')} s, eval {c.get('eval_seconds', '–')} s). Heat map: "
                     f"[{heatmap_name(flavour)}]({heatmap_name(flavour)})")
    return "\n".join(lines)


def card_mix_lines(manifest: dict) -> list[str]:
    """Two lines per published mix: what it is, and how to make it again with llama-quantize and its map."""
    base = next((e for e in manifest.get("artifacts", []) if e.get("role") == "base"), None)
    base_file = (base["file"] + "/<first shard>" if base.get("split") else base["file"]) if base else "<F16>.gguf"
    out = []
    for e, published in mix_entries(manifest):
        if not published:
            continue
        m = e["mix"]
        flavour = Flavour.parse(m["flavour"])
        src = "<the AWQ-scaled F16>.gguf" if flavour.base == "awq" else base_file
        imx = (e.get("calibration") or {}).get("imatrix", {}).get("file")
        extra = f"--imatrix {imx} " if imx and flavour.imatrix else ""
        out += [f"- `{e['file']}`: per-tensor types solved from measured sensitivity for {goal_text(m)}: predicted mean "
                f"KLD {m['predicted']['kld_mean']:.4f} on the sensitivity text `{m['sensitivity']['text']}`.",
                f"  Reproduce: `llama-quantize {extra}--tensor-type-file {m['map']['file']} {src} out.gguf "
                f"{e['quant_type']}`"]
    return out
