"""Every recipe key, declared once: the table ``pipeline/recipe/`` takes its allowed keys from and
``pipeline/recipe/docs.py`` renders as ``docs/recipes.md`` (``make docs``).

Standard library only (recipe loading imports it at every Snakemake start). Each :class:`Section` is one
mapping of a recipe (its ``path`` is where it sits, e.g. ``quants[]`` or ``draft.source``) and lists its
:class:`Field` s in the order the reference shows them. A field's ``default`` is exactly what the parser
uses when the key is absent: a plain value (``None``: not set), :data:`REQUIRED`, or a :class:`Note` where
the default depends on the rest of the recipe. ``example`` is a valid value (a Python value, shown as YAML).
``{imatrix_families}`` and ``{min_scored_tokens}`` in the texts are filled in by the renderer from the
constants of ``pipeline/recipe/``. tests/unit/test_recipe_docs.py loads recipes with each key set to its
example, refuses an undocumented key in each section, and checks every plain default against what
:func:`pipeline.recipe.load_recipe` returns.
"""

from __future__ import annotations

from pipeline.bounds import CHUNKS, CTX, FRACTION, INT32_MAX, LLAMA_MAX_LAYERS, Range, integer
from pipeline.recipe.fields import (
    DRAFT_LENGTH,
    GATE_MAX,
    MB_MAX,
    N_PREDICT,
    PROMPTS,
    REQUIRED,
    TOKEN_ID,
    Field,
    Note,
    Section,
)
from pipeline.recipe.schema_deploy import DEVICE, DRAFT_SPEEDUP, PUBLISH, SPLIT

__all__ = ["REQUIRED", "SECTIONS", "Field", "Note", "Section", "keys", "number_range", "section"]

SHA = "6b5982a638c6ed4e3da15711b6a5a1328c34a53e"

