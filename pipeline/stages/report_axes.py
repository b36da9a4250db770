"""The report's and card's eval-set lines: what each set measures (its axis: prose, chat-rendered, long context), and
the per-length table of a ``ctx: long`` set against a shorter set on the same text."""

from __future__ import annotations


def axis(es: dict) -> str:
    """What an eval set of the manifest measures, in a few words."""
    if es.get("ctx_long"):
        return "long context"
    if es.get("render"):
        return "chat-rendered conversations"
    return "text"


def eval_desc(manifest: dict) -> str:
    out = []
    for es in manifest.get("eval_sets", []):
        r = es.get("render")
        how = (f"; {r['conversations']} conversations rendered with the model's chat template by llama.cpp, "
               f"{r['tokens']} tokens of which {r['special_tokens']} special" if r else "")
        if es.get("ctx_long"):
            how += f"; ctx = min(the model's trained context, {es['ctx_long']['max_ctx']})"
        out.append(f"- **{es['name']}** ({axis(es)}): `{es['text']}` (SHA256 `{es['text_sha256'][:16]}…`), ctx "
                   f"{es['ctx']}, {es['chunks']} chunk{'s' if es['chunks'] != 1 else ''} ({es['scored_tokens']} scored "
                   f"tokens){how}; KLD against the {manifest.get('base_quant_type', 'F16')} file with "
                   "`llama-perplexity --kl-divergence`")
    return "\n".join(out)


def length_pairs(manifest: dict) -> list[tuple[dict, dict]]:
    """(short set, long set) pairs on the same text: the same quant's KLD per context length."""
    sets = manifest.get("eval_sets", [])
    return [(s, lg) for lg in sets if lg.get("ctx_long") for s in sets
            if not s.get("ctx_long") and s["text_sha256"] == lg["text_sha256"] and s["ctx"] < lg["ctx"]]


def length_table(manifest: dict) -> str:
    """Mean KLD of each quant at each length (the long set scores the second half of one chunk, the short set the
    second halves of its chunks, all from the same text); empty without a pair."""
    pairs = length_pairs(manifest)
    if not pairs:
        return ""
    short, long = pairs[0]
    lines = [f"Mean KLD on `{short['text']}` at each context length: `{short['name']}` (ctx {short['ctx']}, "
             f"{short['chunks']} chunks) and `{long['name']}` (one chunk at ctx {long['ctx']}). A quant whose error "
             "grows with the context shows a ratio well above 1.", "",
             f"| file | ctx {short['ctx']} | ctx {long['ctx']} | ratio |", "|---|---:|---:|---:|"]
    for e in manifest.get("artifacts", []):
        m = e.get("metrics") or {}
        a, b = (m.get(short["name"]) or {}).get("kld_mean"), (m.get(long["name"]) or {}).get("kld_mean")
        if a is None or b is None:
            continue
        ratio = f"{b / a:.2f}" if a > 0 else "–"
        lines.append(f"| `{e['file']}` | {a:.5f} | {b:.5f} | {ratio} |")
    return "\n".join(lines)
