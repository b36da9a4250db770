"""Every chat template vendored in the pinned llama.cpp tree (``models/templates/*.jinja``: 70 files, read from the
pinned sdist) rendered by transformers and by llama.cpp's own chat engine, on vocab-only GGUFs of their families
(issue #15, conformance).

- HF side: transformers' ``apply_chat_template`` itself (PreTrainedTokenizerBase, its compiled Jinja environment),
  on a stand-in tokenizer whose ``chat_template`` is the vendored file and whose ``bos_token``/``eos_token`` are the
  texts llama.cpp gives the template for that GGUF (the helper's ``vocab`` answer: ``common_token_to_piece`` of
  BOS/EOS, common/chat.cpp:830-831). Its token ids are meaningless and never compared.
- llama.cpp side: ``common_chat_templates_apply`` in the ``ggufpipe-conformance`` helper (op ``render`` with the
  file as ``template``): one process per vocab GGUF and group of up to :data:`CHUNK` templates of its families, two
  at a time, started before transformers renders (the render requests do not depend on the HF side).
- The stage's logic, reused: pipeline/stages/conformance/ ``plan_chat_template`` renders the conversations of
  ``data/conformance/conversations.json`` (the tool conversations only where the template uses ``tools``; a system
  message merged into the next where transformers rejects the system role, chat.cpp:1016-1030) and builds the
  render requests; ``_variants`` applies llama.cpp's normalisation of the HF text (leading BOS text / trailing
  EOS text stripped when the vocab adds BOS/EOS, chat.cpp:958-964). Each conversation is rendered with and without
  a generation prompt.

Verdict per template: identical on every conversation, identical where not rejected by both engines, or it differs
(a text that differs, or a conversation only one engine rejects). Every template must be identical or rejected by
both except those in :data:`KNOWN_DIFFERENCES` (each with the construct or llama.cpp line that differs), and each
of those must still differ (a stale entry fails).

Vocabs (:data:`FAMILIES`, by template file name prefix): Llama 3 and its fine-tunes (Hermes, Firefunction,
Functionary, SmolLM3) -> llama-bpe; Qwen2.5/QwQ/Qwen3/Qwen3-Coder/MiMo-VL -> qwen2; Qwen3.5 -> qwen35; Phi-3.5 ->
phi-3; Mistral/Ministral/Devstral -> llama-spm (their BOS/EOS texts ``<s>``/``</s>``, add_bos); DeepSeek (V3.x, V4,
R1 and its Llama/Qwen distills, llama.cpp's deepseek-r1) -> deepseek-llm (BOS text ``<｜begin▁of▁sentence｜>``);
Command-R/Cohere -> command-r; Gemma 2 and Gemma 4 -> gemma-4 (BOS ``<bos>``). The families without a vendored
vocab use the FALLBACK gpt-2 (:data:`FALLBACK_TEMPLATES`: Apertus, Apriel, Bielik, Seed-OSS, GLM, GigaChat, Kimi,
LFM2, MiniMax, Nemotron, Reka, Spark, StepFun, Granite, Ling, RWKV, Muse, gpt-oss, MiniCPM, Laguna, Hunyuan,
Solar): its BOS/EOS text ``<|endoftext|>``, add_bos false. A template's special tokens that are not in the vocab
only change tokenization; this test compares rendered TEXT (and rejection), which depends on the vocab only through
the BOS/EOS texts and add_bos/add_eos.

Dates: ``date_string`` is pinned (conversations.json) on both sides; ``strftime_now`` reads the wall clock on both.
"""

from __future__ import annotations

import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.stages.conformance import HELPER, clean_piece, load_conversations, plan_chat_template
from pipeline.stages.conformance.template import _text_diff, _variants
from pipeline.tools import (
    SDIST_FILE,
    SDIST_NAME,
    SDIST_SHA256,
    SDIST_VERSION,
    cache_root,
    pinned_dir,
    pip_fetch,
    run_helper,
)