TOP = Section("", "Top level", (
    "A recipe is one YAML mapping per model in `recipes/<name>.yaml`. Keys not listed in this reference are "
    "refused (`unknown key`), like every other mistake, with one line naming the file and the field."
), (
    Field("name", "string: slug `[a-z0-9][a-z0-9._-]*`, at most 64 characters, no `..`", REQUIRED,
          "The model's name: the artifact folder `artifacts/<name>/` and the prefix of every file name.",
          "smollm2-135m"),
    Field("description", "string", None, "Free text, shown in the model card.", "SmolLM2-135M-Instruct, GGUF"),
    Field("license", "string", None,
          "License written into every GGUF (`general.license`, through the model card the converter reads). "
          "When absent the converter takes it from the source's own model card.", "apache-2.0"),
    Field("source", "map (see `source:`)", REQUIRED, "The Hugging Face checkpoint to convert.",
          {"repo": "org/model", "revision": SHA}),
    Field("outtype", "`f16` | `bf16`", "f16",
          "Type of the unquantized GGUF that convert writes: published as `<name>-F16.gguf` (or `-BF16`), the "
          "file every quant is made from and measured against.", "bf16"),
    Field("mtp", "`keep` | `strip` | `separate`", "keep",
          "Multi-token-prediction (NextN) heads of models that have them: `keep` them in every file as the converter "
          "does; `strip` converts with `--no-mtp`; `separate` leaves them out of the model files too and exports "
          "them alone (`--mtp`) as the draft `<name>-mtp-<OUTTYPE>_MTP.gguf`. `strip` and `separate` need an "
          "architecture whose converter supports it (the convert stage says so otherwise).", "strip"),
    Field("quants", "non-empty list of quant (see `quants[]`)", REQUIRED,
          "The llama-quantize types to build, each a type name or a mapping.", ["Q8_0", {"type": "Q4_K_M"}]),
    Field("gates", "eval set, or list of eval sets (see `gates[]`)", Note("none: no quality gates"),
          "Quality gates: each quant is measured against the base file on each eval set (llama-perplexity "
          "`--kl-divergence`) and published only if it meets every threshold.",
          [{"name": "botchan", "text": "../data/botchan.txt", "ctx": 512, "chunks": 16}]),
    Field("bench", "bool", True, "Run llama-bench on each model file (the base and every quant): build-box "
          "speed, shown in the report, never a gate.", False),
    Field("split", "map (see `split:`)", None,
          "Default for every model file (base, quants, MTP draft): publish it as llama-gguf-split shards in a "
          "folder `<name>-<KEY>/`. A quant's own `split:` overrides it.", {"max_size": "2G"}),
    Field("awq", "map (see `awq:`)", None,
          "AutoAWQ scale search folded into the floating-point weights; quants are made from that scaled base "
          "unless they say `awq: false`.", {"calibration": "../data/botchan-calib.txt"}),
    Field("imatrix", "map (see `imatrix:`)", None,
          "An importance matrix (llama-imatrix, once per base) that quants of 4 bits and fewer use by default.",
          {"calibration": "../data/botchan-calib.txt"}),
    Field("draft", "map (see `draft:`)", None,
          "A draft model for speculative decoding, built beside this one or given as a GGUF, checked for "
          "vocabulary compatibility and measured for acceptance.",
          {"source": {"repo": "org/small-model", "revision": SHA}, "quants": ["Q4_0"]}),
    Field("publish", "map (see `publish:`)", None,
          "Where `ggufpipe hub-publish` uploads the artifact folder, and whether Ollama Modelfiles are written.",
          {"hf_repo": "my-org/SmolLM2-135M-Instruct-GGUF"}),
    Field("sensitivity", "map (see `sensitivity:`)", None,
          "The measurement the measured mixes (`type: mix` quants) are solved from.",
          {"text": "../data/botchan-calib.txt"}),
    Field("conformance", "`false`, or map (see `conformance:`)", Note("on, with the defaults of `conformance:`"),
          "The conformance stage proves the base GGUF is the Hugging Face model (tokenizer, chat template, "
          "end-of-generation tokens, logits) before any quant is judged against it; a failure publishes nothing "
          "of the recipe. `false` skips it, and the manifest says so.", {"chunks": 2}),
    Field("device_slice", "int, 0 to 2", Note("2 (1 when the first eval set has 1 chunk); 0 without `gates:`"),
          "Chunks of the first eval set published for `ggufpipe device-check` (docs/device-check.md): their base "
          "logits `device-slice.logits` (DVC-tracked, never uploaded to the Hub) and each file's slice mean KLD and "
          "same-top-p in the manifest. 0 publishes no slice (the file is 2 x n_vocab bytes per scored token: "
          "51 MB for a 49k vocabulary at ctx 512 and 2 chunks).", 1, range=integer(0, 2)),
    Field("devices", "list of device (see `devices[]`)", [],
          "Target devices: the publish stage predicts every published model file's memory on each "
          "(docs/devices.md) and the report and card show which files fit; a device with `require: true` fails the "
          "build when no published quant fits it.", [{"name": "pi5-8g", "memory": "8G", "arch": "arm64-dotprod"}]),
    Field("chat_template_override", "string: file path", None,
          "A Jinja chat template (a text file; relative paths: to the recipe file) written into the base GGUF as "
          "`tokenizer.chat_template`, so every quant carries it; recorded in the manifest and the card, then "
          "checked like any template.", "../data/chat-template.jinja"),
    Field("eos_token_ids", "list of 1 to 3 int >= 0", None,
          "End-of-generation token ids written into the base GGUF as `tokenizer.ggml.eos_token_id`, then "
          "`eot_token_id`, then `eom_token_id` (llama.cpp stops on each); recorded in the manifest.", [2], range=TOKEN_ID),
    Field("add_bos", "bool", None,
          "Written into the base GGUF as `tokenizer.ggml.add_bos_token`: whether llama.cpp adds BOS to its "
          "input; recorded in the manifest.", True),
    Field("tokenizer_pre", "a BPE pre-tokenizer name of llama.cpp", None,
          "Written into the base GGUF as `tokenizer.ggml.pre` when the converter's hash of the tokenizer picks "
          "another pre-tokenizer than the model's (a vocabulary it does not know under a pre-tokenizer it does); "
          "recorded in the manifest. Conformance's tokenizer parity proves the choice.", "minicpm5"),
))

