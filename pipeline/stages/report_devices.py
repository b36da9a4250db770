"""The report's and card's device tables (pipeline/stages/report.py, card.py): "Fits on" (recipe ``devices:``, the
manifest's ``devices``), the launch lines (``build.launch``) and the on-device check (the slice, and what devices
measured: ``ggufpipe collect``'s ``devices.json``)."""

from __future__ import annotations

from pipeline.stages.device_verdict import same_top_p_limit
from pipeline.stages.table_text import cell

MIB = 1024 * 1024


def mem_size(n: int) -> str:
    """Bytes in binary units, as ``ggufpipe fit`` and the recipe's ``devices[].memory`` read them."""
    return f"{n / (1 << 30):.1f} GiB" if abs(n) >= 1 << 30 else f"{n / MIB:.0f} MiB"


def _fit_cell(f: dict) -> str:
    return ("✓ " if f["fits"] else "✗ ") + mem_size(f["total"])


def fits_table(manifest: dict, short: bool = False) -> str:
    """The "Fits on" table of the manifest's ``devices`` (recipe ``devices:``): per device its memory, context, KV
    type and CPU profile, each published file's predicted peak memory (✓ fits, ✗ does not) and the best file (the
    largest quant that fits). ``short`` (the card): the device and the best file only. Empty without devices."""
    devices = manifest.get("devices") or {}
    if not devices:
        return ""
    name = manifest["name"]
    keys = list(dict.fromkeys(k for d in devices.values() for k in d["files"]))

    def best(d: dict) -> str:
        b = d.get("best")
        return f"`{name}-{b}` ({mem_size(d['files'][b]['total'])})" if b else "none fits"

    if short:
        lines = ["| device | memory | ctx | KV | CPU | best file (predicted memory) |", "|---|---|---|---|---|---|"]
        lines += [f"| {dev} | {mem_size(d['memory_bytes'])} | {d['ctx']} | {d['kv_type']} | {d['arch']} | {best(d)} |"
                  for dev, d in devices.items()]
        lines += ["", "Predicted peak memory of llama.cpp's CPU build at that context (`ggufpipe fit`; "
                  "`manifest.json` has every file per device)."]
        return "\n".join(lines)
    lines = ["Predicted peak memory of llama.cpp's CPU build running each published file at the device's context "
             "(`llama-bench -p <ctx>`'s peak RSS, `pipeline/memory.py`: within 0.978-1.046 of measured, "
             "docs/devices.md); ✓: fits the device's memory. Best: the largest quant that fits.", "",
             "| device | memory | ctx | KV | CPU | " + " | ".join(keys) + " | best |",
             "|" + "---|" * (len(keys) + 6)]
    for dev, d in devices.items():
        cells = [_fit_cell(d["files"][k]) if k in d["files"] else "–" for k in keys]
        req = " (required)" if d.get("require") else ""
        lines.append(f"| {dev}{req} | {mem_size(d['memory_bytes'])} | {d['ctx']} | {d['kv_type']} | {d['arch']} | "
                     + " | ".join(cells) + f" | {best(d)} |")
    for dev, d in devices.items():
        if d.get("warning"):
            lines += ["", f"Warning ({dev}): {d['warning']}."]
    for f in manifest.get("failures", []):
        if f.get("check") == "device":
            lines += ["", f"**FAIL**: {f['message']}."]
    return "\n".join(lines)


