"""What the publish stage writes for the Hub and Ollama beside the GGUFs (pipeline/distribution/hub.py uploads it):

- :func:`modelfiles` / :func:`write_modelfiles`: one Ollama ``Modelfile.<KEY>`` per published model file
  (``FROM ./<name>-<KEY>.gguf``), written when ``publish.ollama`` is on (the default) and listed with its SHA256 in
  the manifest's ``ollama`` section: deterministic derived artifacts, like the model card.
- :func:`publish_modelfiles` also writes the Hub's own Ollama files at the repo root, which ``ollama run
  hf.co/<repo>:<LABEL>`` reads (huggingface.co/docs/hub/ollama): ``params`` (JSON, ``{"stop": [...]}``: the
  end-of-generation texts llama.cpp stops on, as the conformance stage verified them) for every chat model;
  ``template`` (a Go template) only for ChatML, and only where Ollama's ChatML template renders every conversation
  the conformance stage verified exactly as the model's template does; ``system`` (the ChatML template's built-in
  default system prompt) beside it; and the manifest's ``hub`` section: what the model card's front matter, usage
  lines and prompt format say (:func:`hub_section`).
- :func:`mix_files`: what a recipe with measured mixes publishes besides: each published mix's tensor-type map
  (``<name>-<KEY>.tensor-types.txt``, SHA256 in the manifest's ``mix.map``) and the sensitivity heat maps
  (``sensitivity-<flavour>.svg``, drawn from the manifest like ``report.svg``).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.fsutil import sha256_file, write_text_atomic
from pipeline.gguf import ArrayValue, read_header
from pipeline.gguf.types import STRING
from pipeline.layout import Layout
from pipeline.provenance import source_files_digest
from pipeline.records import ConformanceRecord, FetchRecord
from pipeline.stages.conformance.common import load_conversations
from pipeline.stages.report_mix import heatmap_name
from pipeline.stages.split import model_path

MODEL_ROLES = ("base", "quant")  # artifacts that get a Modelfile (not e.g. a separate MTP-heads file)
MODELFILE_PREFIX = "Modelfile."
HUB_URL = "https://huggingface.co"

# Ollama's ChatML template (Go text/template). Ollama puts a Modelfile SYSTEM in front of the messages
# when the request has no system message of its own.
CHATML_TEMPLATE = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n"
    "{{ .Content }}<|im_end|>\n"
    "{{ end }}<|im_start|>assistant\n"
)
CHATML_STOPS = ("<|im_start|>", "<|im_end|>")
# A ChatML template's built-in default system prompt: one plain literal (no quotes, braces, escapes)
# between "<|im_start|>system" + newline (real or a Jinja "\n" escape) and "<|im_end|>".
_CHATML_SYSTEM_RE = re.compile(r"<\|im_start\|>system(?:\\n|\n)([^'\"{}<>\\\n]+?)<\|im_end\|>")

# The Hub's Ollama files (huggingface.co/docs/hub/ollama, "Custom Chat Template and Parameters"), at the root of the
# folder: upload order after the Modelfiles.
HUB_OLLAMA_FILES = ("template", "system", "params")

# What the publish stage leaves in the artifact folder, in upload order after the GGUFs, Modelfiles and Hub files.
FOLDER_FILES = (("README.md", "card"), ("report.md", "report"), ("report.svg", "plot"), ("metrics.json", "metrics"),
                ("manifest.json", "manifest"))



def mix_files(manifest: dict) -> list[tuple[str, str, str | None]]:
    """``(file, kind, sha256 or None)`` of the measured mixes' files in the artifact folder, in upload order after the
    Hub files: each published mix's map (kind ``tensor-types``, the SHA256 the manifest vouches for) in manifest
    order, then each flavour's heat map (kind ``heatmap``; derived from the manifest, no recorded SHA256). Empty for
    recipes without mixes."""
    maps = [(m["file"], "tensor-types", m["sha256"]) for e in manifest.get("artifacts", [])
            for m in [(e.get("mix") or {}).get("map")] if m]
    return maps + [(heatmap_name(f), "heatmap", None) for f in manifest.get("sensitivity") or {}]


# --------------------------------------------------------------------------- Ollama Modelfiles


def chat_format(gguf: str | Path) -> dict:
    """The chat template (Jinja, ``tokenizer.chat_template``) and the EOS / EOT token texts of a GGUF."""
    r = read_header(gguf)
    ids = [r.metadata.get(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")]
    arr = r.metadata.get("tokenizer.ggml.tokens")
    texts = isinstance(arr, ArrayValue) and arr.elem_type == STRING and any(isinstance(i, int) for i in ids)
    tokens = r.array("tokenizer.ggml.tokens", raw_strings=True) if texts else None
    stops = []
    for tid in ids:
        if tokens is not None and isinstance(tid, int) and 0 <= tid < len(tokens):
            text = tokens[tid].decode("utf-8", "replace")
            if text and text not in stops:
                stops.append(text)
    template = r.metadata.get("tokenizer.chat_template")
    return {"template": template if isinstance(template, str) and template.strip() else None, "stops": stops}


def _model_key(manifest: dict, entry: dict) -> str | None:
    """``<KEY>`` of a model file ``<name>-<KEY>.gguf`` that gets a Modelfile; None for other artifacts, and
    for a split file (a folder of shards): Ollama imports one GGUF file only (ollama/ollama#5245)."""
    prefix, f = manifest["name"] + "-", entry["file"]
    if entry.get("role") not in MODEL_ROLES or not f.startswith(prefix) or not f.endswith(".gguf"):
        return None
    return f[len(prefix):-len(".gguf")]


def _chatml_system(template: str) -> str | None:
    found = {m.strip() for m in _CHATML_SYSTEM_RE.findall(template)}
    return found.pop() if len(found) == 1 else None


def _stop_ok(text: str) -> bool:
    return bool(text) and not any(c in text for c in '"\\') and all(ord(c) >= 0x20 for c in text)


def _template_choice(fmt: dict, override: str | None) -> tuple[str, str | None, str | None, list[str]]:
    """(kind, TEMPLATE, SYSTEM, comment lines) for a chat format and an optional recipe template."""
    jinja = fmt["template"]
    chatml = bool(jinja) and all(t in jinja for t in CHATML_STOPS)
    system = _chatml_system(jinja) if chatml else None
    if override is not None:
        return "recipe", override, system, ["# TEMPLATE: from the recipe (publish.ollama_template)."]
    if chatml:
        return "chatml", CHATML_TEMPLATE, system, [
            "# TEMPLATE: ChatML. The GGUF's chat template (tokenizer.chat_template, Jinja) uses <|im_start|> /",
            "# <|im_end|>; this is Ollama's standard ChatML Go template (no tool-call formatting)."]
    if jinja:
        return "gguf", None, None, [
            "# No TEMPLATE: the GGUF's chat template (tokenizer.chat_template) is Jinja, not ChatML, and a faithful",
            "# conversion to a Go template is not attempted; `ollama create` picks a template matching it."]
    return "none", None, None, ["# No TEMPLATE: the GGUF has no chat template (a completion model)."]


def modelfiles(manifest: dict, folder: str | Path, template: str | None = None) -> dict[str, str]:
    """``{"Modelfile.<KEY>": text}`` for every published model file of ``manifest`` (in its order).

    The chat template and stop tokens are read from the base GGUF in ``folder`` (llama-quantize copies
    the tokenizer metadata into every quant); ``template`` (a Go template) overrides the TEMPLATE."""
    return {name: text for name, (text, _kind) in _modelfiles(manifest, Path(folder), template).items()}


def _modelfiles(manifest: dict, folder: Path, template: str | None) -> dict[str, tuple[str, str]]:
    models = [(e, k) for e in manifest["artifacts"] if (k := _model_key(manifest, e)) is not None]
    if not models:
        return {}
    ref = next((e for e, _ in models if e.get("role") == "base"), models[0][0])
    fmt = chat_format(folder / ref["file"])
    kind, tmpl, system, notes = _template_choice(fmt, template)
    stops = list(fmt["stops"])
    if kind in ("chatml", "recipe") and fmt["template"] and all(t in fmt["template"] for t in CHATML_STOPS):
        stops += [s for s in CHATML_STOPS if s not in stops]
    out = {}
    for e, key in models:
        lines = [f"# Ollama Modelfile for {e['file']} ({e['quant_type']}), written by ggufpipe.",
                 f"# Build {manifest['build_id']}; {e['file']}: {e['size_bytes']} bytes, sha256 {e['sha256']}",
                 f"# (check: ggufpipe verify {e['file']}). Use: ollama create {manifest['name']}:{key.lower()} "
                 f"-f {MODELFILE_PREFIX}{key}",
                 *notes,
                 f"FROM ./{e['file']}"]
        if tmpl is not None:
            lines.append(f'TEMPLATE """{tmpl}"""')
        if system and '"""' not in system:
            lines.append(f'SYSTEM """{system}"""')
        for s in stops:
            lines.append(f'PARAMETER stop "{s}"' if _stop_ok(s) else
                         f"# stop token {s!r} left out: not expressible as a Modelfile string")
        out[f"{MODELFILE_PREFIX}{key}"] = ("\n".join(lines) + "\n", kind)
    return out


def write_modelfiles(manifest: dict, folder: str | Path, template: str | None = None, enabled: bool = True) -> list[dict]:
    """Write the Modelfiles into ``folder`` (each atomically), remove stale ``Modelfile.*`` (quants no longer
    published, or ``enabled`` off) and return the manifest's ``ollama`` entries (file, gguf, SHA256)."""
    folder = Path(folder)
    texts = _modelfiles(manifest, folder, template) if enabled else {}
    by_key = {f"{MODELFILE_PREFIX}{k}": e["file"] for e in manifest["artifacts"] if (k := _model_key(manifest, e))}
    entries = []
    for name, (text, kind) in texts.items():
        path = folder / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            write_text_atomic(path, text)
        entries.append({"file": name, "gguf": by_key[name], "template": kind, "sha256": sha256_file(path)})
    for stale in folder.glob(f"{MODELFILE_PREFIX}*"):
        if stale.name not in texts:
            stale.unlink()
    return entries


def publish_modelfiles(recipe, manifest: dict, folder: str | Path, layout=None) -> dict:
    """For the publish stage: write (or remove) the Modelfiles and the Hub's Ollama files (``params``, ``template``,
    ``system``) and return ``manifest`` with its ``hub`` section (:func:`hub_section`, with the Hub files and their
    SHA256s) and, when the recipe asks for Modelfiles, its ``ollama`` section, both before the volatile ``build``
    section. ``layout``: where the recipe's work folder is (default: ``work/`` beside the artifacts folder), for
    the fetched source's model card and the conformance record; what is read there is checked against the
    manifest first."""
    folder = Path(folder)
    pub = recipe.publish
    on = pub is not None and pub.ollama
    entries = write_modelfiles(manifest, folder, pub.ollama_template if on else None, enabled=on)
    hub = hub_section(recipe, manifest, folder, layout)
    hub["files"] = write_hub_files(hub_files(hub, pub.ollama_template if on else None) if on else {}, folder)
    for f in hub["files"]:
        if f["file"] == "template":
            f["from"] = "recipe" if pub.ollama_template is not None else "chatml"
    out = {k: v for k, v in manifest.items() if k not in ("build", "hub", "ollama")}
    out["hub"] = hub
    if on:
        out["ollama"] = entries
    if "build" in manifest:
        out["build"] = manifest["build"]
    return out


# --------------------------------------------------------------------------- the Hub: card facts, Ollama files


def gguf_strings(path: str | Path, key: str, ids: list[int] | None = None) -> dict[int, str] | None:
    """Entries of the string array ``key`` of a GGUF (all, or those at ``ids``), decoded as UTF-8 (errors
    replaced); None when the key is missing or not an array of strings. The header reader reads the array on
    demand, undecoded (gguf-py's reader decodes every vocabulary entry: seconds)."""
    r = read_header(path)
    value = r.metadata.get(key)
    if not isinstance(value, ArrayValue) or value.elem_type != STRING:
        return None
    strings = r.array(key, raw_strings=True)
    wanted = range(len(strings)) if ids is None else sorted({i for i in ids if 0 <= i < len(strings)})
    return {i: strings[i].decode("utf-8", "replace") for i in wanted}


def _front_matter(text: str) -> dict:
    """The YAML front matter of a model card ({} when it has none or it does not parse)."""
    import yaml

    if not text.startswith("---\n") or "\n---" not in text[3:]:
        return {}
    try:
        data = yaml.safe_load(text[4:].partition("\n---")[0])
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _work_layout(folder: Path, layout):
    return layout if layout is not None else Layout(folder.parent, folder.parent.parent / "work")


def _load_json(path: Path, kind=None):
    """``path``'s JSON (as the stage record ``kind``, a :mod:`pipeline.records` class, when given), None when it is
    missing or unreadable: the card then leaves out what it would have shown."""
    try:
        return json.loads(path.read_text(encoding="utf-8")) if kind is None else kind.parse(path).to_dict()
    except (OSError, ValueError, PipelineError):
        return None


def source_files(manifest: dict, layout) -> dict[str, Path]:
    """The fetched source's README.md and config.json (those present) when the fetch record in the work folder is
    the one the manifest was built from and each file still has the SHA256 it records; {} otherwise."""
    name = manifest["name"]
    fetched = _load_json(Path(layout.fetch_record(name)), FetchRecord)
    if not isinstance(fetched, dict) or not isinstance(fetched.get("files"), dict):
        return {}
    try:
        if source_files_digest(fetched["files"]) != manifest.get("source", {}).get("files_sha256"):
            return {}
    except (KeyError, TypeError):
        return {}
    out = {}
    for fname in ("README.md", "config.json"):
        path = Path(layout.hf(name)) / fname
        rec = fetched["files"].get(fname)
        if isinstance(rec, dict) and path.is_file() and sha256_file(path) == rec.get("sha256"):
            out[fname] = path
    return out


def _as_list(v) -> list[str]:
    items = v if isinstance(v, list) else [v] if v is not None else []
    return [str(x) for x in items if isinstance(x, (str, int, float)) and str(x).strip()]


CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")  # transformers' text-generation heads


def card_facts(recipe, manifest: dict, base: Path | None, files: dict[str, Path]) -> dict:
    """The card's front-matter facts beyond the manifest: ``license`` (the recipe's ``license:``, else the source
    card's, else the GGUF's ``general.license``), ``license_name``/``license_link`` (the source card's, for
    ``license: other``), ``language`` (the source card's, else the GGUF's ``general.languages``, which the
    converter took from it) and ``pipeline_tag`` (the source card's, else ``text-generation`` for a causal LM of
    config.json); ``from``: which source card was read. No ``datasets``: no recipe key names a Hub dataset (gate
    and calibration texts are local files), and the source card's are what the source was trained on."""
    front = _front_matter(files["README.md"].read_text(encoding="utf-8", errors="replace")) if "README.md" in files \
        else {}
    out: dict = {"from": "the source's README.md (SHA256 as fetched)" if "README.md" in files else
                 "no source model card: the GGUF's general.* keys"}
    meta = manifest.get("gguf_metadata", {})
    license = recipe.license or (front.get("license") if isinstance(front.get("license"), str) else None) \
        or meta.get("general.license")
    if license:
        out["license"] = str(license)
    if license == front.get("license") == "other":  # the Hub wants its name and link
        out.update({k: str(front[k]) for k in ("license_name", "license_link") if isinstance(front.get(k), str)})
    language = _as_list(front.get("language"))
    if not language and "README.md" not in files and base is not None:
        language = list((gguf_strings(base, "general.languages") or {}).values())
    if language:
        out["language"] = language
    tag = front.get("pipeline_tag")
    if isinstance(tag, str) and tag.strip():
        out["pipeline_tag"] = tag.strip()
    elif "config.json" in files:
        arch = _as_list((_load_json(files["config.json"]) or {}).get("architectures"))
        if any(a.endswith(CAUSAL_LM_SUFFIXES) for a in arch):
            out["pipeline_tag"] = "text-generation"
    return out


def ollama_chatml_render(messages: list[dict], system: str | None = None) -> str:
    """What Ollama renders with :data:`CHATML_TEMPLATE` (``{{- range .Messages }}`` ... ``{{ end }}`` then the
    assistant's turn; text/template inserts ``.Role``/``.Content`` verbatim): a ``system`` (Modelfile ``SYSTEM``, the
    Hub's ``system`` file) first when the messages have no system message of their own."""
    if system and not (messages and messages[0].get("role") == "system"):
        messages = [{"role": "system", "content": system}, *messages]
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"


def _plain_conversation(conv: dict) -> bool:
    """A conversation Ollama's ChatML template can render: plain text messages, no tools, a generation prompt."""
    return bool(conv.get("add_generation_prompt")) and not conv.get("tools") and all(
        set(m) <= {"role", "content"} and isinstance(m.get("content"), str) for m in conv.get("messages", []))


def _verified_renders(manifest: dict, layout) -> list[dict] | None:
    """The conversations both engines rendered identically (name, llama.cpp's prompt text), from the conformance
    record in the work folder when it is the one the manifest's conformance section was made from; else None."""
    c = manifest.get("conformance") or {}
    if not c.get("checks", {}).get("chat_template", {}).get("passed") or c.get("skipped"):
        return None
    rec = _load_json(Path(layout.conformance_record(manifest["name"])), ConformanceRecord)
    if not isinstance(rec, dict) or any(rec.get(k) != c.get(k) for k in ("passed", "checks")):
        return None
    convs = rec.get("details", {}).get("chat_template", {}).get("conversations", [])
    return [{"name": r["name"], "add_generation_prompt": r.get("add_generation_prompt"), "text": r["llama_prompt"]}
            for r in convs if r.get("verdict") == "identical" and isinstance(r.get("llama_prompt"), str)]


def chat_facts(manifest: dict, base: Path | None, layout) -> dict | None:
    """What the card's prompt-format section and the Hub's Ollama files say; None without a base GGUF.

    ``template``: the family of the GGUF's ``tokenizer.chat_template`` (``chatml``, ``other``, None: no template);
    ``stop``: the texts of llama.cpp's end-of-generation set as the conformance stage verified it (``stop_from``
    ``eog``), else the GGUF's EOS/EOT texts and, for ChatML, its turn tokens, as in the Modelfiles (``gguf``);
    ``sample``: a conversation both engines rendered identically; ``system``: a ChatML template's built-in
    default system prompt; ``ollama_template``: Ollama's ChatML template against every verified conversation of
    plain messages with a generation prompt (``system`` first where it has none, as Ollama does): how many were
    ``checked`` and which ``differ``. The ChatML markers alone prove nothing: of the 16 templates with them vendored
    in the pinned llama.cpp tree, 4 render those conversations as Ollama's ChatML template does."""
    if base is None:
        return None

    meta = read_header(base).metadata
    jinja = meta.get("tokenizer.chat_template")
    jinja = jinja if isinstance(jinja, str) and jinja.strip() else None
    chatml = bool(jinja) and all(t in jinja for t in CHATML_STOPS)
    out: dict = {"template": "chatml" if chatml else "other" if jinja else None}
    if jinja:
        out["template_sha256"] = hashlib.sha256(jinja.encode("utf-8")).hexdigest()
    checks = (manifest.get("conformance") or {}).get("checks", {})
    eog = checks.get("eog", {})
    if eog.get("passed") and eog.get("eog"):
        texts = gguf_strings(base, "tokenizer.ggml.tokens", [int(i) for i in eog["eog"]]) or {}
        out["stop"] = list(dict.fromkeys(t for i in eog["eog"] if (t := texts.get(int(i)))))
        out["stop_from"] = "eog"
    else:  # chat_format's stops, read without gguf's reader (seconds on a large vocabulary)
        ids = [i for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
               if isinstance(i := meta.get(k), int) and not isinstance(i, bool)]
        texts = gguf_strings(base, "tokenizer.ggml.tokens", ids) or {}
        out["stop"] = list(dict.fromkeys([*(t for i in ids if (t := texts.get(i))), *(CHATML_STOPS if chatml else ())]))
        out["stop_from"] = "gguf"
    renders = _verified_renders(manifest, layout) if jinja else None
    if renders:
        pick = next((r for r in renders if r["add_generation_prompt"]), renders[0])
        out["sample"] = {"conversation": pick["name"], "text": pick["text"]}
    if not chatml:
        return out
    out["system"] = _chatml_system(jinja)
    convs = {c["name"]: c for c in load_conversations()["conversations"]}
    compared = [r for r in renders or [] if r["name"] in convs and _plain_conversation(convs[r["name"]])]
    differ = [r["name"] for r in compared
              if ollama_chatml_render(convs[r["name"]]["messages"], out["system"]) != r["text"]]
    out["ollama_template"] = {"checked": len(compared), "differ": differ}
    return out


def hub_section(recipe, manifest: dict, folder: str | Path, layout=None) -> dict:
    """The manifest's ``hub`` section (without ``files``): the repo the card's usage lines name (``publish.hf_repo``,
    None without ``publish:``), ``card`` (:func:`card_facts`) and ``chat`` (:func:`chat_facts`)."""
    folder = Path(folder)
    layout = _work_layout(folder, layout)
    pub = recipe.publish
    ref = next((e for e in manifest["artifacts"] if e.get("role") == "base"), None)
    base = folder / model_path(ref) if ref is not None else None
    if base is not None and not base.is_file():
        base = None
    return {"repo": pub.hf_repo if pub else None, "path_in_repo": pub.path_in_repo if pub else "",
            "card": card_facts(recipe, manifest, base, source_files(manifest, layout)),
            "chat": chat_facts(manifest, base, layout)}


def hub_files(hub: dict, override: str | None = None) -> dict[str, str]:
    """``{file: text}`` of the Hub's Ollama files for a ``hub`` section: ``params`` for a chat model, ``template``
    (the recipe's ``publish.ollama_template``, else Ollama's ChatML template only where it rendered at least one
    verified conversation, and every one, exactly as the model's template) and ``system`` (a ChatML default system
    prompt, beside a template). Without ``template`` Ollama picks one matching the GGUF's chat template itself.
    Exact texts: Ollama takes ``template`` and ``system`` as they are (no trailing newline added)."""
    chat = hub.get("chat") or {}
    if not chat.get("template"):
        return {}
    out = {}
    tmpl = override
    check = chat.get("ollama_template") or {}
    if tmpl is None and chat["template"] == "chatml" and check.get("checked") and not check.get("differ"):
        tmpl = CHATML_TEMPLATE
    if tmpl is not None:
        out["template"] = tmpl
        if chat.get("system"):
            out["system"] = chat["system"]
    out["params"] = json.dumps({"stop": chat["stop"]}, indent=2, ensure_ascii=False) + "\n"
    return {f: out[f] for f in HUB_OLLAMA_FILES if f in out}


def write_hub_files(texts: dict[str, str], folder: str | Path) -> list[dict]:
    """Write the Hub's Ollama files into ``folder`` (each atomically), remove those not in ``texts``, and return
    the entries of the manifest's ``hub.files`` (file, SHA256)."""
    folder = Path(folder)
    entries = []
    for name in HUB_OLLAMA_FILES:
        path = folder / name
        if name not in texts:
            if path.is_file() and not path.is_symlink():
                path.unlink()
            continue
        if not path.is_file() or path.read_bytes() != texts[name].encode("utf-8"):
            write_text_atomic(path, texts[name])
        entries.append({"file": name, "sha256": sha256_file(path)})
    return entries
