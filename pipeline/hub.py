"""Publishing: Ollama Modelfiles and the upload of an artifact folder to a Hugging Face repo.

Uploading is an explicit action (``ggufpipe hub-publish --recipe R [--dry-run]``), never part of a build.
It needs a ``publish:`` section in the recipe (pipeline/recipe.py) and a finished build of that recipe.

- :func:`modelfiles` / :func:`write_modelfiles`: one Ollama ``Modelfile.<KEY>`` per published model file
  (``FROM ./<name>-<KEY>.gguf``), written by the publish stage when ``publish.ollama`` is on (the default)
  and listed with its SHA256 in the manifest's ``ollama`` section. They are deterministic derived
  artifacts, like the model card: git-tracked, usable with ``ollama create`` without the Hub, and
  vouched for by the manifest like the GGUFs.
- :func:`upload_plan`: the exact files one Hub commit gets (local path, path in repo, SHA256, size), in a
  fixed order. Every GGUF is checked against the manifest first (size, SHA256, header, quant type: the
  same check as ``ggufpipe verify``) and so is every Modelfile; the manifest must come from the recipe as
  it is now and record no failed gate. Anything else refuses the plan with one line: nothing the
  manifest does not vouch for is ever uploaded.
- :func:`upload`: ``create_repo(exist_ok=True)`` then ONE ``create_commit`` with every file of the plan, so
  the Hub has either the whole build or none of it. The token is huggingface_hub's own (``HF_TOKEN`` or
  ``huggingface-cli login``); it is never passed on the command line, logged, or written to any file.
  The local record (``work/<name>/records/hub-publish.json``) is written, atomically, only after the
  commit succeeded; a failed upload raises one line and leaves no record and no temporary file.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from .errors import PipelineError
from .fsutil import sha256_file, write_json_atomic, write_text_atomic

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

# What the publish stage leaves in the artifact folder, in upload order after the GGUFs and Modelfiles.
FOLDER_FILES = (("README.md", "card"), ("report.md", "report"), ("report.svg", "plot"), ("metrics.json", "metrics"),
                ("manifest.json", "manifest"))


# --------------------------------------------------------------------------- Ollama Modelfiles


def chat_format(gguf: str | Path) -> dict:
    """The chat template (Jinja, ``tokenizer.chat_template``) and the EOS / EOT token texts of a GGUF."""
    from .ggufinfo import field, open_reader

    r = open_reader(gguf)
    tokens = r.fields.get("tokenizer.ggml.tokens")
    stops = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        tid = field(r, key)
        if tokens is not None and isinstance(tid, int) and 0 <= tid < len(tokens.data):
            text = bytes(tokens.parts[tokens.data[tid]]).decode("utf-8", "replace")
            if text and text not in stops:
                stops.append(text)
    template = field(r, "tokenizer.chat_template")
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


def publish_modelfiles(recipe, manifest: dict, folder: str | Path) -> dict:
    """For the publish stage: write (or remove) the Modelfiles and return ``manifest`` with its ``ollama``
    section (before the volatile ``build`` section) when the recipe asks for them."""
    pub = recipe.publish
    on = pub is not None and pub.ollama
    entries = write_modelfiles(manifest, folder, pub.ollama_template if on else None, enabled=on)
    if not on:
        return manifest
    out = {k: v for k, v in manifest.items() if k != "build"}
    out["ollama"] = entries
    if "build" in manifest:
        out["build"] = manifest["build"]
    return out


# --------------------------------------------------------------------------- the upload plan


def _refuse(name: str, msg: str):
    raise PipelineError(f"hub-publish {name}: refused: {msg}")


def load_manifest(folder: str | Path) -> dict:
    path = Path(folder) / "manifest.json"
    try:
        return json.loads(path.read_text())
    except OSError:
        raise PipelineError(f"{path}: missing: build the recipe first (`snakemake` or `ggufpipe build`)") from None
    except ValueError as exc:
        raise PipelineError(f"{path}: not valid JSON: {exc}") from None


def upload_plan(recipe, manifest: dict, folder: str | Path) -> list[dict]:
    """The exact files of the Hub commit: ``[{path_in_repo, local, sha256, size, kind}]``.

    Order: GGUFs (manifest order), Modelfiles (same order), then README.md (the model card), report.md,
    report.svg, metrics.json and manifest.json. Refuses (one line) unless ``manifest`` is the manifest in
    ``folder``, was built from ``recipe`` as it is now, records no failed check, and vouches for every
    GGUF and Modelfile (size and SHA256 as in ``ggufpipe verify``)."""
    from .manifest import gate_messages
    from .verify import verify

    folder = Path(folder)
    name = recipe.name
    pub = recipe.publish
    if pub is None:
        raise PipelineError(f"{recipe.path}: publish: missing (hub-publish needs `publish: {{hf_repo: org/name}}`)")
    mpath = folder / "manifest.json"
    if load_manifest(folder) != manifest:
        _refuse(name, f"{mpath} is not the manifest given (rebuilt meanwhile?): plan again")
    if manifest.get("name") != name:
        _refuse(name, f"{mpath} is the manifest of {manifest.get('name')!r}, not of recipe {name!r}")
    built_from = manifest.get("recipe", {}).get("sha256")
    if built_from != recipe.sha256:
        _refuse(name, f"{mpath} was built from another version of {recipe.path} (recipe sha256 {str(built_from)[:12]}…, "
                      f"now {recipe.sha256[:12]}…): rebuild (`snakemake`) before publishing")
    failed = gate_messages(manifest)
    if failed:
        _refuse(name, f"build {manifest['build_id']} has {len(failed)} failed check(s) (first: {failed[0]}); only a "
                      "build whose checks all passed is published")
    prefix = pub.path_in_repo + "/" if pub.path_in_repo else ""
    plan: list[dict] = []

    def add(path: Path, kind: str, sha256: str, size: int) -> None:
        rel = path.relative_to(folder).as_posix()  # a split file's shards keep their folder: <name>-<KEY>/...
        plan.append({"path_in_repo": prefix + rel, "local": str(path), "sha256": sha256, "size": size, "kind": kind})

    for e in manifest["artifacts"]:
        try:  # size, SHA256, GGUF header, quant type (of every shard of a split file)
            verify(folder / e["file"], manifest=mpath)
        except PipelineError as exc:
            _refuse(name, f"{exc} (only files the manifest vouches for are uploaded: restore the file or rebuild)")
        if e.get("split"):
            for s in e["split"]["shards"]:
                add(folder / e["file"] / s["file"], "gguf", s["sha256"], s["size_bytes"])
        else:
            add(folder / e["file"], "gguf", e["sha256"], e["size_bytes"])
    ollama = manifest.get("ollama")
    if pub.ollama and ollama is None:
        _refuse(name, f"{mpath} lists no Modelfiles though publish.ollama is on: rebuild (`snakemake`)")
    for m in ollama or []:
        path = folder / m["file"]
        digest = sha256_file(path) if path.is_file() else None
        if digest != m["sha256"]:
            _refuse(name, f"{path}: {'missing' if digest is None else 'SHA256 ' + digest} where the manifest says "
                          f"{m['sha256']}: re-publish (`snakemake --forcerun publish`)")
        add(path, "modelfile", digest, path.stat().st_size)
    for fname, kind in FOLDER_FILES:
        path = folder / fname
        if not path.is_file():
            _refuse(name, f"{path} is missing: re-publish (`snakemake --forcerun publish`)")
        if kind in ("card", "report") and manifest["build_id"] not in path.read_text(encoding="utf-8", errors="replace"):
            _refuse(name, f"{path} does not name build {manifest['build_id']} (left from another build): re-publish "
                          "(`snakemake --forcerun publish`)")
        add(path, kind, sha256_file(path), path.stat().st_size)
    return plan


def commit_message(manifest: dict) -> tuple[str, str]:
    """(title, description) of the Hub commit; the title names the build."""
    src = manifest.get("source", {})
    origin = f"{src['repo']}@{src.get('commit', src.get('revision', ''))}" if src.get("repo") else "a local folder"
    n = len(manifest["artifacts"])
    shards = sum(len(e["split"]["shards"]) for e in manifest["artifacts"] if e.get("split"))
    split = f" ({shards} shards of split files)" if shards else ""
    return (f"ggufpipe: publish {manifest['build_id']}",
            f"{n} GGUF file(s){split} of {manifest['name']} converted from {origin} with llama.cpp "
            f"b{manifest['tools']['llama_cpp_build']}; every file's SHA256 is in manifest.json.")


def describe(recipe, manifest: dict, plan: list[dict]) -> dict:
    """The plan with its destination: what ``--dry-run`` prints and what an upload commits."""
    pub = recipe.publish
    title, body = commit_message(manifest)
    return {"name": recipe.name, "build_id": manifest["build_id"], "repo": pub.hf_repo, "url": f"{HUB_URL}/{pub.hf_repo}",
            "revision": pub.revision, "private_if_created": pub.private, "path_in_repo": pub.path_in_repo,
            "commit_message": title, "commit_description": body, "files": plan}


def plan_markdown(desc: dict) -> str:
    total = sum(f["size"] for f in desc["files"])
    lines = [f"hub-publish {desc['name']}: build `{desc['build_id']}` -> {desc['url']} (branch `{desc['revision']}`"
             + (f", folder `{desc['path_in_repo']}/`" if desc["path_in_repo"] else "")
             + f"; {'private' if desc['private_if_created'] else 'public'} if created)",
             f"one commit \"{desc['commit_message']}\": {len(desc['files'])} files, {total / 2**20:.1f} MiB", "",
             "| path in repo | kind | bytes | sha256 | local file |", "|---|---|---|---|---|"]
    for f in desc["files"]:
        lines.append(f"| `{f['path_in_repo']}` | {f['kind']} | {f['size']} | `{f['sha256']}` | `{f['local']}` |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the upload


def _secrets(token: str | None) -> list[str]:
    from huggingface_hub import get_token

    return [t for t in {token, get_token()} if t]


def _one_line(exc: BaseException, secrets: list[str]) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    for s in secrets:
        text = text.replace(s, "***")
    return f"{type(exc).__name__}: {text[:400]}"


def upload(plan: list[dict], repo: str, *, build_id: str, revision: str = "main", private: bool = False,
           commit_message: str | None = None, commit_description: str | None = None, token: str | None = None,
           api=None, record: str | Path | None = None) -> dict:
    """Commit every file of ``plan`` to the model repo ``repo`` in ONE commit; return the record.

    ``api`` is a ``huggingface_hub.HfApi`` (default: ``HfApi()``, the Hub at ``HF_ENDPOINT``). ``token``
    defaults to huggingface_hub's own (``HF_TOKEN`` or the stored login) and is never written anywhere.
    The record (repo, commit, files and SHA256s) is written to ``record`` only after the commit
    succeeded; on any failure one PipelineError line is raised and nothing is written."""
    from huggingface_hub import CommitOperationAdd, HfApi, get_token

    if not plan:
        raise PipelineError(f"hub-publish {build_id}: the upload plan is empty")
    if token is None and get_token() is None:
        raise PipelineError(f"hub-publish {build_id}: no Hugging Face token: set HF_TOKEN or run `huggingface-cli login` "
                            "(a token with write access to " + repo + ")")
    ops = []
    for f in plan:  # CommitOperationAdd hashes the file: what is sent is what was planned
        try:
            op = CommitOperationAdd(path_in_repo=f["path_in_repo"], path_or_fileobj=f["local"])
        except (OSError, ValueError) as exc:
            raise PipelineError(f"hub-publish {build_id}: {f['local']}: cannot read: {exc}: nothing uploaded") from None
        if op.upload_info.sha256.hex() != f["sha256"] or op.upload_info.size != f["size"]:
            raise PipelineError(f"hub-publish {build_id}: {f['local']} changed after it was planned (sha256 "
                                f"{op.upload_info.sha256.hex()}, planned {f['sha256']}): nothing uploaded")
        ops.append(op)
    api = api if api is not None else HfApi()
    secrets = _secrets(token)
    try:
        api.create_repo(repo, repo_type="model", private=private, exist_ok=True, token=token)
        if revision != "main":
            api.create_branch(repo, branch=revision, repo_type="model", exist_ok=True, token=token)
        info = api.create_commit(repo, ops, repo_type="model", revision=revision, token=token,
                                 commit_message=commit_message or f"ggufpipe: publish {build_id}",
                                 commit_description=commit_description)
    except (OSError, ValueError) as exc:  # requests / huggingface_hub errors (offline mode, HTTP, connection)
        raise PipelineError(f"hub-publish {build_id}: upload to {repo} (branch {revision}) failed, no commit was made "
                            f"or confirmed and no record written: {_one_line(exc, secrets)}") from None
    rec = {"repo": repo, "revision": revision, "build_id": build_id, "commit_oid": info.oid,
           "commit_url": info.commit_url, "uploaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "files": [{"path_in_repo": f["path_in_repo"], "sha256": f["sha256"], "size": f["size"]} for f in plan]}
    if record is not None:
        write_json_atomic(record, rec)
    return rec


def hub_publish(recipe, layout, *, dry_run: bool = False, api=None, token: str | None = None,
                show=None) -> tuple[dict, dict | None]:
    """Entry function of ``ggufpipe hub-publish``: (the plan with its destination, the upload record or None).
    ``show(desc)`` is called with the plan before anything is uploaded."""
    folder = layout.art_dir(recipe.name)
    manifest = load_manifest(folder)
    plan = upload_plan(recipe, manifest, folder)
    desc = describe(recipe, manifest, plan)
    if show is not None:
        show(desc)
    if dry_run:
        return desc, None
    pub = recipe.publish
    rec = upload(plan, pub.hf_repo, build_id=manifest["build_id"], revision=pub.revision, private=pub.private,
                 commit_message=desc["commit_message"], commit_description=desc["commit_description"], token=token,
                 api=api, record=layout.hub_record(recipe.name))
    return desc, rec
