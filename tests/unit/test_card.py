"""The model card of issue #16 (pipeline/stages/report.py) and the Hub's Ollama files (pipeline/distribution/hub.py) on manifest dicts:
front matter as quantized GGUF repos on the Hub have it, the per-file table with the Hub label first, the usage lines
per label, the verified prompt format, ``params`` / ``template`` / ``system``, and the facts read from the fetched
source (its model card and config.json, only when the fetch record vouches for them). No llama.cpp, no torch."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from pipeline.layout import Layout
from pipeline.stages.card import card_text, front_matter, prompt_format, usage_table, write_card
from pipeline.stages.hubfiles import (
    CHATML_TEMPLATE,
    card_facts,
    chat_facts,
    chat_format,
    gguf_strings,
    hub_files,
    ollama_chatml_render,
    source_files,
    write_hub_files,
)
from pipeline.stages.report import label, markdown_table

REPO = "my-org/tiny-GGUF"
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
SAMPLE = (
    f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nHello! Who are you?<|im_end|>\n<|im_start|>assistant\n"
)


def entry(file: str, qtype: str, role: str = "quant", **extra) -> dict:
    e = {
        "file": file,
        "quant_type": qtype,
        "sha256": "0" * 64,
        "size_bytes": 100 * 2**20,
        "bits_per_weight": 4.5,
        "role": role,
        "metrics": {"wiki": {"kld_mean": 0.0123, "ppl_q": 10.5, "ppl_ratio": 1.02, "kld_p99": 0.1, "same_top_p": 0.9}},
    }
    e.update(extra)
    return e


def manifest(**hub) -> dict:
    """A manifest as the publish stage writes it: base, a plain quant, an imatrix variant, a split quant, an MTP
    draft; conformance passed with a verified render; the ``hub`` section."""
    split = {
        "count": 2,
        "max_size": "1M",
        "shards": [{"file": "tiny-Q8_0-00001-of-00002.gguf"}, {"file": "tiny-Q8_0-00002-of-00002.gguf"}],
    }
    m = {
        "name": "tiny",
        "build_id": "tiny-0123456789ab",
        "source": {"repo": "org/Tiny-Chat", "commit": "c" * 40},
        "tools": {"llama_cpp_build": 11312, "llama_cpp_commit": "0c1e570"},
        "gguf_metadata": {"general.license": "apache-2.0", "general.quantized_by": "ggufpipe"},
        "base_quant_type": "F16",
        "eval_sets": [
            {
                "name": "wiki",
                "text": "wiki.txt",
                "text_sha256": "a" * 64,
                "ctx": 512,
                "chunks": 4,
                "scored_tokens": 1020,
            }
        ],
        "eval_base": {"wiki": {"ppl": 10.3}},
        "conformance": {
            "passed": True,
            "checks": {
                "chat_template": {"passed": True, "summary": "7 conversations: 5 identical (text and ids)"},
                "eog": {"passed": True, "eog": [0, 2], "summary": "EOG [0, 2]"},
            },
            "warnings": [],
        },
        "artifacts": [
            entry("tiny-F16.gguf", "F16", role="base"),
            entry("tiny-Q4_K_M.gguf", "Q4_K_M", requested={"type": "Q4_K_M"}),
            entry(
                "tiny-Q4_K_M_IMAT.gguf",
                "Q4_K_M",
                requested={"type": "Q4_K_M", "variant": "imat", "imatrix": True},
                calibration={"imatrix": {"calibration": "calib.txt"}},
            ),
            entry("tiny-Q8_0", "Q8_0", requested={"type": "Q8_0"}, split=split),
            entry("tiny-mtp-F16_MTP.gguf", "F16", role="mtp-draft"),
        ],
        "rejected": [],
        "hub": {
            "repo": REPO,
            "path_in_repo": "",
            "card": {
                "from": "the source's README.md (SHA256 as fetched)",
                "license": "apache-2.0",
                "language": ["en"],
                "pipeline_tag": "text-generation",
            },
            "chat": {
                "template": "chatml",
                "template_sha256": "b" * 64,
                "stop": ["<|endoftext|>", "<|im_end|>"],
                "stop_from": "eog",
                "sample": {"conversation": "user", "text": SAMPLE},
                "system": SYSTEM,
                "ollama_template": {"checked": 3, "differ": []},
            },
            "files": [],
        },
        "build": {"timestamp": "2026-01-01T00:00:00Z"},
    }
    m["hub"].update(hub)
    return m


def front(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text[4:].partition("\n---\n")[0])


# --------------------------------------------------------------------------- front matter


def test_front_matter_fields():
    fm = front_matter(manifest())
    assert front(fm) == {
        "base_model": "org/Tiny-Chat",
        "base_model_relation": "quantized",
        "license": "apache-2.0",
        "tags": ["gguf", "llama-cpp", "imatrix"],
        "language": ["en"],
        "pipeline_tag": "text-generation",
        "quantized_by": "ggufpipe",
        "library_name": "gguf",
    }
    # the start the demo's end-to-end test reads (tests/e2e/test_gates.py)
    assert fm.startswith("---\nbase_model: org/Tiny-Chat\nlicense: apache-2.0\ntags:\n  - gguf\n")


def test_front_matter_without_imatrix_or_source_repo_or_hub_section():
    m = manifest()
    m["artifacts"] = [a for a in m["artifacts"] if "IMAT" not in a["file"]]
    assert front(front_matter(m))["tags"] == ["gguf", "llama-cpp"]
    m["source"] = {"path": "/models/tiny"}  # a local folder: no base model on the Hub
    del m["hub"]  # a manifest written before the hub section: license from the GGUF, nothing invented
    data = front(front_matter(m))
    assert data == {
        "license": "apache-2.0",
        "tags": ["gguf", "llama-cpp"],
        "quantized_by": "ggufpipe",
        "library_name": "gguf",
    }


def test_front_matter_quotes_what_yaml_would_misread():
    """Norwegian is ``no`` (YAML 1.1 reads false), a version-like license reads as a number: both quoted."""
    m = manifest(
        card={
            "license": "other",
            "license_name": "tiny license: v1",
            "license_link": "LICENSE",
            "language": ["no", "en"],
            "pipeline_tag": "text-generation",
        }
    )
    data = front(front_matter(m))
    assert data["language"] == ["no", "en"] and data["license"] == "other"
    assert data["license_name"] == "tiny license: v1" and data["license_link"] == "LICENSE"


def test_model_card_parses_the_front_matter():
    pytest.importorskip("huggingface_hub")  # not in the light venv of `make test-fast`
    from huggingface_hub import ModelCard

    data = ModelCard(card_text(manifest())).data
    assert data.base_model == "org/Tiny-Chat" and data.base_model_relation == "quantized"
    assert data.license == "apache-2.0" and data.library_name == "gguf" and data.pipeline_tag == "text-generation"
    assert {"gguf", "llama-cpp", "imatrix"} <= set(data.tags) and data.language == ["en"]
    assert data.datasets is None  # no recipe key names a Hub dataset


# --------------------------------------------------------------------------- the table and the usage lines


def test_labels_are_the_hubs():
    m = manifest()
    assert [label(e) for e in m["artifacts"]] == ["F16", "Q4_K_M", "Q4_K_M_IMAT", "Q8_0", "F16_MTP"]


def test_table_has_the_label_first():
    table = markdown_table(manifest(), "wiki", speed=False, labels=True).splitlines()
    assert table[0] == ("| label | file | size MiB | bpw | PPL | PPL ratio | mean KLD | 99% KLD | same top p | gate |")
    assert table[2].startswith("| `F16` | `tiny-F16.gguf` | 100.0 | 4.50 | 10.300 | 1 | 0 |")
    assert table[4].startswith("| `Q4_K_M_IMAT` | `tiny-Q4_K_M_IMAT.gguf` |") and "| 0.01230 |" in table[4]
    assert table[5].startswith("| `Q8_0` | `tiny-Q8_0/` (2 shards, max 1M) |")
    assert len(table) == 6  # the MTP draft is no model: not in the table
    # the report keeps its quant column
    assert markdown_table(manifest(), "wiki", speed=False).splitlines()[4].startswith("| Q4_K_M (imat) |")


def test_usage_lines_per_label():
    lines = usage_table(manifest()).splitlines()
    assert lines[:2] == ["| label | llama.cpp | Ollama | download |", "|---|---|---|---|"]
    assert lines[3] == (
        f"| `Q4_K_M` | `llama-cli -hf {REPO}:Q4_K_M` | `ollama run hf.co/{REPO}:Q4_K_M` | "
        f"`huggingface-cli download {REPO} --include tiny-Q4_K_M.gguf` |"
    )
    assert lines[4].startswith(f"| `Q4_K_M_IMAT` | `llama-cli -hf {REPO}:Q4_K_M_IMAT` |")
    # a split file: llama.cpp fetches every shard; Ollama imports single files; the download takes the folder
    assert lines[5] == (
        f"| `Q8_0` | `llama-cli -hf {REPO}:Q8_0` | – (split file: Ollama imports single files) | "
        f'`huggingface-cli download {REPO} --include "tiny-Q8_0/*"` |'
    )
    assert len(lines) == 6 and "F16_MTP" not in "\n".join(lines)


def test_usage_lines_without_a_repo_or_in_a_folder():
    text = usage_table(manifest(repo=None))
    assert text.startswith("`<user>/tiny-GGUF` is a placeholder: the recipe names no repo (`publish.hf_repo`)")
    assert "`llama-cli -hf <user>/tiny-GGUF:Q4_K_M`" in text
    text = usage_table(manifest(path_in_repo="gguf/v1"))
    assert "--include gguf/v1/tiny-Q4_K_M.gguf`" in text and '--include "gguf/v1/tiny-Q8_0/*"`' in text
    assert "The files are in the repo's folder `gguf/v1/`" in text


def test_usage_lines_for_labels_that_are_not_unique():
    """Names from before the file-naming rule (``-imat``): the Hub reads two files as Q4_K_M; no tag is offered."""
    m = manifest()
    m["artifacts"][2]["file"] = "tiny-Q4_K_M-imat.gguf"
    rows = usage_table(m).splitlines()
    assert rows[3].startswith(
        f"| `Q4_K_M` | – (label not unique: download the file) | `ollama run hf.co/{REPO}:tiny-Q4_K_M.gguf` |"
    )
    assert rows[4].startswith("| `Q4_K_M` | – (label not unique")


# --------------------------------------------------------------------------- prompt format


def test_prompt_format_verified():
    text = prompt_format(manifest())
    assert "Chat template: ChatML" in text and "SHA256 bbbbbbbbbbbbbbbb…" in text
    assert "The conversation `user` as both render it" in text
    assert "```text\n" + SAMPLE.rstrip("\n") + "\n```" in text
    assert text.endswith(
        "checked against the Hugging Face `eos_token_id` and the template's turn end: `<|endoftext|>`, `<|im_end|>`."
    )


def test_prompt_format_unverified_and_completion_models():
    m = manifest(chat={"template": "other", "template_sha256": "b" * 64, "stop": ["<|end|>"], "stop_from": "gguf"})
    m["conformance"] = {"skipped": "the recipe opts out (conformance: false)"}
    text = prompt_format(m)
    assert "the model's own (not ChatML)" in text
    assert "It was not checked against the Hugging Face model: the recipe opts out (conformance: false)." in text
    assert text.endswith(
        "Stop texts (the GGUF's EOS/EOT tokens; not checked against the Hugging Face model): `<|end|>`."
    )
    m = manifest(chat={"template": None, "stop": ["</s>"], "stop_from": "gguf"})
    assert prompt_format(m).startswith("The GGUF has no chat template (`tokenizer.chat_template`): a completion model")
    del m["hub"]
    assert prompt_format(m) == ""


def test_sample_with_backticks_gets_a_longer_fence():
    m = manifest()
    m["hub"]["chat"]["sample"]["text"] = "```python\nx```\n"
    assert "````text\n```python\nx```\n````" in prompt_format(m)


# --------------------------------------------------------------------------- the Hub's Ollama files


def test_ollama_chatml_render():
    msgs = [{"role": "user", "content": "Hello! Who are you?"}]
    assert ollama_chatml_render(msgs, SYSTEM) == SAMPLE
    assert ollama_chatml_render(msgs) == "<|im_start|>user\nHello! Who are you?<|im_end|>\n<|im_start|>assistant\n"
    own = [{"role": "system", "content": "Be brief."}, *msgs]  # a system message of its own: no default in front
    assert ollama_chatml_render(own, SYSTEM).startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user")


def test_hub_files_for_a_verified_chatml_model():
    files = hub_files(manifest()["hub"])
    assert list(files) == ["template", "system", "params"]
    assert files["template"] == CHATML_TEMPLATE and files["system"] == SYSTEM  # exact: no newline added
    assert json.loads(files["params"]) == {"stop": ["<|endoftext|>", "<|im_end|>"]}


@pytest.mark.parametrize(
    "check, template",
    [
        ({"checked": 3, "differ": ["user"]}, False),  # Ollama's ChatML renders a verified conversation otherwise
        ({"checked": 0, "differ": []}, False),  # nothing verified to check it against
    ],
)
def test_no_template_unless_ollama_renders_every_verified_conversation(check, template):
    m = manifest()
    m["hub"]["chat"]["ollama_template"] = check
    files = hub_files(m["hub"])
    assert ("template" in files) is template and "system" not in files and "params" in files
    m["hub"]["files"] = [{"file": "params", "sha256": "x"}]
    m["ollama"] = [{"file": "Modelfile.F16"}]
    card = card_text(m)
    why = "renders user unlike the model's template" if check["checked"] else "no conversation verified"
    assert "No `template` (" + ("Ollama's ChatML template " if check["checked"] else "") + why in card


def test_hub_files_other_templates_and_overrides():
    other = manifest(chat={"template": "other", "stop": ["<|end|>"], "stop_from": "eog"})["hub"]
    assert hub_files(other) == {"params": '{\n  "stop": [\n    "<|end|>"\n  ]\n}\n'}
    assert hub_files(other, "{{ .Prompt }}") == {"template": "{{ .Prompt }}", "params": hub_files(other)["params"]}
    assert hub_files(manifest(chat={"template": None, "stop": ["</s>"], "stop_from": "gguf"})["hub"]) == {}
    assert hub_files(manifest(chat=None)["hub"]) == {}


def test_write_hub_files_writes_and_removes(tmp_path):
    texts = hub_files(manifest()["hub"])
    entries = write_hub_files(texts, tmp_path)
    assert [e["file"] for e in entries] == ["template", "system", "params"]
    assert (tmp_path / "system").read_bytes() == SYSTEM.encode()
    assert write_hub_files({"params": texts["params"]}, tmp_path) == [entries[2]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params"]
    assert write_hub_files({}, tmp_path) == [] and not list(tmp_path.iterdir())


def test_card_sections(tmp_path):
    m = manifest(
        files=[
            {"file": "template", "sha256": "x", "from": "chatml"},
            {"file": "system", "sha256": "y"},
            {"file": "params", "sha256": "z"},
        ]
    )
    m["ollama"] = [{"file": "Modelfile.F16"}, {"file": "Modelfile.Q4_K_M"}]
    write_card(m, tmp_path / "README.md")
    card = (tmp_path / "README.md").read_text()
    heads = [line for line in card.splitlines() if line.startswith("## ")]
    assert heads == [
        "## Conformance",
        "## Prompt format",
        "## Use from the Hugging Face Hub",
        "## Run with llama.cpp",
        "## Run with Ollama",
    ]
    assert "llama-cli -m tiny-Q8_0/tiny-Q8_0-00001-of-00002.gguf -cnv" in card  # the local lines stay
    assert (
        f"`ollama run hf.co/{REPO}:<label>` reads the repo's `params` (the stop texts above), `template` "
        "(Ollama's ChatML Go template, which renders the 3 conversation(s) verified"
    ) in card
    assert "`system` (the chat template's default system prompt)." in card
    assert m["build_id"] in card


# --------------------------------------------------------------------------- what the publish stage reads


def write_gguf(
    path: Path,
    template: str | None,
    tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "a"),
    eot: int | None = None,
) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(list(tokens))
    w.add_eos_token_id(2)
    if eot is not None:
        w.add_eot_token_id(eot)
    if template is not None:
        w.add_chat_template(template)
    w.add_array("general.languages", ["en", "de"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


SMOL = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
    + SYSTEM
    + "<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_gguf_strings(tmp_path):
    p = write_gguf(tmp_path / "t-F16.gguf", None)
    assert gguf_strings(p, "tokenizer.ggml.tokens", [0, 2, 99]) == {0: "<|endoftext|>", 2: "<|im_end|>"}
    assert gguf_strings(p, "general.languages") == {0: "en", 1: "de"}
    assert gguf_strings(p, "tokenizer.ggml.eos_token_id") is None and gguf_strings(p, "general.missing") is None


def test_chat_facts_from_the_conformance_record(tmp_path):
    """Stops: the texts of the verified EOG ids; the render of the record's conformance conversations, checked
    against Ollama's ChatML template (the demo's SmolLM2 template: equal, the default system prompt in front)."""
    from pipeline.stages.conformance import load_conversations

    m = manifest()
    layout = Layout(tmp_path / "artifacts", tmp_path / "work")
    base = write_gguf(tmp_path / "tiny-F16.gguf", SMOL)
    convs = [c for c in load_conversations()["conversations"] if not c.get("tools")]
    rec = {
        **m["conformance"],
        "details": {
            "chat_template": {
                "conversations": [
                    {
                        "name": c["name"],
                        "add_generation_prompt": c["add_generation_prompt"],
                        "verdict": "identical",
                        "llama_prompt": ollama_chatml_render(c["messages"], SYSTEM),
                    }
                    for c in convs
                ]
            }
        },
    }
    path = Path(layout.conformance_record("tiny"))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(rec))
    facts = chat_facts(m, base, layout)
    assert facts["template"] == "chatml" and facts["stop"] == ["<|endoftext|>", "<|im_end|>"]
    assert facts["stop_from"] == "eog" and facts["system"] == SYSTEM
    assert facts["sample"] == {"conversation": "user", "text": SAMPLE}
    assert facts["ollama_template"] == {"checked": 3, "differ": []}  # the plain conversations with a prompt
    # a record that is not the one the manifest was made from is not read
    other = copy.deepcopy(m)
    other["conformance"]["checks"]["eog"]["summary"] = "another build"
    facts = chat_facts(other, base, layout)
    assert "sample" not in facts and facts["ollama_template"] == {"checked": 0, "differ": []}
    assert hub_files({"chat": facts}) == {"params": hub_files({"chat": facts})["params"]}  # no template


def test_chat_facts_without_conformance(tmp_path):
    """Conformance off: the Modelfiles' stops (the GGUF's EOS, ChatML's turn tokens), nothing verified."""
    m = manifest()
    m["conformance"] = {"skipped": "the recipe opts out (conformance: false)"}
    facts = chat_facts(m, write_gguf(tmp_path / "tiny-F16.gguf", SMOL), Layout(tmp_path / "a", tmp_path / "w"))
    assert facts["stop"] == ["<|im_end|>", "<|im_start|>"] and facts["stop_from"] == "gguf"
    assert facts["ollama_template"] == {"checked": 0, "differ": []} and "sample" not in facts
    plain = chat_facts(m, write_gguf(tmp_path / "p-F16.gguf", None), Layout(tmp_path / "a", tmp_path / "w"))
    assert plain == {"template": None, "stop": ["<|im_end|>"], "stop_from": "gguf"}
    assert chat_facts(m, None, None) is None
    # EOS and EOT, as the Modelfiles read them (gguf's reader)
    eot = write_gguf(tmp_path / "e-F16.gguf", "{{ x }}", eot=0)
    assert chat_facts(m, eot, None)["stop"] == chat_format(eot)["stops"] == ["<|im_end|>", "<|endoftext|>"]