def device_check_text(manifest: dict, measured: list[dict] | None = None, short: bool = False) -> str:
    """The on-device check: the slice and each file's slice values on the build box; then what devices measured on it
    (``ggufpipe collect``'s ``devices.json``). ``short`` (the card): the devices' rows only. Empty without a slice."""
    dc = manifest.get("device_check")
    if not dc:
        return ""
    t = dc["tolerance"]
    lines = [] if short else [
        f"`ggufpipe device-check FILE` re-measures a file on a device against `{dc['file']}` ({dc['chunks']} chunk(s) "
        f"of eval set `{dc['eval_set']}` at ctx {dc['ctx']}, {dc['scored_tokens']} scored tokens; DVC-tracked, not on "
        f"the Hub). It passes when |Δ mean KLD| ≤ max({t['kld_mean_abs']}, {t['kld_mean_rel']:.0%} of the build box's) "
        f"and same top p within {same_top_p_limit(t, dc['scored_tokens']):.2f} points of it (at least "
        f"{t['same_top_p_points']:g}, wider on a short slice where near-tied tokens flip between CPU kernels; "
        "docs/device-check.md).", "",
        "| file | slice mean KLD | slice same top p | slice PPL |", "|---|---|---|---|"]
    if not short:
        lines += [f"| {cell(e['file'], code=True)} | {e['slice']['kld_mean']:.5f} | "
                  f"{100 * e['slice']['same_top_p']:.2f} % | {e['slice']['ppl_q']:.4f} |"
                  for e in manifest["artifacts"] if e.get("slice")]
    if measured:
        lines += ([] if short else ["", "Measured on devices (`ggufpipe collect`):", ""]) + [
            "| device | file | llama.cpp | mean KLD (Δ) | same top p (Δ points) | tg t/s | draft speed-up | result |",
            "|---|---|---|---|---|---|---|---|"]
        lines += [_measured_row(r) for r in measured]
    elif not short:
        lines += ["", "No device has reported yet (`ggufpipe device-check FILE --out R.json`, then `ggufpipe collect R.json`)."]
    return "\n".join(lines)


def _measured_row(r: dict) -> str:
    """A device's row: ``r`` as publish_devices.device_results gives it (checked and judged again by collect's
    function); every string through :func:`~pipeline.stages.table_text.cell`."""
    who, file = _who(r["device"]), cell(r["file"], code=True)
    if not r.get("checked"):  # a device without llama.cpp tools: the file verified, nothing re-measured
        return f"| {who} | {file} | – | – | – | – | – | verified only |"
    m, d = r["slice"]["measured"], r["slice"]["delta"]
    tg = (r.get("bench") or {}).get("tg_tokens_per_s")
    return (f"| {who} | {file} | b{r['tools']['llama_cpp_build']:d} | {m['kld_mean']:.5f} ({d['kld_mean']:+.5f}) | "
            f"{100 * m['same_top_p']:.2f} % ({d['same_top_p_points']:+.2f}) | "
            f"{'–' if tg is None else f'{tg:.1f}'} | {_speedup_cell(r.get('speedup'))} | "
            f"{'pass' if r['passed'] else '**FAIL**'} |")


def _who(d: dict) -> str:
    """A device's cell: its label, machine and, where the result recorded one, its power mode (a Jetson's)."""
    mode = f", {cell(d['power_mode'])}" if d.get("power_mode") else ""
    return f"{cell(d['label'])} ({cell(d['machine'])}{mode})"


def _speedup_cell(sp: dict | None) -> str:
    """A device's measured draft speed-up (``device-check --draft``): the median, the interval, the draft and length."""
    if not sp:
        return "–"
    lo, hi = sp["interval"]
    return (f"{sp['speedup']:.2f}x ({lo:.2f}-{hi:.2f}) with {cell(sp['pair'].split(' + ')[1], code=True)}, n_max "
            f"{sp['n_max']:d}" + ("" if sp["helps"] else ": no speed-up"))


def launch_table(manifest: dict) -> str:
    """The "Launch" table of the manifest's ``build.launch``: per device the line (or why there is none). Empty
    without devices."""
    launches = (manifest.get("build") or {}).get("launch") or {}
    if not launches:
        return ""
    rows = ["| device | line | predicted memory |", "|---|---|---|"]
    for dev, e in launches.items():
        if e.get("line") is None:
            rows.append(f"| {dev} | no line: {e['why']} | – |")
            continue
        extra = f"; {e['note']}" if e.get("note") else ""
        draft = f"; draft {e['draft']['speedup']:.2f}x measured" if e.get("draft") else ""
        rows.append(f"| {dev} | `{e['line']}` | {e['memory']['total'] / MIB:.0f} MiB{draft}{extra} |")
    return "\n".join([*rows, "", "`-c`: the largest power of two that fits (shared by the `-np` slots); "
                      "`--cache-ram`: the memory left over, in MiB (the server's prompt cache; 8192 by default); "
                      "predicted by `pipeline/memory.py` (docs/devices.md#launch-lines)."])