VOCAB_DIR = pinned_dir() / "vocab"
TEMPLATES_IN_TREE = "/vendor/llama.cpp/models/templates/"
N_TEMPLATES = 70  # models/templates/ of b11312 holds 70 .jinja files (and a README.md)
WORKERS = 2
CHUNK = 10  # templates per helper run (the 37 on the fallback vocab would keep one core busy alone)
FALLBACK = "gpt-2"

# template file name prefix -> ggml-vocab-<name>.gguf (first match wins)
FAMILIES = (
    ("meta-llama-Llama-3", "llama-bpe"),
    ("NousResearch-Hermes-", "llama-bpe"),
    ("fireworks-ai-llama-3-", "llama-bpe"),
    ("meetkai-functionary-", "llama-bpe"),
    ("HuggingFaceTB-SmolLM3-", "llama-bpe"),
    ("Qwen3.5-", "qwen35"),
    ("Qwen", "qwen2"),
    ("MiMo-VL", "qwen2"),
    ("microsoft-Phi-3", "phi-3"),
    ("mistralai-", "llama-spm"),
    ("Mistral-", "llama-spm"),
    ("unsloth-mistral-", "llama-spm"),
    ("deepseek-ai-DeepSeek-", "deepseek-llm"),
    ("llama-cpp-deepseek-r1", "deepseek-llm"),
    ("CohereForAI-c4ai-command-r", "command-r"),
    ("Cohere2MoE", "command-r"),
    ("google-gemma-", "gemma-4"),
)
# families without a vendored vocab: the FALLBACK vocab (listed, so that a newly vendored template is placed on purpose)
FALLBACK_TEMPLATES = frozenset({
    "Apertus-8B-Instruct.jinja", "Apriel-1.6-15b-Thinker-fixed.jinja", "unsloth-Apriel-1.5.jinja",
    "Bielik-11B-v3.0-Instruct.jinja", "ByteDance-Seed-OSS.jinja", "GLM-4.6.jinja", "GLM-4.7-Flash.jinja",
    "GigaChat3-10B-A1.8B.jinja", "GigaChat3.1-10B-A1.8B.jinja", "Kimi-K2-Instruct.jinja", "Kimi-K2-Thinking.jinja",
    "Kimi-K3.jinja", "moonshotai-Kimi-K2.jinja", "LFM2-8B-A1B.jinja", "LFM2.5-8B-A1B.jinja", "LFM2.5-Instruct.jinja",
    "MiniMax-M1.jinja", "MiniMax-M2.jinja", "MiniMax-M3.jinja", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
    "NVIDIA-Nemotron-Nano-v2.jinja", "Reka-Edge.jinja", "Spark2.5.jinja", "StepFun3.5-Flash.jinja",
    "ibm-granite-granite-3.3-2B-Instruct.jinja", "ibm-granite-granite-4.0.jinja", "ibm-granite-granite-4.1.jinja",
    "inclusionai-ling-3.0-flash.jinja", "llama-cpp-rwkv-world.jinja", "muse-glimmer.jinja",
    "openai-gpt-oss-120b.jinja", "openbmb-MiniCPM5-1B.jinja", "poolside-Laguna-S-2.1.jinja",
    "poolside-Laguna-XS-2.1.jinja", "poolside-Laguna-XS.2.jinja", "tencent-Hy3.jinja",
    "upstage-Solar-Open-100B.jinja",
})

_TOOLS_UNDEFINED = "llama.cpp leaves `tools` undefined without tools (common/chat.cpp:922-924), transformers passes tools=None"
_GP_UNDEFINED = ("llama.cpp defines add_generation_prompt only when true (common/chat.cpp:937-939), transformers passes "
                 "false")