CONFORMANCE = Section("conformance", "`conformance:`", (
    "The base GGUF against the Hugging Face model it was converted from: tokenizer parity on a probe set and a "
    "slice of the first eval text, logit fidelity on the first chunks of that eval set (the base logits of "
    "eval-base, against the HF model in float32), chat template rendering by both engines, and the "
    "end-of-generation set. Its thresholds are fixed (see docs/conformance.md), not recipe keys."
), (
    Field("chunks", "int >= 1", 4,
          "Chunks of the first eval set (each `ctx` tokens) on which the HF model's logits are compared with "
          "the base GGUF's.", 2, range=CHUNKS),
    Field("enabled", "bool", True, "`false` is `conformance: false` written as a map.", True),
    Field("text", "path (relative to the recipe)", None,
          "The logit check's own text, at ctx 512 (`chunks` chunks), its base logits made by the stage. Without it "
          "the check reuses the first eval set's base logits, and a recipe without `gates` gets no logit check "
          "(a built draft takes its main's first eval text).", "../data/botchan.txt"),
    Field("accept", "list of cause names", [],
          "Tokenizer mismatch causes published as known differences instead of failing the build: HF normalizer "
          "members llama.cpp does not apply (`nfd`, `nfkc`, `nfkd`, `precompiled`, `lowercase`, `strip-accents`, "
          "`replace`, `prepend`, `strip`, `bert`, `byte-level`) and `ignore-merges` (HF's BPE looks whole words up "
          "before merging, the GGUF's pre-tokenizer does not). A mismatch of a compound cause "
          "(`nfd+strip-accents`) is accepted when each part is; the manifest and the card name each accepted cause "
          "(docs/conformance.md).", ["nfkc"]),
    Field("strict", "bool", False,
          "Fail on the known llama.cpp limitations too: `nfc` (the HF normalizer is NFC, which llama.cpp does not "
          "apply; by default a warning, and the card tells clients to send NFC text) and `control-typed` (an added "
          "token HF keeps plain that the converter typed CONTROL, so llama.cpp matches it only with special "
          "parsing on).", True),
))

