"""The model card (``artifacts/<name>/README.md``): Hub front matter (base model, relation, license, language,
pipeline tag, tags), the label-first quality table, the measured mixes (two lines each), per-label usage lines, the
verified prompt format, the Hub's Ollama files, conformance, MTP and draft sections. The tables and sections it shares
with ``report.md`` come from pipeline/stages/report.py (and report_mix.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pipeline.fsutil import write_text_atomic
from pipeline.stages.report import (
    conformance_text,
    draft_table,
    kv_table,
    label,
    markdown_table,
    mtp_text,
)
from pipeline.stages.report_axes import axis, eval_desc, length_table
from pipeline.stages.report_devices import device_check_text, fits_table, launch_table
from pipeline.stages.report_mix import card_mix_lines
from pipeline.stages.split import model_path

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
    ``library_name: gguf``, and ``datasets``: the Hub ids of the gate texts and the calibration a published quant
    used, where the recipe names one (``hub_dataset``)."""
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
    datasets = sorted({es["hub_dataset"] for es in manifest.get("eval_sets", []) if es.get("hub_dataset")}
                      | {(e.get("calibration") or {}).get("imatrix", {}).get("hub_dataset") for e in manifest["artifacts"]
                         if e.get("role") == "quant"} - {None})
    if datasets:
        lines += ["datasets:", *(f"  - {_yaml(d)}" for d in datasets)]
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


def card_text(manifest: dict, measured: list[dict] | None = None) -> str:
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
        body += ["Quality against the unquantized file:", eval_desc(manifest), ""]
    axes = {es["name"]: axis(es) for es in manifest.get("eval_sets", [])}
    for es in sets:
        if es and len(sets) > 1:
            body += [f"### {es}: {axes[es]}", ""]
        body += [markdown_table(manifest, es, speed=False, labels=True), ""]
    lengths = length_table(manifest)
    if lengths:
        body += ["### KLD per context length", "", lengths, ""]
    mixes = card_mix_lines(manifest)
    if mixes:  # two lines each: what the mix is, how to make it again from its published map
        body += ["## Measured mixes", "", *mixes, ""]
    kv = kv_table(manifest, short=True)
    if kv:
        body += ["## KV cache types", "", kv, ""]
    fits = fits_table(manifest, short=True)
    if fits:  # recipe `devices:`: the best file per target device
        body += ["## Fits on", "", fits, ""]
    launch = launch_table(manifest)
    if launch:  # a llama-server line per device, with the draft only where it measured faster
        body += ["## Launch on a device", "", launch, ""]
    on_device = device_check_text(manifest, measured, short=True)
    if on_device:  # `ggufpipe collect`'s results (devices.json): the same file re-measured on a device
        body += ["## Checked on devices", "", on_device, ""]
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
        what = "MTP heads" if manifest["draft"].get("mtp") else "draft model"
        body += [f"## Speculative decoding with the {what}", "", draft_table(manifest), ""]
    return front_matter(manifest) + "\n".join(body)


def write_card(manifest: dict, out: str | Path, measured: list[dict] | None = None) -> None:
    """Write :func:`card_text` to ``out`` (atomically)."""
    write_text_atomic(out, card_text(manifest, measured))
