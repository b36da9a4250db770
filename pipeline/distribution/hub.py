"""Publishing: the upload of an artifact folder to a Hugging Face repo (what the publish stage writes for the Hub
and Ollama beside the GGUFs: pipeline/stages/hubfiles.py).

Uploading is an explicit action (``ggufpipe hub-publish --recipe R [--dry-run]``), never part of a build.
It needs a ``publish:`` section in the recipe (pipeline/recipe/) and a finished build of that recipe.

- :func:`upload_plan`: the exact files one Hub commit gets (local path, path in repo, SHA256, size), in a
  fixed order. Every GGUF is checked against the manifest first (size, SHA256, header, quant type: the
  same check as ``ggufpipe verify``) and so is every Modelfile and Hub file; the manifest must come from the recipe as
  it is now and record no failed gate. Anything else refuses the plan with one line: nothing the
  manifest does not vouch for is ever uploaded.
- :func:`upload`: ``create_repo(exist_ok=True)`` then ONE ``create_commit`` with every file of the plan, so
  the Hub has either the whole build or none of it. The token is huggingface_hub's own (``HF_TOKEN`` or
  ``huggingface-cli login``); it is never passed on the command line, logged, or written to any file.
  The local record (``work/<name>/records/hub-publish.json``) is written, atomically, only after the
  commit succeeded; a failed upload raises one line and leaves no record and no temporary file.
"""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.distribution.manifest_check import read_manifest
from pipeline.distribution.verify import verify
from pipeline.errors import ArtifactError, PipelineError, RecipeError
from pipeline.fsutil import sha256_file, write_json_atomic
from pipeline.stages.evaluate import gate_messages
from pipeline.stages.hubfiles import FOLDER_FILES, HUB_URL, mix_files

# --------------------------------------------------------------------------- the upload plan


def _refuse(name: str, msg: str):
    raise PipelineError(f"hub-publish {name}: refused: {msg}")


def load_manifest(folder: str | Path) -> dict:
    """The manifest of ``folder``, checked (pipeline/distribution/manifest_check.py): every part the plan uses is
    there, typed, and names files inside ``folder`` only."""
    path = Path(folder) / "manifest.json"
    if not path.exists():
        raise ArtifactError(path, f"{path}: missing: build the recipe first (`snakemake` or `ggufpipe build`)")
    return read_manifest(path, require=("name", "build_id", "recipe", "tools"))


def upload_plan(recipe, manifest: dict, folder: str | Path) -> list[dict]:
    """The exact files of the Hub commit: ``[{path_in_repo, local, sha256, size, kind}]``.

    Order: GGUFs (manifest order), Modelfiles (same order), the Hub's Ollama files of the manifest's ``hub``
    section (``template``, ``system``, ``params``: kind = the file name), then README.md (the model card),
    report.md, report.svg, metrics.json and manifest.json. Refuses (one line) unless ``manifest`` is the manifest
    in ``folder``, was built from ``recipe`` as it is now, records no failed check, and vouches for every GGUF,
    Modelfile and Hub file (size and SHA256 as in ``ggufpipe verify``)."""
    folder = Path(folder)
    name = recipe.name
    pub = recipe.publish
    if pub is None:
        raise RecipeError(recipe.path, "publish", "missing (hub-publish needs `publish: {hf_repo: org/name}`)")
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
    def add_vouched(fname: str, kind: str, want: str | None) -> None:
        """A file the manifest names: present, and with its recorded SHA256 where it records one."""
        path = folder / fname
        digest = sha256_file(path) if path.is_file() else None
        if digest is None or (want is not None and digest != want):
            _refuse(name, f"{path}: {'missing' if digest is None else 'SHA256 ' + digest} where the manifest says "
                          f"{want}: re-publish (`snakemake --forcerun publish`)")
        add(path, kind, digest, path.stat().st_size)

    for m in ollama or []:
        add_vouched(m["file"], "modelfile", m["sha256"])
    for h in (manifest.get("hub") or {}).get("files", []):  # params, template, system: the Hub's Ollama files
        add_vouched(h["file"], h["file"], h["sha256"])
    for fname, kind in FOLDER_FILES:
        path = folder / fname
        if not path.is_file():
            _refuse(name, f"{path} is missing: re-publish (`snakemake --forcerun publish`)")
        if kind in ("card", "report") and manifest["build_id"] not in path.read_text(encoding="utf-8", errors="replace"):
            _refuse(name, f"{path} does not name build {manifest['build_id']} (left from another build): re-publish "
                          "(`snakemake --forcerun publish`)")
        add(path, kind, sha256_file(path), path.stat().st_size)
    for fname, kind, want in mix_files(manifest):  # the mixes' maps (SHA256 in the manifest) and heat maps
        add_vouched(fname, kind, want)
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
    # huggingface_hub (slow): every CLI start loads this module; only an upload needs it
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
    # huggingface_hub (slow): only an upload needs it
    import httpx  # huggingface_hub 1.x's HTTP client: its connection errors are not OSErrors
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
    except (OSError, ValueError, httpx.HTTPError) as exc:  # huggingface_hub errors (offline mode, HTTP, connection)
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
