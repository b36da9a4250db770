"""Publishing (pipeline/distribution/hub.py): Ollama Modelfiles, the exact Hub upload plan, and uploads that either commit
everything or leave nothing behind.

The Hub cannot be reached from here. The artifact folder is real: tiny GGUFs (tests/helpers/gguf_factory.py, with the demo
SmolLM2 tokenizer and its ChatML chat template) quantized by the real llama-quantize, then the real publish stage
(`pipeline.stages.publish.publish`) over hand-written stage records (fetch / convert / quantize). Uploads use
huggingface_hub's real HfApi: against HF_HUB_OFFLINE=1 and a closed port (failures), and against a small local
stand-in for the Hub's HTTP API (`FakeHub`: create repo, validate README metadata, preupload, commit), which
receives the one commit exactly as huggingface_hub sends it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import FAKE_TOKEN, HUB_KEYS, HUB_NAME, HUB_REPO, HUB_SOURCE_COMMIT, ROOT, hub_recipe_data, write_hub_recipe

from pipeline.distribution.hub import hub_publish, load_manifest, upload, upload_plan
from pipeline.errors import PipelineError
from pipeline.fsutil import sha256_file
from pipeline.layout import Layout
from pipeline.recipe import load_recipe
from pipeline.stages.hubfiles import CHATML_TEMPLATE, modelfiles

SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
PARAMS = {"stop": ["<|im_end|>", "<|im_start|>"]}  # the Modelfiles' stops, in the Hub's `params` file


def publish_folder(root: Path, data: dict):
    """Run the real publish stage of ``data`` in ``root`` (its GGUFs and stage records must be there)."""
    from pipeline.stages.publish import publish

    recipe = load_recipe(write_hub_recipe(root, data))
    layout = Layout(root / "artifacts", root / "work")
    publish(recipe, layout)
    return recipe, layout


def small_vocab(tok) -> None:
    """The first 1024 tokens (SmolLM2's specials, <|endoftext|> <|im_start|> <|im_end|>, are ids 0-2) and
    200 merges: the chat template and EOS stay; gguf's reader parses the file in milliseconds, not seconds."""
    tok.truncate(1024)
    tok.set("tokenizer.ggml.merges", tok.get("tokenizer.ggml.merges")[:200])


@pytest.fixture(scope="module")
def built(tmp_path_factory, source_gguf, toolchain, quantize_exe):
    """A published artifact folder: F16 base + Q8_0 + Q4_K_M (llama-quantize), card, report, manifest,
    Modelfiles. Tests that change anything work on a copy (:func:`clone`)."""
    from helpers.gguf_factory import tiny_llama

    root = tmp_path_factory.mktemp("hub")
    layout = Layout(root / "artifacts", root / "work")
    recipe = load_recipe(write_hub_recipe(root, hub_recipe_data()))
    for d in (layout.art_dir(HUB_NAME), layout.wrk(HUB_NAME, "records"), layout.wrk(HUB_NAME, "quants")):
        d.mkdir(parents=True)
    base = tiny_llama(layout.base_gguf(recipe), tokenizer_from=source_gguf, edit=small_vocab, dtype="F16",
                      name="tiny-chat")
    for key in HUB_KEYS:
        out = layout.quant(recipe, key)
        out.parent.mkdir(parents=True, exist_ok=True)
        res = subprocess.run([quantize_exe, str(base), str(out), key, "1"], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
        layout.quant_record(HUB_NAME, key).write_text(json.dumps({"quant": recipe.quant(key).describe()}))
    layout.fetch_record(HUB_NAME).write_text(json.dumps(
        {"source": {**recipe.source.describe(), "commit": HUB_SOURCE_COMMIT}, "files": {}}))
    layout.convert_record(recipe).write_text(json.dumps({"toolchain": toolchain.describe(), "python": {}}))
    publish_folder(root, hub_recipe_data())
    return root


def clone(built: Path, dest: Path) -> tuple[Path, Layout]:
    """A copy of the built folder (hard links: replace a file before changing it, see :func:`tamper`)."""
    shutil.copytree(built, dest, copy_function=os.link)
    return dest, Layout(dest / "artifacts", dest / "work")


def tamper(path: Path, offset: int = -100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.unlink()  # break the hard link: the module's folder stays intact
    path.write_bytes(bytes(data))


def files_state(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def assert_nothing_leaked(root: Path) -> None:
    temps = [p for p in root.rglob("*") if ".tmp-" in p.name]
    assert not temps, temps
    for p in root.rglob("*"):
        if p.is_file():
            assert FAKE_TOKEN.encode() not in p.read_bytes(), p


def art(root: Path) -> Path:
    return root / "artifacts" / HUB_NAME


# --------------------------------------------------------------------------- Modelfiles


def expected_modelfile(entry: dict, build_id: str, key: str) -> str:
    return "".join([
        f"# Ollama Modelfile for {entry['file']} ({entry['quant_type']}), written by ggufpipe.\n",
        f"# Build {build_id}; {entry['file']}: {entry['size_bytes']} bytes, sha256 {entry['sha256']}\n",
        f"# (check: ggufpipe verify {entry['file']}). Use: ollama create {HUB_NAME}:{key.lower()} -f Modelfile.{key}\n",
        "# TEMPLATE: ChatML. The GGUF's chat template (tokenizer.chat_template, Jinja) uses <|im_start|> /\n",
        "# <|im_end|>; this is Ollama's standard ChatML Go template (no tool-call formatting).\n",
        f"FROM ./{entry['file']}\n",
        'TEMPLATE """{{- range .Messages }}<|im_start|>{{ .Role }}\n',
        "{{ .Content }}<|im_end|>\n",
        '{{ end }}<|im_start|>assistant\n"""\n',
        f'SYSTEM """{SMOLLM_SYSTEM}"""\n',
        'PARAMETER stop "<|im_end|>"\n',   # the GGUF's EOS token
        'PARAMETER stop "<|im_start|>"\n',  # ChatML's turn start
    ])


def test_publish_stage_writes_modelfiles_the_manifest_vouches_for(built):
    folder = art(built)
    manifest = load_manifest(folder)
    files = [e["file"] for e in manifest["artifacts"]]
    assert files == [f"{HUB_NAME}-F16.gguf", f"{HUB_NAME}-Q8_0.gguf", f"{HUB_NAME}-Q4_K_M.gguf"]
    assert [(m["file"], m["gguf"], m["template"]) for m in manifest["ollama"]] == [
        ("Modelfile.F16", f"{HUB_NAME}-F16.gguf", "chatml"), ("Modelfile.Q8_0", f"{HUB_NAME}-Q8_0.gguf", "chatml"),
        ("Modelfile.Q4_K_M", f"{HUB_NAME}-Q4_K_M.gguf", "chatml")]
    assert list(manifest)[-2:] == ["ollama", "build"]
    for m, e, key in zip(manifest["ollama"], manifest["artifacts"], ["F16", *HUB_KEYS], strict=True):
        text = (folder / m["file"]).read_text()
        assert text == expected_modelfile(e, manifest["build_id"], key)
        assert m["sha256"] == sha256_file(folder / m["file"])
    assert sorted(p.name for p in folder.glob("Modelfile.*")) == ["Modelfile.F16", "Modelfile.Q4_K_M", "Modelfile.Q8_0"]
    assert CHATML_TEMPLATE in (folder / "Modelfile.Q8_0").read_text()
    card = (folder / "README.md").read_text()
    assert "## Run with Ollama" in card
    assert f"ollama create {HUB_NAME}:q4_k_m -f Modelfile.Q4_K_M && ollama run {HUB_NAME}:q4_k_m" in card
    # modelfiles() is what the stage wrote
    assert modelfiles(manifest, folder) == {m["file"]: (folder / m["file"]).read_text() for m in manifest["ollama"]}
    # the Hub's Ollama files: params (the GGUF's EOS and ChatML's turn tokens: conformance is off in this recipe), no
    # template (nothing verified to check Ollama's ChatML template against)
    assert json.loads((folder / "params").read_text()) == PARAMS
    assert not (folder / "template").exists() and not (folder / "system").exists()
    assert manifest["hub"]["files"] == [{"file": "params", "sha256": sha256_file(folder / "params")}]
    assert manifest["hub"]["chat"]["stop_from"] == "gguf"
    assert "No `template` (no conversation verified by the conformance stage" in card


def test_publish_stage_removes_modelfiles_when_ollama_is_off(built, tmp_path):
    root, _ = clone(built, tmp_path / "b")
    publish_folder(root, hub_recipe_data(ollama=False))
    manifest = load_manifest(art(root))
    assert "ollama" not in manifest
    assert not list(art(root).glob("Modelfile.*"))
    assert manifest["hub"]["files"] == [] and not (art(root) / "params").exists()  # the Hub's Ollama files too
    assert "Run with Ollama" not in (art(root) / "README.md").read_text()


def test_publish_replaces_the_png_plot_of_earlier_versions(built, tmp_path):
    root, _ = clone(built, tmp_path / "p")
    (art(root) / "report.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # what publish wrote before report.svg
    publish_folder(root, hub_recipe_data())
    assert not (art(root) / "report.png").exists() and (art(root) / "report.svg").is_file()
    assert "](report.svg)" in (art(root) / "report.md").read_text()


@pytest.mark.parametrize("case", ["phi3-eot", "no-template", "override"])
def test_modelfile_without_chatml(tmp_path, case):
    """Phi-3's template is not ChatML: no TEMPLATE (Ollama matches the GGUF's own), stops from EOS and EOT."""
    from gguf import TokenType
    from helpers.gguf_factory import tiny_llama

    from pipeline.gguf import read_facts
    from pipeline.tools import find_toolchain

    vocab = find_toolchain().root / "vocab" / "ggml-vocab-phi-3.gguf"

    def edit(tok) -> None:  # Phi-3's chat template and end tokens on a small vocab (fast to read)
        tok.truncate(1000)
        eos, eot = tok.append_tokens(["<|endoftext|>", "<|end|>"], token_type=TokenType.CONTROL)
        tok.set("eos_token_id", eos)
        tok.set("padding_token_id", eos)
        tok.set("eot_token_id", eot)  # <|end|>, Phi-3's end of turn
        if case == "no-template":
            tok.remove("tokenizer.chat_template")

    path = tiny_llama(tmp_path / "phi-F16.gguf", tokenizer_from=vocab, edit=edit, dtype="F16", n_layer=1)
    manifest = {"name": "phi", "build_id": "phi-0123456789ab", "artifacts": [{**read_facts(path).as_dict(), "role": "base"}]}
    template = "{{ .Prompt }}" if case == "override" else None
    text = modelfiles(manifest, tmp_path, template=template)["Modelfile.F16"]
    body = [line for line in text.splitlines() if not line.startswith("#")]
    want = ["FROM ./phi-F16.gguf", 'PARAMETER stop "<|endoftext|>"', 'PARAMETER stop "<|end|>"']
    if case == "override":
        want.insert(1, 'TEMPLATE """{{ .Prompt }}"""')
    assert body == want
    note = {"phi3-eot": "# No TEMPLATE: the GGUF's chat template (tokenizer.chat_template) is Jinja, not ChatML",
            "no-template": "# No TEMPLATE: the GGUF has no chat template (a completion model).",
            "override": "# TEMPLATE: from the recipe (publish.ollama_template)."}[case]
    assert note in text


# --------------------------------------------------------------------------- the plan


def expected_plan(folder: Path, manifest: dict, prefix: str = "") -> list[dict]:
    plan = [{"path_in_repo": prefix + e["file"], "local": str(folder / e["file"]), "sha256": e["sha256"],
             "size": e["size_bytes"], "kind": "gguf"} for e in manifest["artifacts"]]
    plan += [{"path_in_repo": prefix + m["file"], "local": str(folder / m["file"]), "sha256": m["sha256"],
              "size": (folder / m["file"]).stat().st_size, "kind": "modelfile"} for m in manifest["ollama"]]
    plan += [{"path_in_repo": prefix + h["file"], "local": str(folder / h["file"]), "sha256": h["sha256"],
              "size": (folder / h["file"]).stat().st_size, "kind": h["file"]} for h in manifest["hub"]["files"]]
    for f, kind in [("README.md", "card"), ("report.md", "report"), ("report.svg", "plot"),
                    ("metrics.json", "metrics"), ("manifest.json", "manifest")]:
        plan.append({"path_in_repo": prefix + f, "local": str(folder / f), "sha256": sha256_file(folder / f),
                     "size": (folder / f).stat().st_size, "kind": kind})
    return plan


def test_upload_plan_is_exact(built):
    folder = art(built)
    recipe = load_recipe(built / "recipes" / f"{HUB_NAME}.yaml")
    manifest = load_manifest(folder)
    plan = upload_plan(recipe, manifest, folder)
    assert plan == expected_plan(folder, manifest)
    assert [p["path_in_repo"] for p in plan] == [
        f"{HUB_NAME}-F16.gguf", f"{HUB_NAME}-Q8_0.gguf", f"{HUB_NAME}-Q4_K_M.gguf", "Modelfile.F16", "Modelfile.Q8_0",
        "Modelfile.Q4_K_M", "params", "README.md", "report.md", "report.svg", "metrics.json", "manifest.json"]
    for p in plan:  # every SHA256 is the file's
        assert sha256_file(p["local"]) == p["sha256"]
    assert upload_plan(recipe, manifest, folder) == plan  # deterministic


def test_upload_to_a_folder_and_branch(built, tmp_path, online):
    """``path_in_repo`` prefixes every path (the card becomes that folder's README); a branch other than main
    is created (exist_ok) before the commit goes to it."""
    from huggingface_hub import HfApi

    root, layout = clone(built, tmp_path / "b")
    recipe, _ = publish_folder(root, hub_recipe_data(path_in_repo="gguf/v1/", revision="release", private=True))
    assert recipe.publish.path_in_repo == "gguf/v1" and recipe.publish.revision == "release"
    manifest = load_manifest(art(root))
    plan = upload_plan(recipe, manifest, art(root))
    assert plan == expected_plan(art(root), manifest, "gguf/v1/")
    with FakeHub() as hub:
        desc, rec = hub_publish(recipe, layout, api=HfApi(endpoint=hub.url))
    assert desc["files"] == plan and rec["revision"] == "release"
    assert [r["path"].split("?")[0] for r in hub.requests] == [  # no README metadata check: not the repo's card
        "/api/repos/create", f"/api/models/{HUB_REPO}/branch/release", f"/api/models/{HUB_REPO}/preupload/release",
        f"/api/models/{HUB_REPO}/commit/release"]
    assert json.loads(hub.requests[0]["body"])["visibility"] == "private"
    assert [f["value"]["path"] for f in hub.commits[0][1:]] == [p["path_in_repo"] for p in plan]


def test_dry_run_prints_the_plan_and_touches_nothing(built, tmp_path):
    root, _ = clone(built, tmp_path / "b")
    before = files_state(root)
    res = run_cli(root, "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    desc = json.loads(res.stdout)
    manifest = load_manifest(art(root))
    assert desc["repo"] == HUB_REPO and desc["revision"] == "main" and desc["private_if_created"] is False
    assert desc["commit_message"] == f"ggufpipe: publish {manifest['build_id']}"
    want = [{**p, "local": str(Path(p["local"]).relative_to(root))} for p in expected_plan(art(root), manifest)]
    assert desc["files"] == want  # local paths as the CLI was given them
    assert res.stderr.strip() == "dry run: nothing uploaded"
    md = run_cli(root, "--dry-run")
    assert md.returncode == 0 and f"| `{HUB_NAME}-Q4_K_M.gguf` | gguf |" in md.stdout
    assert files_state(root) == before
    assert FAKE_TOKEN not in res.stdout + res.stderr + md.stdout + md.stderr


def test_dry_run_needs_no_huggingface_hub(built, tmp_path):
    """Planning is light (numpy + gguf): only the upload imports huggingface_hub."""
    root, _ = clone(built, tmp_path / "b")
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('huggingface_hub', 'requests', 'matplotlib', 'torch'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from pipeline.cli import main\n"
        f"sys.exit(main(['hub-publish', '--recipe', 'recipes/{HUB_NAME}.yaml', '--dry-run', '--json']))\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=root, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(json.loads(res.stdout)["files"]) == 12


def refusal(root: Path, case: str) -> None:
    folder = art(root)
    if case == "altered-gguf":
        tamper(folder / f"{HUB_NAME}-Q8_0.gguf")
    elif case == "truncated-gguf":
        p = folder / f"{HUB_NAME}-Q4_K_M.gguf"
        data = p.read_bytes()
        p.unlink()
        p.write_bytes(data[:-1000])
    elif case == "missing-gguf":
        (folder / f"{HUB_NAME}-F16.gguf").unlink()
    elif case == "altered-modelfile":
        p = folder / "Modelfile.Q8_0"
        text = p.read_text()
        p.unlink()
        p.write_text(text.replace("<|im_end|>", "</s>"))
    elif case == "altered-params":
        p = folder / "params"
        text = p.read_text()
        p.unlink()
        p.write_text(text.replace("<|im_start|>", "</s>"))
    elif case == "stale-card":
        p = folder / "README.md"
        text = p.read_text()
        p.unlink()
        p.write_text(text.replace(load_manifest(folder)["build_id"], "tiny-chat-000000000000"))
    elif case == "failed-gate":
        m = load_manifest(folder)
        m["rejected"] = [{"file": f"{HUB_NAME}-Q2_K.gguf", "failures": [{"message": "gate failed: recipe tiny-chat, quant "
                                                                                "Q2_K, eval set x: kld_mean = 1 > 0.1"}]}]
        (folder / "manifest.json").unlink()
        (folder / "manifest.json").write_text(json.dumps(m))
    elif case == "recipe-edited":
        write_hub_recipe(root, {**hub_recipe_data(), "description": "edited after the build"})


REFUSALS = {
    "altered-gguf": "does not match the manifest's",
    "truncated-gguf": "truncated or wrong file",
    "missing-gguf": "missing (not pulled?)",
    "altered-modelfile": "re-publish (`snakemake --forcerun publish`)",
    "altered-params": "params: SHA256 ",
    "stale-card": "does not name build",
    "failed-gate": "1 failed check(s) (first: gate failed: recipe tiny-chat, quant Q2_K",
    "recipe-edited": "was built from another version of",
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_upload_plan_refuses_what_the_manifest_does_not_vouch_for(built, tmp_path, case):
    root, _ = clone(built, tmp_path / "b")
    refusal(root, case)
    recipe = load_recipe(root / "recipes" / f"{HUB_NAME}.yaml")
    with pytest.raises(PipelineError) as exc:
        upload_plan(recipe, load_manifest(art(root)), art(root))
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"hub-publish {HUB_NAME}: refused: ")
    assert REFUSALS[case] in msg


# --------------------------------------------------------------------------- uploads


def run_cli(root: Path, *args: str, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "HF_TOKEN": FAKE_TOKEN, "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "hub-publish", "--recipe", f"recipes/{HUB_NAME}.yaml",
                           *args], cwd=root, env=full, capture_output=True, text=True, timeout=120)


def test_offline_upload_fails_in_one_line_and_leaves_nothing(built, tmp_path):
    """Real huggingface_hub with HF_HUB_OFFLINE=1 (the CLI in a subprocess): no record, nothing half-written."""
    root, layout = clone(built, tmp_path / "b")
    before = files_state(root)
    res = run_cli(root)
    assert res.returncode == 1, res.stdout + res.stderr
    err = res.stderr.strip().splitlines()
    assert len(err) == 1, err
    manifest = load_manifest(art(root))
    assert err[0].startswith(f"error: hub-publish {manifest['build_id']}: upload to {HUB_REPO} (branch main) failed, "
                             "no commit was made or confirmed and no record written: OfflineModeIsEnabled: ")
    assert f"| `{HUB_NAME}-F16.gguf` | gguf |" in res.stdout  # the plan was shown before the attempt
    assert not layout.hub_record(HUB_NAME).exists()
    assert files_state(root) == before
    assert_nothing_leaked(root)
    assert FAKE_TOKEN not in res.stdout + res.stderr


def test_upload_without_a_token_is_refused_before_any_request(built, tmp_path, monkeypatch):
    root, layout = clone(built, tmp_path / "b")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no stored login either
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setattr("huggingface_hub.constants.HF_STORED_TOKENS_PATH", str(tmp_path / "hf-home" / "stored_tokens"))
    recipe = load_recipe(root / "recipes" / f"{HUB_NAME}.yaml")
    with pytest.raises(PipelineError, match="no Hugging Face token: set HF_TOKEN"):
        hub_publish(recipe, layout)
    assert not layout.hub_record(HUB_NAME).exists()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_error_leaves_no_record(built, tmp_path, online):
    from huggingface_hub import HfApi

    root, layout = clone(built, tmp_path / "b")
    recipe = load_recipe(root / "recipes" / f"{HUB_NAME}.yaml")
    with pytest.raises(PipelineError) as exc:
        hub_publish(recipe, layout, api=HfApi(endpoint=f"http://127.0.0.1:{closed_port()}"))
    assert "\n" not in str(exc.value) and "ConnectError" in str(exc.value)
    assert not layout.hub_record(HUB_NAME).exists()
    assert_nothing_leaked(root)


class FakeHub:
    """A local stand-in for the Hub's HTTP API, enough for HfApi.create_repo / create_commit: it answers
    "regular" to preupload (so file contents travel base64 in the commit) and records every request."""

    OID = "c0ffee" + "0" * 34
    commit_url = f"https://huggingface.co/{HUB_REPO}/commit/{OID}"  # the Hub answers with its public URL

    def __init__(self, fail_commit: bool = False):
        self.requests: list[dict] = []
        self.commits: list[list[dict]] = []
        self.fail_commit = fail_commit
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hub.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                path = self.path.split("?")[0]
                if path == "/api/repos/create":
                    return self.reply(200, {"url": f"{hub.url}/{HUB_REPO}", "name": HUB_REPO})
                if "/branch/" in path:
                    return self.reply(200, {})
                if path == "/api/validate-yaml":
                    return self.reply(200, {"errors": [], "warnings": []})
                if "/preupload/" in path:
                    files = json.loads(body)["files"]
                    return self.reply(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                      for f in files]})
                if "/commit/" in path:
                    if hub.fail_commit:
                        return self.reply(500, {"error": "Internal Error - We're working hard to fix this"})
                    hub.commits.append([json.loads(line) for line in body.splitlines() if line.strip()])
                    return self.reply(200, {"commitOid": hub.OID, "commitUrl": hub.commit_url, "success": True})
                return self.reply(404, {"error": f"not faked: {self.path}"})

            def reply(self, status: int, data: dict):
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def online(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    from huggingface_hub.utils import close_session  # hub 1.x: its httpx client, made again on next use

    close_session()
    yield
    close_session()


def test_upload_commits_the_plan_in_one_commit(built, tmp_path, online):
    """Real HfApi against FakeHub: one commit holding exactly the planned files (paths, order, bytes), the
    token sent only as the Authorization header, and the record written after the commit."""
    from huggingface_hub import HfApi

    root, layout = clone(built, tmp_path / "b")
    recipe = load_recipe(root / "recipes" / f"{HUB_NAME}.yaml")
    with FakeHub() as hub:
        desc, rec = hub_publish(recipe, layout, api=HfApi(endpoint=hub.url))
    manifest = load_manifest(art(root))
    plan = desc["files"]
    assert plan == expected_plan(art(root), manifest)
    assert [r["path"].split("?")[0] for r in hub.requests] == [
        "/api/repos/create", "/api/validate-yaml", f"/api/models/{HUB_REPO}/preupload/main", f"/api/models/{HUB_REPO}/commit/main"]
    assert {r["auth"] for r in hub.requests} == {f"Bearer {FAKE_TOKEN}"}
    assert json.loads(hub.requests[0]["body"]) == {"name": HUB_REPO.split("/")[1], "organization": HUB_REPO.split("/")[0],
                                                   "visibility": "public", "type": "model"}
    [commit] = hub.commits
    header, *files = commit
    assert header == {"key": "header", "value": {"summary": f"ggufpipe: publish {manifest['build_id']}",
                                                 "description": desc["commit_description"]}}
    assert [f["value"]["path"] for f in files] == [p["path_in_repo"] for p in plan]
    for f, p in zip(files, plan, strict=True):
        assert f["key"] == "file" and f["value"]["encoding"] == "base64"
        assert hashlib.sha256(base64.b64decode(f["value"]["content"])).hexdigest() == p["sha256"]
    sent = {f["value"]["path"]: base64.b64decode(f["value"]["content"]) for f in files}
    assert json.loads(sent["params"]) == PARAMS and "template" not in sent  # the Hub's Ollama files at the root
    from huggingface_hub import ModelCard

    validated = json.loads(hub.requests[1]["body"])["content"]  # the card's metadata, as the Hub checks it
    assert validated == sent["README.md"].decode()
    data = ModelCard(validated).data
    assert (data.base_model, data.base_model_relation, data.license, data.library_name) == (
        "org/tiny-chat", "quantized", "apache-2.0", "gguf")
    assert data.tags == ["gguf", "llama-cpp"] and data.datasets is None
    assert f"`llama-cli -hf {HUB_REPO}:Q4_K_M`" in validated and f"`ollama run hf.co/{HUB_REPO}:Q8_0`" in validated
    assert rec == json.loads(layout.hub_record(HUB_NAME).read_text())
    assert {k: rec[k] for k in ("repo", "revision", "build_id", "commit_oid", "commit_url")} == {
        "repo": HUB_REPO, "revision": "main", "build_id": manifest["build_id"], "commit_oid": FakeHub.OID,
        "commit_url": FakeHub.commit_url}
    assert rec["files"] == [{k: p[k] for k in ("path_in_repo", "sha256", "size")} for p in plan]
    assert_nothing_leaked(root)


def test_failed_commit_leaves_no_record(built, tmp_path, online):
    """The Hub refuses the commit after the repo was created: no record, no temporary file, the token in no
    message or file; the Hub itself has no partial commit (create_commit is all or nothing)."""
    from huggingface_hub import HfApi

    root, layout = clone(built, tmp_path / "b")
    recipe = load_recipe(root / "recipes" / f"{HUB_NAME}.yaml")
    before = files_state(root)
    with FakeHub(fail_commit=True) as hub, pytest.raises(PipelineError) as exc:
        hub_publish(recipe, layout, api=HfApi(endpoint=hub.url))
    msg = str(exc.value)
    assert "\n" not in msg and ("failed, no commit was made or confirmed and no record written: HfHubHTTPError: Server "
                                 "error '500 Internal Server Error'") in msg
    assert FAKE_TOKEN not in msg
    assert hub.commits == [] and hub.requests[-1]["path"].startswith(f"/api/models/{HUB_REPO}/commit/main")
    assert not layout.hub_record(HUB_NAME).exists()
    assert files_state(root) == before
    assert_nothing_leaked(root)


def test_file_changed_after_planning_is_not_uploaded(built, tmp_path, online):
    from huggingface_hub import HfApi

    root, layout = clone(built, tmp_path / "b")
    recipe = load_recipe(root / "recipes" / f"{HUB_NAME}.yaml")
    plan = upload_plan(recipe, load_manifest(art(root)), art(root))
    tamper(art(root) / f"{HUB_NAME}-Q4_K_M.gguf")
    with FakeHub() as hub, pytest.raises(PipelineError, match="changed after it was planned"):
        upload(plan, HUB_REPO, build_id="x", api=HfApi(endpoint=hub.url), record=layout.hub_record(HUB_NAME))
    assert hub.requests == [] and not layout.hub_record(HUB_NAME).exists()


# --------------------------------------------------------------------------- the recipe section