def fetched(tmp_path: Path, readme: str, config: dict | None = None) -> tuple[dict, Layout]:
    """A work folder with a fetched source and its fetch record; the manifest's source digest of it."""
    from pipeline.fsutil import sha256_file
    from pipeline.provenance import source_files_digest

    layout = Layout(tmp_path / "artifacts", tmp_path / "work")
    hf = Path(layout.hf("tiny"))
    hf.mkdir(parents=True)
    (hf / "README.md").write_text(readme)
    (hf / "config.json").write_text(json.dumps(config or {"architectures": ["LlamaForCausalLM"]}))
    files = {f: {"sha256": sha256_file(hf / f), "size": (hf / f).stat().st_size} for f in ("README.md", "config.json")}
    rec = Path(layout.fetch_record("tiny"))
    rec.parent.mkdir(parents=True)
    rec.write_text(json.dumps({"source": {"repo": "org/Tiny-Chat"}, "files": files}))
    m = manifest()
    m["source"]["files_sha256"] = source_files_digest(files)
    return m, layout


SOURCE_CARD = """---
license: other
license_name: tiny-license
license_link: LICENSE
language: [en, fr]
datasets: [HuggingFaceTB/smollm-corpus]
pipeline_tag: text-generation
---
# Tiny
"""


def test_card_facts_from_the_source_card(tmp_path):
    m, layout = fetched(tmp_path, SOURCE_CARD)
    files = source_files(m, layout)
    assert sorted(files) == ["README.md", "config.json"]
    facts = card_facts(SimpleNamespace(license=None), m, None, files)
    assert facts == {
        "from": "the source's README.md (SHA256 as fetched)",
        "license": "other",
        "license_name": "tiny-license",
        "license_link": "LICENSE",
        "language": ["en", "fr"],
        "pipeline_tag": "text-generation",
    }  # no datasets: the source's training data is not the recipe's
    # the recipe's license wins (and the source's name and link of its `other` license go with it)
    assert card_facts(SimpleNamespace(license="mit"), m, None, files)["license"] == "mit"
    assert "license_name" not in card_facts(SimpleNamespace(license="mit"), m, None, files)