# template -> why transformers and llama.cpp render it differently (investigated; a stale entry fails the test)
KNOWN_DIFFERENCES = {
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja":
        f"a tool_use variant, `for tool in tools` unguarded: TypeError in transformers without tools ({_TOOLS_UNDEFINED}); "
        "with tools `'): ' + param_fields.description` for a parameter without description: UndefinedError in "
        "transformers, llama.cpp's Jinja concatenates undefined as ''",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja":
        f"a tool_use variant, `for tool in tools` unguarded: TypeError in transformers without tools ({_TOOLS_UNDEFINED}); "
        "identical with tools",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja":
        f"a tool_use variant, `for tool in tools` unguarded: TypeError in transformers without tools ({_TOOLS_UNDEFINED}); "
        "identical with tools",
    "fireworks-ai-llama-3-firefunction-v2.jinja":
        "`system_prompt_suffix + \"\\n\" + functions` with `functions` given by neither engine: UndefinedError in "
        "transformers, llama.cpp's Jinja concatenates undefined as '' (it also defines `datetime`, common/chat.cpp:1080-1088)",
    "Kimi-K2-Instruct.jinja":
        "`tool_response_queue.ids.append(...)` (tool-call round trip): transformers' ImmutableSandboxedEnvironment "
        "refuses list.append (SecurityError), llama.cpp's Jinja allows it",
    "Kimi-K2-Thinking.jinja":
        "`tool_response_queue.ids.append(...)` (tool-call round trip): transformers' ImmutableSandboxedEnvironment "
        "refuses list.append (SecurityError), llama.cpp's Jinja allows it",
    "meetkai-functionary-medium-v3.1.jinja":
        "`\"...\"|safe + t[\"function\"] | tojson()` (tool conversations): Jinja's Markup HTML-escapes the JSON added to "
        "it in transformers (&#34;), llama.cpp's `safe` is a no-op (the texts agree after html.unescape)",
    "meetkai-functionary-medium-v3.2.jinja":
        "`'>>>' + name + '\\n' + tool_call['function']['arguments']` concatenates the arguments as a string: an object "
        "in conversations.json, TypeError in transformers; llama.cpp keeps them as a JSON string (common/chat.cpp:436-440, "
        "250) and parses them only for templates that take object arguments (common/chat.cpp:1289-1291)",
    "llama-cpp-deepseek-r1.jinja":
        "`tools | map(attribute='function') | tojson(indent=2)`: Jinja's map is a generator that transformers' tojson "
        "(json.dumps) cannot serialise (TypeError), llama.cpp's map gives a list",
    "StepFun3.5-Flash.jinja":
        "llama.cpp trims every message's content before rendering a template containing 'You have access to the "
        "following functions in JSONSchema format' (common/chat.cpp:1235-1240): the '  leading and trailing spaces  ' "
        "conversation differs",
    "llama-cpp-rwkv-world.jinja":
        f"defaults an undefined add_generation_prompt to true: {_GP_UNDEFINED}, so llama.cpp appends 'Assistant: <think>' "
        "to every conversation without a generation prompt",
    "upstage-Solar-Open-100B.jinja":
        f"defaults an undefined add_generation_prompt to true: {_GP_UNDEFINED}, so llama.cpp appends '<|begin|>assistant' "
        "to every conversation without a generation prompt",
    "openai-gpt-oss-120b.jinja":
        "without a generation prompt llama.cpp replaces the last '<|return|>' with '<|end|>' "
        "(common/parsers/gpt-oss.cpp:21-30, llama.cpp issue 15417): a conversation ending with the assistant differs",
    "google-gemma-4-31B-it-interleaved.jinja":
        "an older Gemma 4 template (no '{#- OpenAI Chat Completions:'): llama.cpp folds the tool message into the "
        "model turn as <|tool_response>... (common/chat.cpp:1195-1200, common/parsers/gemma4.cpp:127-147), "
        "transformers renders a separate tool turn",
}


def vocab_for(template: str) -> str:
    for prefix, vocab in FAMILIES:
        if template.startswith(prefix):
            return vocab
    return FALLBACK


def read_templates() -> dict[str, str]:
    """Every ``models/templates/*.jinja`` of the pinned tree, from the pinned sdist (SHA256-checked; the file
    `make tools` downloaded, fetched again when missing)."""
    sdist = pip_fetch(SDIST_NAME, SDIST_VERSION, SDIST_FILE, SDIST_SHA256, cache_root() / "downloads", sdist=True)
    out: dict[str, str] = {}
    with tarfile.open(sdist) as tar:
        for member in tar:
            if TEMPLATES_IN_TREE in member.name and member.name.endswith(".jinja") and member.isfile():
                out[member.name.rsplit("/", 1)[1]] = tar.extractfile(member).read().decode("utf-8")
    return dict(sorted(out.items()))