_SOURCE_FIELDS = (
    Field("repo", "string: Hugging Face repo id `org/name`", Note("one of `repo` or `path` is required"),
          "The Hub repository to fetch.", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    Field("revision", "string: commit SHA, tag or branch (quoted)", Note("required with `repo`"),
          "The revision to fetch; the resolved commit is recorded. Quote it: YAML reads an all-digit SHA "
          "prefix as a number, which is refused.", SHA),
    Field("path", "string: folder", Note("one of `repo` or `path` is required"),
          "A local Hugging Face folder instead of a repo; not valid with `revision`. Unlike the text paths, a "
          "relative path is read from the folder the build runs in, not the recipe's: write it absolute.", "/data/my-hf-folder"),
    Field("allow_pickle", "bool", False, "Accept `*.bin` / `*.pt` (pickled) weights; refused by default.", True),
    Field("trust_remote_code", "bool", False,
          "Accept repositories whose config needs custom code; refused by default.", True),
    Field("convert_as", "string: a model class the pinned converter registers", None,
          "Convert as this class instead of `config.json`'s `architectures` (a checkpoint naming a class the "
          "converter does not register, with a layout it does). Conformance makes it safe: its logit check runs "
          "transformers' class for the config's `model_type` against the GGUF and fails a wrong class "
          "(docs/models.md).", "LlamaForCausalLM"),
)

SOURCE = Section("source", "`source:`", (
    "The checkpoint to convert: exactly one of `repo` (with `revision`) or `path`."
), _SOURCE_FIELDS)

_THRESHOLD_TYPES = (
    ("max_ppl_ratio", "number >= 1", "Highest allowed ratio of the quant's perplexity to the base file's.", 1.05,
     Range(1, GATE_MAX)),
    ("max_kld_mean", "number >= 0", "Highest allowed mean KL divergence from the base file's token distribution.",
     0.05, Range(0, GATE_MAX)),
    ("max_kld_p99", "number >= 0", "Highest allowed 99th percentile of the KL divergence.", 0.5, Range(0, GATE_MAX)),
    ("min_same_top_p", "number 0..1", "Lowest allowed share of tokens where the quant's top token equals the "
     "base file's.", 0.9, FRACTION),
)
THRESHOLD_RANGES = {key: rng for key, _, _, _, rng in _THRESHOLD_TYPES}

QUANT = Section("quants[]", "`quants[]`: each quant", (
    "A quant is a llama-quantize type name (`- Q8_0`) or a mapping with `type` and the keys below. The type is "
    "upper-cased and checked against the installed gguf package and, when llama.cpp's tools are given, "
    "against llama-quantize. Its file is `<name>-<TYPE>[_<VARIANT>].gguf` (docs/publishing.md#file-names)."
), (
    Field("type", "quant type, e.g. `Q4_K_M`, or `mix`", REQUIRED,
          "The llama-quantize type (see Quant types below), or `mix`: per-tensor types solved from measured "
          "sensitivity (needs `label`, one of `budget` / `target`, and a top-level `sensitivity:`).",
          "Q4_K_M"),
    Field("variant", "string `[A-Za-z]{1,24}`", None,
          "Upper-cased suffix of the label and file name, `<name>-<TYPE>_<VARIANT>.gguf`: lets two flavours of "
          "one type coexist. Letters only (the Hub's label stops at a digit); a label that is another quant "
          "type's name (`Q2_K` + `s`) is refused.", "embq"),
    Field("output_tensor_type", "ggml type name", None,
          "llama-quantize `--output-tensor-type` (lower-cased).", "q8_0"),
    Field("token_embedding_type", "ggml type name", None,
          "llama-quantize `--token-embedding-type` (lower-cased).", "q8_0"),
    Field("tensor_types", "list of `pattern=type`", [], "llama-quantize `--tensor-type`, once per entry.",
          ["attn_v=q8_0"]),
    Field("tensor_types_file", "path of a map file", None,
          "llama-quantize `--tensor-type-file`: `pattern=type` entries separated by spaces or newlines (relative "
          "to the recipe's folder). Patterns are regexes searched anywhere in the tensor name, the first match wins "
          "(after `tensor_types`): write them anchored and escaped (`^blk\\.0\\.attn_v\\.weight$=q8_0`). Refused "
          "with `token_embedding_type` or `output_tensor_type` (which take precedence over any pattern), and at "
          "quantize time a pattern that matches no tensor or is shadowed by an earlier one "
          "(docs/quantization.md#tensor-type-maps).", "../maps/q4-attn.map"),
    Field("pure", "bool", False, "llama-quantize `--pure`.", True),
    Field("leave_output_tensor", "bool", False, "llama-quantize `--leave-output-tensor`.", True),
    Field("gates", "thresholds, or map of eval set name to thresholds (see `quants[].gates`)",
          Note("none: the eval sets' thresholds"),
          "Threshold overrides for this quant, on every eval set or per eval set. Needs a top-level `gates:`.",
          {"max_kld_mean": 0.01}),
    Field("awq", "bool", Note("`true` when the recipe has `awq:`, else `false`"),
          "Make this quant from the AWQ-scaled base; `true` without a top-level `awq:` is refused.", False),
    Field("imatrix", "bool", Note("`true` when the recipe has `imatrix:` and the type's family is "
                                  "{imatrix_families}, else `false`"),
          "Quantize with the recipe's importance matrix; `true` without a top-level `imatrix:` is refused, and the "
          "types that need one (see Quant types) are refused without it.", False),
    Field("split", "map (see `split:`) or `false`", Note("the top-level `split:`"),
          "Publish this file as shards (overrides the recipe's default); `false` publishes it whole. Not "
          "allowed in `draft.quants`.", False),
    Field("label", "string `<TYPE>_<VARIANT>`", Note("required with `type: mix`"),
          "A measured mix (`type: mix`, docs/mixes.md): its label and file name `<name>-<LABEL>.gguf`, a quant type "
          "and 1-24 letters (`Q4_K_M_MIX`); the type is what llama-quantize writes as `general.file_type`. A mix "
          "takes no `variant`, type flags, `tensor_types`, map or `pure`: its solved map sets every quantized "
          "tensor.", "Q4_K_M_MIX"),
    Field("budget", "map: one of `size_of: <quant type>`, `bpw: <number>`, `max_mb: <number>`",
          Note("one of `budget` or `target` with `type: mix`"),
          "The mix with the lowest predicted mean KLD whose file is at most this large: the size of that stock "
          "type's file (computed exactly from a dry run, never built), bits per weight (1 < bpw <= 16) of the "
          "file over the model's weights, or megabytes (10^6 bytes).", {"size_of": "Q4_K_M"}, range={"bpw": Range(1, 16, lo_open=True), "max_mb": Range(0, MB_MAX, lo_open=True)}),
    Field("target", "map: `max_kld_mean: <number>`", Note("one of `budget` or `target` with `type: mix`"),
          "The smallest mix whose predicted mean KLD meets this; the gates then hold the mix to it on every eval "
          "set.", {"max_kld_mean": 0.03}, range={"max_kld_mean": Range(0, GATE_MAX, lo_open=True)}),
    Field("candidates", "list of ggml tensor types", Note("`[Q3_K, Q4_K, Q5_K, Q6_K]`; with an importance matrix "
                                                          "`[IQ3_S, IQ4_XS, Q5_K, Q6_K]`"),
          "The types a mix chooses from per tensor group, besides the floor (`sensitivity.floor`). IQ types only "
          "with `imatrix: true`; each must be below the floor.", ["Q4_K", "Q5_K", "Q6_K"]),
))

SENSITIVITY = Section("sensitivity", "`sensitivity:`", (
    "What the mixes (`quants[]` with `type: mix`) are solved from: per tensor group (role x band of layers) and "
    "candidate type, the mean KLD of a file where only that group is at that candidate and every other tensor "
    "at the floor, measured on this text against the base file's own logits. Required with a mix, refused "
    "without one (docs/mixes.md)."
), (
    Field("text", "string: file path", REQUIRED,
          "The measurement text (relative paths: to the recipe file); refused if it has the SHA256 of a gates "
          "text, so the gates judge mixes on text the solver never saw.", "../data/botchan-calib.txt"),
    Field("text_sha256", "string: SHA256", None, "The text's SHA256, checked when given.", None),
    Field("ctx", "int >= 16", 512, "Context length of each chunk.", 256, range=CTX),
    Field("chunks", "int >= 1", 4, "Number of chunks.", 2, range=CHUNKS),
    Field("bands", "int >= 1", 8,
          "Bands of consecutive layers a role's tensors are grouped into (MoE: routed experts per role and band, "
          "shared experts apart, routers never quantized); groups x candidates files are measured.", 4, range=integer(1, LLAMA_MAX_LAYERS, "llama.cpp's LLAMA_MAX_LAYERS")),
    Field("floor", "ggml tensor type", "Q8_0",
          "The type of every tensor outside the group measured, and a choice of every group.", "F16"),
    Field("search", "`exhaustive` | `screened` | `fisher`", "exhaustive",
          "`exhaustive` measures every group at every candidate (each written form once); `screened` measures a few "
          "runs of bands per role and predicts the rest from each tensor's relative activation-weighted quantization "
          "error: at most a fifth of the evaluations; its mixes against the exhaustive search's are measured in "
          "docs/mixes.md#the-screened-search. `fisher`: the same cap, the error weighted by a diagonal Fisher from "
          "one torch pass over the HF checkpoint (counted as three evaluations), type probes for every role "
          "(docs/mixes.md#the-fisher-weighted-search).", "screened"),
))

QUANT_GATES = Section("quants[].gates", "`quants[].gates`: per-quant thresholds", (
    "Either thresholds, which apply on every eval set (`gates: {max_kld_mean: 0.01}`), or a mapping from eval "
    "set names to thresholds (`gates: {botchan: {max_kld_mean: 0.01}}`); the two forms do not mix. Effective "
    "thresholds: the family default, then the eval set's, then the quant's for every set, then its per-set ones."
), (
    *(Field(key, typ, Note("the eval set's, else the family default"), doc, ex, range=rng)
      for key, typ, doc, ex, rng in _THRESHOLD_TYPES),
    Field("<eval set name>", "map of thresholds", None,
          "Thresholds for this quant on that eval set only; the name must be one of `gates[].name`.",
          {"max_kld_mean": 0.01}),
))

EVAL_SET = Section("gates[]", "`gates[]`: each eval set", (
    "`gates:` is one eval set or a list of them. For each, llama-perplexity computes the base file's logits "
    "once and compares every quant with them. Each eval set must score at least {min_scored_tokens} tokens: "
    "`chunks x (ctx - 1 - ctx // 2)` (the second half of each chunk is scored), and its text must hold "
    "`ctx x chunks` tokens."
), (
    Field("name", "string `[a-z0-9][a-z0-9_-]*`, at most 32 characters", "default",
          "Name of the eval set in records, reports and per-quant gates. Defaults to `default` only when "
          "there is one eval set; required with several, and unique.", "botchan"),
    Field("text", "path to a text file", REQUIRED,
          "The evaluation text (relative paths: to the recipe file). Must not be empty.", "../data/botchan.txt"),
    Field("text_sha256", "string: SHA256, 64 lowercase hex", None,
          "Pin of the text, recorded with the metrics.",
          "2680fa93dfc313ac6270fbf44128f4ba4c4f409ab5498f612b0e106965fdea99"),
    Field("ctx", "int >= 16, or `long`", REQUIRED,
          "Context length of each chunk (llama-perplexity `-c`). `long`: one chunk at min(the model's trained context, "
          "`max_ctx`), which catches a long-context RoPE error that every short gate passes "
          "(docs/quality-gates.md#long-context).", 512, range=CTX),
    Field("max_ctx", "int >= 16", 4096, "With `ctx: long`: the cap on the chunk (the base logits grow with ctx x vocab).",
          2048, range=CTX),
    Field("chunks", "int >= 1", REQUIRED, "Number of chunks evaluated (llama-perplexity `--chunks`); 1 with `ctx: long`.",
          16, range=CHUNKS),
    Field("hub_dataset", "string `owner/name`", None,
          "The text's Hugging Face Hub dataset id, where it has one: the model card's metadata lists it under "
          "`datasets:`.", "Salesforce/wikitext"),
    Field("render", "`text` or `chat`", "text",
          "`chat`: `text` is JSONL, one conversation a line (`{\"messages\": [{\"role\", \"content\"}, ...]}`), rendered "
          "with the model's own chat template (llama.cpp's, which conformance compares with Hugging Face's) and "
          "tokenized with special tokens; the base logits are written from those ids (ggufpipe-logits) "
          "(docs/quality-gates.md#chat-rendered-sets).", "chat"),
    Field("kv_types", "list of KV cache types (`f16`, `q8_0`, `q4_0`, ...), `f16` first", Note("none: f16 only"),
          "Also measure each quant with these KV cache types (`-ctk/-ctv`) against the same base logits (the F16 file "
          "with an f16 cache); a device with `kv_type: auto` is launched with the smallest one inside the quant's "
          "thresholds (docs/quality-gates.md#kv-cache-types).", ["f16", "q8_0", "q4_0"]),
    *(Field(key, typ, Note("the quant family's default (see below)"), doc, ex, range=rng)
      for key, typ, doc, ex, rng in _THRESHOLD_TYPES),
))

# the calibration text's pin, in every section with a calibration text (awq:, imatrix:)
CALIBRATION_SHA256 = Field("calibration_sha256", "string: SHA256, 64 lowercase hex", None,
                           "Pin of the calibration text: a different SHA256 is refused.")

AWQ = Section("awq", "`awq:`", (
    "AWQ scale search (and, with AutoAWQ, optionally clipping) on a calibration text, folded into the "
    "floating-point weights before convert. The published base file stays the unmodified model: every quant, AWQ ones "
    "included, is gated against it; the AWQ-scaled base is an intermediate under `work/`."
), (
    Field("calibration", "path to a text file", REQUIRED,
          "Calibration text (relative paths: to the recipe file); refused if it has the same SHA256 as a gates "
          "text.", "../data/botchan-calib.txt"),
    CALIBRATION_SHA256,
    Field("engine", "`autoawq` | `llmcompressor`", Note("autoawq where AutoAWQ 0.2.9 supports the model_type, else "
                                                      "llmcompressor"),
          "Which AWQ implementation searches the scales: AutoAWQ 0.2.9 in its own environment, or llm-compressor's "
          "AWQModifier in the build environment (the 2026 architectures, Qwen3.5 among them). An architecture "
          "neither maps is refused.", "llmcompressor"),
    Field("w_bit", "`2` | `3` | `4` | `8`", 4, "Bit width of the grid the scales are searched for.", 3, range=integer(2, 8)),
    Field("q_group_size", "`32` | `64` | `128` | `256` | `-1`", 128,
          "Group size of the search grid (`-1`: per channel); must divide every linear layer's input size.", 64, range=integer(-1, 256)),
    Field("zero_point", "bool", True, "Asymmetric grid (with a zero point).", False),
    Field("version", "`gemm` | `gemv` | `gemv_fast`", "gemm", "AutoAWQ's kernel version (case-insensitive).",
          "gemv"),
    Field("n_samples", "int >= 1", 64,
          "Calibration windows, taken from the start of the text; the text must hold `n_samples x seq_len` "
          "tokens.", 16, range=integer(1, INT32_MAX)),
    Field("seq_len", "int >= 16", 256, "Tokens per calibration window.", 128, range=integer(16, INT32_MAX)),
    Field("apply_clip", "bool", Note("`true` with AutoAWQ; llm-compressor has no clipping search"),
          "Also search weight clipping (AutoAWQ only; needs every linear's output size to be a multiple of 64).",
          False),
))

IMATRIX = Section("imatrix", "`imatrix:`", (
    "llama-imatrix over a calibration text, once per base GGUF a quant uses (plain or AWQ). Quants of 4 bits "
    "and fewer use it unless they say `imatrix: false`; others only with `imatrix: true`."
), (
    Field("calibration", "path to a text file, or `{conversations: FILE}`", REQUIRED,
          "Calibration text (relative paths: to the recipe file); refused if it has the same SHA256 as a gates "
          "text. It must hold `ctx x chunks` tokens. `{conversations: FILE}`: chat JSONL (as a `render: chat` eval "
          "set's), rendered with the model's chat template and run with `llama-imatrix --parse-special` "
          "(docs/calibration.md#chat-rendered-calibration).", "../data/botchan-calib.txt"),
    CALIBRATION_SHA256,
    Field("hub_dataset", "string `owner/name`", None,
          "The calibration's Hugging Face Hub dataset id, where it has one: the model card's metadata lists it under "
          "`datasets:` when a published quant used the imatrix.", "Salesforce/wikitext"),
    Field("ctx", "int >= 16", 512, "Context length of each chunk.", 256, range=CTX),
    Field("chunks", "int >= 1", 32, "Number of chunks.", 8, range=CHUNKS),
    Field("min_expert_coverage", "number 0..1", None,
          "Mixture-of-experts models: the fraction of each layer's experts the calibration text must reach (at least "
          "`min_expert_tokens` routed tokens); below it the imatrix stage fails naming the layer and the cold experts. "
          "None: the coverage is recorded, not gated.", 1.0, range=FRACTION),
    Field("min_expert_tokens", "int >= 1", 1, "Routed tokens an expert needs to count as covered.", 4, range=integer(1, INT32_MAX)),
))

DRAFT = Section("draft", "`draft:`", (
    "A draft for speculative decoding: exactly one of `source` (a draft model built beside the main model as the "
    "recipe `<name>-draft`, by the same stages, into `artifacts/<name>-draft/`), `gguf` (an existing file, checked, "
    "not rebuilt) or `mtp: true` (the model's own multi-token-prediction heads). Each (main, draft) pair gets "
    "llama.cpp's vocabulary compatibility check, a measured acceptance rate per draft length and a ready "
    "`llama-server` line. Draft files are not split."
), (
    Field("source", "map (see `draft.source`)", Note("one of `source`, `gguf` or `mtp: true` is required"),
          "The draft's checkpoint, with the keys of `source:`.", {"repo": "org/small-model", "revision": SHA}),
    Field("gguf", "path to a GGUF file", Note("one of `source`, `gguf` or `mtp: true` is required"),
          "An existing draft GGUF (relative paths: to the recipe file); its header is checked.",
          "../drafts/small-Q4_0.gguf"),
    Field("mtp", "bool", False,
          "The draft is the model's own multi-token-prediction heads (llama.cpp `--spec-type draft-mtp`): inside each "
          "model file with the recipe's `mtp: keep`, the `<name>-mtp-<OUTTYPE>_MTP.gguf` file (`-md`) with "
          "`mtp: separate`; refused with `mtp: strip`. Its key in `pairs` is `mtp`. Measured like a draft model, "
          "without top-1 agreement (docs/drafts.md#mtp-heads-as-the-draft).", True),
    Field("outtype", "`f16` | `bf16`", Note("the recipe's `outtype`"),
          "The draft's unquantized type; only with `source`.", "bf16"),
    Field("quants", "non-empty list of quant", Note("required with `source`"),
          "The draft's quants, as `quants[]` but without `split`, per-quant `gates`, AWQ or importance matrix; "
          "only with `source`.", ["Q4_0"]),
    Field("pairs", "list of `[main quant, draft quant]`", Note("every main quant x every draft quant"),
          "The pairs checked and measured, by file key (`TYPE[_VARIANT]`; aliases and the old `TYPE-variant` resolved). The main side may "
          "also be the base (`F16`); with `gguf`, the draft side is `gguf`; with `mtp: true`, `mtp`.", [["Q8_0", "Q4_0"]]),
    Field("n_max", "int 1..64, or list of them", [4, 8],
          "Draft lengths measured (`llama-speculative-simple --spec-draft-n-max`); the best one goes into the "
          "deployment line.", [2, 4], range=DRAFT_LENGTH),
    Field("eval_text", "path to a text file", Note("the first plain-text eval set's text (required without one)"),
          "Text the acceptance prompts are taken from (relative paths: to the recipe file).", "../data/code.txt"),
    Field("prompts", "int >= 1", 3, "Number of prompts, passages spread over the text.", 2, range=PROMPTS),
    Field("n_predict", "int >= 8", 96, "Tokens generated per prompt.", 64, range=N_PREDICT),
    Field("min_acceptance", "number 0..1", None,
          "Gate on the acceptance rate at the best draft length; none: measured, not gated.", 0.5, range=FRACTION),
    Field("speedup", "`false`, or map (see `draft.speedup:`)", Note("on, with the defaults of `draft.speedup:`"),
          "Decode speed with and without the draft, measured with `llama-server` on the build box in rounds; the "
          "draft length is chosen by measured speed, and a deployment line is published only when the lower end of "
          "its interval is above 1. `false`: not measured, and the line is published as unmeasured.", {"rounds": 5}),
    Field("min_speedup", "number > 0", None,
          "Gate on the measured speed-up (median over rounds) at the chosen draft length; none: not gated.", 1.2, range=Range(0, 65, lo_open=True, note="a draft of at most 64 tokens gives at most 65 per step")),
))

DRAFT_SOURCE = Section("draft.source", "`draft.source:`", (
    "The draft's checkpoint: the same keys and rules as `source:`."
), _SOURCE_FIELDS)

SECTIONS: tuple[Section, ...] = (TOP, SOURCE, QUANT, QUANT_GATES, EVAL_SET, AWQ, IMATRIX, DRAFT, DRAFT_SPEEDUP,
                                 DRAFT_SOURCE, PUBLISH, SPLIT, CONFORMANCE, SENSITIVITY, DEVICE)


def section(path: str) -> Section:
    for s in SECTIONS:
        if s.path == path:
            return s
    raise KeyError(path)


def number_range(path: str, key: str):
    """The declared range of the numeric field ``key`` of section ``path`` (a dict of ranges for a map of numbers)."""
    rng = section(path).field(key).range
    if rng is None:
        raise KeyError(f"{path}.{key}: no range declared in pipeline/recipe/schema.py")
    return rng


def keys(path: str) -> set[str]:
    """The keys allowed in the mapping at ``path`` ("" for the top level)."""
    return section(path).keys