def test_card_facts_pipeline_tag_and_fallbacks(tmp_path):
    m, layout = fetched(tmp_path, "---\nlicense: apache-2.0\nlanguage: en\n---\n")
    facts = card_facts(SimpleNamespace(license=None), m, None, source_files(m, layout))
    assert facts["language"] == ["en"] and facts["pipeline_tag"] == "text-generation"  # config.json: a causal LM
    m2, layout2 = fetched(tmp_path / "bert", "no front matter\n", {"architectures": ["BertModel"]})
    facts = card_facts(SimpleNamespace(license=None), m2, None, source_files(m2, layout2))
    assert facts == {"from": "the source's README.md (SHA256 as fetched)", "license": "apache-2.0"}  # the GGUF's
    # a source card changed after the fetch is not read: the GGUF's general.* keys instead
    (Path(layout.hf("tiny")) / "README.md").write_text(SOURCE_CARD)
    files = source_files(m, layout)
    assert list(files) == ["config.json"]
    base = write_gguf(tmp_path / "tiny-F16.gguf", None)
    facts = card_facts(SimpleNamespace(license=None), m, base, files)
    assert facts == {
        "from": "no source model card: the GGUF's general.* keys",
        "license": "apache-2.0",
        "language": ["en", "de"],
        "pipeline_tag": "text-generation",
    }
    # a fetch record of another source: nothing read
    m["source"]["files_sha256"] = "0" * 64
    assert source_files(m, layout) == {}
    assert source_files(m, Layout(tmp_path / "nowhere", tmp_path / "nowhere")) == {}