def both_generation_prompts(conversations: dict) -> dict:
    """conversations.json with every conversation twice: as in the file and with add_generation_prompt flipped."""
    out = []
    for conv in conversations["conversations"]:
        for gp in (bool(conv.get("add_generation_prompt")), not conv.get("add_generation_prompt")):
            out.append({**conv, "add_generation_prompt": gp,
                        "name": f"{conv['name']} (generation prompt: {'yes' if gp else 'no'})"})
    return {**conversations, "conversations": out}


def hf_tokenizer(bos: str, eos: str):
    """A stand-in PreTrainedTokenizerFast: its apply_chat_template is transformers' own (chat_template set per
    template; special_tokens_map = bos_token/eos_token, as llama.cpp's Jinja context has); its ids mean nothing."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
                                   bos_token=bos, eos_token=eos)


def bos_eos(vocab: dict) -> tuple[str, str]:
    """The BOS and EOS texts llama.cpp gives a template for this vocab (the helper's ``vocab`` answer)."""
    assert vocab.get("bos") is not None and vocab.get("eos") is not None, vocab
    return vocab["pieces_of_specials"][str(vocab["bos"])], vocab["pieces_of_specials"][str(vocab["eos"])]


@dataclass
class Rendered:
    template: str
    vocab: str
    compared: list[dict[str, Any]] = field(default_factory=list)  # one per conversation rendered by both
    skipped: int = 0  # tool conversations of a template without tools

    @property
    def verdicts(self) -> set[str]:
        return {c["verdict"] for c in self.compared}

    @property
    def status(self) -> str:
        if self.verdicts == {"identical"}:
            return "identical"
        if self.verdicts <= {"identical", "rejected by both"}:
            return "identical or rejected by both"
        return "differs"

    def first_difference(self) -> str:
        c = next(c for c in self.compared if c["verdict"] not in ("identical", "rejected by both"))
        return f"{self.template} (vocab {self.vocab}): conversation {c['name']}: {c['verdict']}: {c['detail']}"


def render_requests(template: str, conversations: dict) -> list[dict]:
    """The helper's render requests for ``template``, as the stage plans them (pipeline/stages/conformance/
    ``plan_chat_template``: the tool conversations only where the template uses tools; its other requests are
    tokenizations), without rendering on the HF side: a stand-in whose renders fail at once."""
    def no_render(*_args, **_kwargs):
        raise RuntimeError("requests only")

    stub = SimpleNamespace(chat_template=template, bos_token=None, eos_token=None, apply_chat_template=no_render)
    plan = plan_chat_template(stub, template, conversations)
    return [{**plan["requests"][item["render_request"]], "template": template}
            for item in plan["items"] if "skipped" not in item]


@pytest.fixture(scope="module")
def rendered(toolchain) -> dict[str, Rendered]:
    """Every template rendered by both engines. The helper runs (one vocab load each: its facts, then the renders
    of CHUNK templates) start at once; transformers renders each chunk with that vocab's BOS/EOS texts as its
    answers arrive, while the helper renders the next chunks."""
    t0 = time.monotonic()
    templates = read_templates()
    conversations = both_generation_prompts(load_conversations())
    groups: dict[str, list[str]] = {}
    for name in templates:
        groups.setdefault(vocab_for(name), []).append(name)
    chunks = [(vocab, groups[vocab][i:i + CHUNK]) for vocab in sorted(groups, key=lambda v: -len(groups[v]))
              for i in range(0, len(groups[vocab]), CHUNK)]
    out: dict[str, Rendered] = {}
    with ThreadPoolExecutor(WORKERS) as pool:
        runs = []
        for vocab, names in chunks:
            requests = [{"op": "vocab"}] + [r for name in names for r in render_requests(templates[name], conversations)]
            runs.append((requests[1:], pool.submit(run_helper, toolchain, HELPER, VOCAB_DIR / f"ggml-vocab-{vocab}.gguf",
                                                   requests)))
        for (vocab, names), (sent, run) in zip(chunks, runs, strict=True):
            facts, *answers = run.result()
            bos, eos = bos_eos(facts)
            flags = (bool(facts["add_bos"]), bool(facts["add_eos"]))
            tok = hf_tokenizer(bos, eos)
            at = 0
            for name in names:
                tok.chat_template = templates[name]
                plan = plan_chat_template(tok, templates[name], conversations)
                r = out[name] = Rendered(name, vocab)
                for item in plan["items"]:
                    if "skipped" in item:
                        r.skipped += 1
                        continue
                    assert {**plan["requests"][item["render_request"]], "template": templates[name]} == sent[at]
                    hf, ll = item["hf"], answers[at]
                    at += 1
                    c = {"name": item["name"], "hf": hf, "llama": ll}
                    if "error" in hf and "error" in ll:
                        c.update(verdict="rejected by both", detail="")
                    elif "error" in hf or "error" in ll:
                        who, msg = ("transformers", hf["error"]) if "error" in hf else ("llama.cpp", ll["error"])
                        c.update(verdict=f"rejected by {who} only", detail=msg[:300])
                    else:
                        # llama.cpp's normalisation of the HF text for this vocab's add_bos/add_eos (chat.cpp:958-964)
                        text = _variants(hf["text"], bos, eos)[flags]
                        prompt = clean_piece(ll["prompt"])
                        same = text == prompt
                        c.update(verdict="identical" if same else "text differs",
                                 detail="" if same else _text_diff(text, prompt))
                    r.compared.append(c)
            assert at == len(answers), f"{vocab}: {len(answers)} renders asked, {at} compared"
    seconds = time.monotonic() - t0
    statuses = [r.status for r in out.values()]
    known = sum(1 for name, r in out.items() if r.status == "differs" and name in KNOWN_DIFFERENCES)
    print(f"\n[vendored templates] {len(out)} templates on {len(groups)} vocabs: {statuses.count('identical')} identical, "
          f"{statuses.count('identical or rejected by both')} identical where not rejected by both, "
          f"{statuses.count('differs')} differ ({known} known differences); "
          f"{sum(len(r.compared) for r in out.values())} conversations compared, "
          f"{sum(r.skipped for r in out.values())} skipped (tools, template without tools); {seconds:.1f}s")
    return dict(sorted(out.items()))


def test_every_vendored_template_is_rendered(rendered):
    assert len(rendered) == N_TEMPLATES, sorted(rendered)
    fallback = {name for name in rendered if vocab_for(name) == FALLBACK}
    assert fallback == FALLBACK_TEMPLATES, ("templates placed on the fallback vocab by accident: "
                                            f"{sorted(fallback - FALLBACK_TEMPLATES)}; listed but mapped or gone: "
                                            f"{sorted(FALLBACK_TEMPLATES - fallback)}")
    for name, r in rendered.items():
        assert (VOCAB_DIR / f"ggml-vocab-{r.vocab}.gguf").is_file(), (name, r.vocab)
        assert len(r.compared) >= 10, f"{name}: only {len(r.compared)} conversations rendered"


def test_templates_render_alike_or_are_rejected_by_both(rendered):
    """Identical text after llama.cpp's normalisations, or rejected by both engines: every template but the known
    differences."""
    unexpected = [r.first_difference() for name, r in rendered.items()
                  if r.status == "differs" and name not in KNOWN_DIFFERENCES]
    assert not unexpected, "transformers and llama.cpp differ on:\n" + "\n".join(unexpected)


def test_known_differences_still_differ(rendered):
    unknown = sorted(set(KNOWN_DIFFERENCES) - set(rendered))
    assert not unknown, f"KNOWN_DIFFERENCES names templates that are not vendored: {unknown}"
    stale = [f"{name}: now {rendered[name].status}" for name in KNOWN_DIFFERENCES if rendered[name].status != "differs"]
    assert not stale, "stale KNOWN_DIFFERENCES entries (remove them):\n" + "\n".join(stale)
