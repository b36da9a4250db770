"""Hub-native publishing (issue #16): the card's front matter from the fetched source's model card, the verified prompt
format, and the Hub's Ollama files (``params``, ``template``, ``system``) of a ChatML chat model whose conformance
record verified its renders, through the real publish stage and the local stand-in for the Hub's commit API.

The artifact folder is real: a tiny F16 GGUF with the demo's SmolLM2 tokenizer and ChatML template, a Q8_0 by the
real llama-quantize, the real publish stage (``pipeline.stages.publish.publish``). The stage records are written by hand
(as in tests/integration/test_hub.py); the conformance record's renders are transformers' own
(``render_jinja_template``, what ``apply_chat_template`` renders) of the GGUF's template: the real stage records a
conversation only where llama.cpp's render is identical to it. Ollama's Go templates cannot be run here (no Ollama,
no Go toolchain): :func:`pipeline.stages.hubfiles.ollama_chatml_render` is what Ollama renders with its ChatML template, and the
vendored-template test below shows why the publish stage checks it against every verified render before it writes
a ``template``: the ChatML markers alone do not make a template ChatML.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import HUB_REPO, HUB_SOURCE_COMMIT, hub_recipe_data, write_hub_recipe

from integration.test_hub import SMOLLM_SYSTEM, FakeHub, online, small_vocab  # noqa: F401 (online: a fixture)
from pipeline.distribution.hub import hub_publish, load_manifest, upload_plan
from pipeline.fsutil import sha256_file
from pipeline.layout import Layout
from pipeline.recipe import load_recipe
from pipeline.stages.hubfiles import (
    CHATML_TEMPLATE,
    _chatml_system,
    _plain_conversation,
    hub_section,
    ollama_chatml_render,
)

NAME = "tiny-chat"
SOURCE_CARD = """---
license: other
license_name: tiny-license
license_link: LICENSE
language:
- en
- fr
datasets:
- HuggingFaceTB/smollm-corpus
tags: [chat]
---
# Tiny chat (test fixture)
"""
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
STOP = ["<|endoftext|>", "<|im_end|>"]  # the texts of the verified EOG ids 0 and 2


def recipe_data() -> dict:
    data = hub_recipe_data()
    del data["license"], data["conformance"]  # the source card's license; conformance on (its record below)
    return data


def hf_render(template: str, conv: dict, date: str) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        [conv["messages"]],
        chat_template=template,
        date_string=date,
        add_generation_prompt=bool(conv.get("add_generation_prompt")),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        enable_thinking=True,
    )
    return rendered[0]


def conformance_record(template: str) -> dict:
    """A passed conformance record: every conversation without tools rendered identically (the HF text)."""
    from pipeline.stages.conformance import load_conversations

    conversations = load_conversations()
    rows = []
    for conv in conversations["conversations"]:
        row = {"name": conv["name"], "add_generation_prompt": bool(conv.get("add_generation_prompt"))}
        if conv.get("tools"):
            row["skipped"] = "the HF template does not use tools"
        else:
            text = hf_render(template, conv, conversations["date_string"])
            row.update(verdict="identical", hf_text=text, llama_prompt=text)
        rows.append(row)
    checks = {
        "tokenizer": {"passed": True, "summary": "42 probes x 3 modes: (a) 0 mismatches"},
        "chat_template": {
            "passed": True,
            "conversations": len(rows),
            "identical": 5,
            "rejected_by_both": 0,
            "skipped": 2,
            "now_dependent": False,
            "summary": "7 conversations: 5 identical (text and ids), 2 skipped (no tools in the HF template)",
        },
        "eog": {
            "passed": True,
            "eog": [0, 2],
            "hf_eos_ids": [2],
            "hf_eos_source": "generation_config.json",
            "gguf_eos": 2,
            "turn_end": "<|im_end|>",
            "turn_end_id": 2,
            "summary": "EOG [0, 2]",
        },
        "logits": {"passed": True, "not_run": "not run: the recipe has no eval text"},
    }
    return {
        "recipe": NAME,
        "passed": True,
        "failures": [],
        "warnings": [],
        "checks": checks,
        "thresholds": {},
        "chunks": 4,
        "threads": 2,
        "gguf": f"{NAME}-F16.gguf",
        "details": {"chat_template": {"conversations": rows}},
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory, source_gguf, toolchain, quantize_exe):
    """A published folder of the verified ChatML model (F16 + Q8_0) with its fetched source's card and config."""
    from helpers.gguf_factory import tiny_llama

    from pipeline.gguf import read_header
    from pipeline.stages.publish import publish

    root = tmp_path_factory.mktemp("card-hub")
    layout = Layout(root / "artifacts", root / "work")
    data = {**recipe_data(), "quants": ["Q8_0"]}
    recipe = load_recipe(write_hub_recipe(root, data))
    for d in (layout.art_dir(NAME), layout.wrk(NAME, "records"), layout.wrk(NAME, "quants"), layout.hf(NAME)):
        d.mkdir(parents=True)
    base = tiny_llama(layout.base_gguf(recipe), tokenizer_from=source_gguf, edit=small_vocab, dtype="F16", name=NAME)
    out = layout.quant(recipe, "Q8_0")
    res = subprocess.run([quantize_exe, str(base), str(out), "Q8_0", "1"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    layout.quant_record(NAME, "Q8_0").write_text(json.dumps({"quant": recipe.quant("Q8_0").describe()}))
    hf = layout.hf(NAME)
    (hf / "README.md").write_text(SOURCE_CARD)
    (hf / "config.json").write_text(json.dumps(CONFIG))
    files = {f: {"sha256": sha256_file(hf / f), "size": (hf / f).stat().st_size} for f in ("README.md", "config.json")}
    layout.fetch_record(NAME).write_text(
        json.dumps({"source": {**recipe.source.describe(), "commit": HUB_SOURCE_COMMIT}, "files": files})
    )
    layout.convert_record(recipe).write_text(json.dumps({"toolchain": toolchain.describe(), "python": {}}))
    template = read_header(base).metadata["tokenizer.chat_template"]
    layout.conformance_record(NAME).write_text(json.dumps(conformance_record(template)))
    publish(recipe, layout)
    return root


def art(root: Path) -> Path:
    return root / "artifacts" / NAME


def clone(built: Path, dest: Path) -> tuple[Path, Layout]:
    shutil.copytree(built, dest, copy_function=os.link)
    return dest, Layout(dest / "artifacts", dest / "work")


def replace(path: Path, text: str) -> None:
    path.unlink()  # a hard link in a clone: never write through it
    path.write_text(text)


def republish(root: Path, layout: Layout) -> dict:
    from pipeline.stages.publish import publish

    return publish(load_recipe(root / "recipes" / f"{NAME}.yaml"), layout)


# --------------------------------------------------------------------------- the publish stage


def test_verified_chatml_model_gets_params_template_and_system(built):
    folder = art(built)
    m = load_manifest(folder)
    assert list(m)[-3:] == ["hub", "ollama", "build"]
    hub = m["hub"]
    assert hub["repo"] == HUB_REPO and hub["path_in_repo"] == ""
    assert hub["card"] == {
        "from": "the source's README.md (SHA256 as fetched)",
        "license": "other",
        "license_name": "tiny-license",
        "license_link": "LICENSE",
        "language": ["en", "fr"],
        "pipeline_tag": "text-generation",
    }  # config.json: LlamaForCausalLM
    chat = hub["chat"]
    assert chat["template"] == "chatml" and chat["stop"] == STOP and chat["stop_from"] == "eog"
    assert chat["system"] == SMOLLM_SYSTEM
    # Ollama's ChatML template, with the default system prompt, renders the 3 verified plain conversations with a
    # generation prompt exactly as transformers renders the GGUF's template
    assert chat["ollama_template"] == {"checked": 3, "differ": []}
    assert chat["sample"]["conversation"] == "user" and chat["sample"]["text"] == (
        f"<|im_start|>system\n{SMOLLM_SYSTEM}<|im_end|>\n<|im_start|>user\nHello! Who are you?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert (folder / "template").read_bytes() == CHATML_TEMPLATE.encode()
    assert (folder / "system").read_bytes() == SMOLLM_SYSTEM.encode()
    assert json.loads((folder / "params").read_text()) == {"stop": STOP}
    assert hub["files"] == [
        {"file": "template", "sha256": sha256_file(folder / "template"), "from": "chatml"},
        {"file": "system", "sha256": sha256_file(folder / "system")},
        {"file": "params", "sha256": sha256_file(folder / "params")},
    ]


def test_card_front_matter_and_sections(built):
    from huggingface_hub import ModelCard

    card = (art(built) / "README.md").read_text()
    data = ModelCard(card).data
    assert (data.base_model, data.base_model_relation, data.license, data.license_name, data.license_link) == (
        "org/tiny-chat",
        "quantized",
        "other",
        "tiny-license",
        "LICENSE",
    )
    assert data.tags == ["gguf", "llama-cpp"] and data.language == ["en", "fr"]
    assert data.pipeline_tag == "text-generation" and data.library_name == "gguf" and data.quantized_by == "ggufpipe"
    assert data.datasets is None  # the source's training data is not named by the recipe
    assert "## Prompt format" in card and "The conversation `user` as both render it" in card
    assert "turn end: `<|endoftext|>`, `<|im_end|>`." in card
    assert f"| `Q8_0` | `llama-cli -hf {HUB_REPO}:Q8_0` | `ollama run hf.co/{HUB_REPO}:Q8_0` |" in card
    assert f"`huggingface-cli download {HUB_REPO} --include {NAME}-F16.gguf`" in card
    assert "| label | file | size MiB |" in card and f"| `F16` | `{NAME}-F16.gguf` |" in card
    assert "`template` (Ollama's ChatML Go template, which renders the 3 conversation(s) verified" in card


def test_template_left_out_where_ollama_renders_otherwise(built, tmp_path):
    """A verified render that Ollama's ChatML template does not reproduce (here: the record's text of one
    conversation, as a template with another default system prompt would render it): no `template`, no `system`
    (the stale files are removed), `params` stays; the card says why."""
    root, layout = clone(built, tmp_path / "c")
    path = layout.conformance_record(NAME)
    rec = json.loads(path.read_text())
    row = next(r for r in rec["details"]["chat_template"]["conversations"] if r["name"] == "user")
    row["llama_prompt"] = row["llama_prompt"].replace(SMOLLM_SYSTEM, "You are Tiny.")
    replace(path, json.dumps(rec))
    m = republish(root, layout)
    assert m["hub"]["chat"]["ollama_template"] == {"checked": 3, "differ": ["user"]}
    assert [f["file"] for f in m["hub"]["files"]] == ["params"]
    assert not (art(root) / "template").exists() and not (art(root) / "system").exists()
    card = (art(root) / "README.md").read_text()
    assert "No `template` (Ollama's ChatML template renders user unlike the model's template)" in card
    assert [
        p["path_in_repo"]
        for p in upload_plan(load_recipe(root / "recipes" / f"{NAME}.yaml"), m, art(root))
        if p["kind"] in ("template", "system", "params")
    ] == ["params"]


def test_source_card_changed_after_the_fetch_is_not_read(built, tmp_path):
    root, layout = clone(built, tmp_path / "s")
    replace(layout.hf(NAME) / "README.md", SOURCE_CARD.replace("language:\n- en\n- fr", "language: de"))
    m = republish(root, layout)
    assert m["hub"]["card"] == {
        "from": "no source model card: the GGUF's general.* keys",
        "pipeline_tag": "text-generation",
    }  # config.json is still the one fetched
    assert "license:" not in (art(root) / "README.md").read_text().partition("\n---\n")[0]


def test_work_folder_elsewhere(built, tmp_path):
    """The artifact folder away from its work folder: nothing from the source is read unless the layout says where
    the work folder is."""
    folder = tmp_path / "elsewhere" / NAME
    shutil.copytree(art(built), folder, copy_function=os.link)
    m = load_manifest(folder)
    recipe = load_recipe(built / "recipes" / f"{NAME}.yaml")
    lost = hub_section(recipe, m, folder)
    assert lost["card"]["from"].startswith("no source model card") and "sample" not in lost["chat"]
    assert lost["chat"]["ollama_template"] == {"checked": 0, "differ": []}
    found = hub_section(recipe, m, folder, Layout(built / "artifacts", built / "work"))
    assert found == {k: v for k, v in m["hub"].items() if k != "files"}


# --------------------------------------------------------------------------- the Hub commit


def test_stand_in_hub_receives_params_template_and_system(built, tmp_path, online):  # noqa: F811
    from huggingface_hub import HfApi

    root, layout = clone(built, tmp_path / "u")
    recipe = load_recipe(root / "recipes" / f"{NAME}.yaml")
    with FakeHub() as hub:
        desc, rec = hub_publish(recipe, layout, api=HfApi(endpoint=hub.url))
    [commit] = hub.commits
    sent = {f["value"]["path"]: base64.b64decode(f["value"]["content"]) for f in commit[1:]}
    assert list(sent) == [
        f"{NAME}-F16.gguf",
        f"{NAME}-Q8_0.gguf",
        "Modelfile.F16",
        "Modelfile.Q8_0",
        "template",
        "system",
        "params",
        "README.md",
        "report.md",
        "report.svg",
        "metrics.json",
        "manifest.json",
    ]
    assert sent["template"] == CHATML_TEMPLATE.encode() and sent["system"] == SMOLLM_SYSTEM.encode()
    assert json.loads(sent["params"]) == {"stop": STOP}
    assert [f["path_in_repo"] for f in rec["files"]] == list(sent)
    validated = json.loads(next(r for r in hub.requests if r["path"] == "/api/validate-yaml")["body"])["content"]
    assert validated == sent["README.md"].decode() and "base_model_relation: quantized" in validated


# --------------------------------------------------------------------------- why the check


# The ChatML-marked templates vendored in the pinned llama.cpp tree (<|im_start|> and <|im_end|> in the text) whose
# renders of the plain conversations (with a generation prompt) Ollama's ChatML template reproduces, with the
# template's own default system prompt where it has one; the other 12 render otherwise (a <think> block, another
# system turn, tool instructions, a BOS text, no assistant newline...).
OLLAMA_CHATML_EQUAL = {"MiMo-VL.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja", "Qwen3-Coder.jinja"}


def vendored_templates() -> dict[str, str]:
    """Every ``models/templates/*.jinja`` of the pinned llama.cpp tree, from the pinned sdist (SHA256-checked; the
    file `make tools` downloaded)."""
    import tarfile

    from pipeline.tools import SDIST_FILE, SDIST_NAME, SDIST_SHA256, SDIST_VERSION, cache_root, pip_fetch

    sdist = pip_fetch(SDIST_NAME, SDIST_VERSION, SDIST_FILE, SDIST_SHA256, cache_root() / "downloads", sdist=True)
    out = {}
    with tarfile.open(sdist) as tar:
        for member in tar:
            if "/vendor/llama.cpp/models/templates/" in member.name and member.name.endswith(".jinja"):
                out[member.name.rsplit("/", 1)[1]] = tar.extractfile(member).read().decode("utf-8")
    return out


def test_ollama_chatml_template_against_the_vendored_chatml_templates():
    from pipeline.stages.conformance import load_conversations
    from pipeline.stages.hubfiles import CHATML_STOPS

    conversations = load_conversations()
    plain = [c for c in conversations["conversations"] if _plain_conversation(c)]
    assert [c["name"] for c in plain] == ["user", "system-user", "multi-turn"]
    templates = vendored_templates()
    assert len(templates) == 70
    chatml = {n: t for n, t in templates.items() if all(s in t for s in CHATML_STOPS)}
    assert len(chatml) == 16
    equal = set()
    for name, template in chatml.items():
        system = _chatml_system(template)
        try:
            same = all(
                hf_render(template, c, conversations["date_string"]) == ollama_chatml_render(c["messages"], system)
                for c in plain
            )
        except Exception:  # noqa: BLE001 (a template transformers cannot render without tools is not equal)
            same = False
        if same:
            equal.add(name)
    assert equal == OLLAMA_CHATML_EQUAL
