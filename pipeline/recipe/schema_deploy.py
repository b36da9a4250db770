"""The recipe reference's sections on shipping and running the files (pipeline/recipe/schema.py lists them with the
rest): the measured speed-up of a draft, publishing, splitting, target devices. Standard library only."""

from __future__ import annotations

from pipeline.bounds import CTX, PARALLEL, THREADS, UINT32_MAX, Range, integer
from pipeline.recipe.fields import DRAFT_LENGTH, N_PREDICT, PROMPTS, REQUIRED, Field, Note, Section

DRAFT_SPEEDUP = Section("draft.speedup", "`draft.speedup:`", (
    "How the speed-up is measured: one `llama-server` per configuration (without the draft, then each draft "
    "length), started once and warmed up by a short request; in each round every configuration gets the prompts, one "
    "at a time, greedy, on one slot. At the chosen length the rounds are repeated sampled, and with `parallel` "
    "concurrent requests on servers with as many slots. The figures are the build box's and volatile (the "
    "manifest's `build` section; docs/drafts.md#measured-speed-up)."
), (
    Field("rounds", "int >= 3", 3, "Rounds; the interval is the min-max over rounds of the per-round speed-up.", 5, range=integer(3, 1000)),
    Field("temperature", "number >= 0", 0.8, "Temperature of the sampled condition (its seed: `seed`).", 1.0, range=Range(0, 100)),
    Field("seed", "int >= 0", 1, "Seed of every request.", 42, range=integer(0, UINT32_MAX, "llama.cpp's seed is a uint32")),
    Field("parallel", "int >= 1", 4,
          "Slots (`-np`) and concurrent requests of the concurrent condition (4: what `llama-server` gives without "
          "`-np`); 1: no concurrent condition.", 1, range=PARALLEL),
    Field("prompts", "int >= 1", Note("`draft.prompts`"),
          "Prompts per round: passages of the draft's eval text, 240 characters each (decoding is what is timed).", 1, range=PROMPTS),
    Field("n_predict", "int >= 8", Note("`draft.n_predict`"), "Tokens generated per request.", 32, range=N_PREDICT),
    Field("p_min", "list of numbers 0 < p < 1", Note("none: llama.cpp's default 0 only"),
          "`--spec-draft-p-min` values tried at the chosen draft length (drafting stops at the first draft token whose "
          "top probability is below it), in rounds of their own beside it; one is kept only when its whole interval "
          "lies above the plain length's.", [0.5, 0.8], range=Range(0, 1, lo_open=True, hi_open=True)),
    Field("n_min", "list of ints >= 1", Note("none: llama.cpp's default 0 only"),
          "`--spec-draft-n-min` values tried the same way (a draft shorter than it is dropped).", [2], range=DRAFT_LENGTH),
))

PUBLISH = Section("publish", "`publish:`", (
    "Where `ggufpipe hub-publish` (an explicit command, never part of a build) uploads the artifact folder, in "
    "one commit; and whether the publish stage writes an Ollama `Modelfile.<QUANT>` beside each model file."
), (
    Field("hf_repo", "string: Hugging Face repo id `org/name`", REQUIRED,
          "The model repository uploaded to (created when missing).", "my-org/SmolLM2-135M-Instruct-GGUF"),
    Field("revision", "string: branch name", "main",
          "Branch to commit to (created from `main` when missing); a commit SHA is refused.", "staging"),
    Field("private", "bool", False,
          "Visibility when the repository is created; an existing repository is left as it is.", True),
    Field("path_in_repo", "string: folder path", "",
          "Folder in the repository the files go to (`\"\"` or null: the root); leading and trailing `/` are "
          "dropped; no `..` or hidden segments.", "gguf/v1"),
    Field("ollama", "bool", True, "Write `Modelfile.<QUANT>` for every (unsplit) model file, and the Hub's repo-root "
          "Ollama files: `params` (stop = the verified end-of-generation texts) for a chat model, `template` and "
          "`system` only where Ollama's ChatML template reproduces the verified renders "
          "([publishing](publishing.md)).", False),
    Field("ollama_template", "string (Go template)", None,
          "TEMPLATE of every Modelfile instead of the one derived from the GGUF's chat template; only with "
          "`ollama: true`, and without `\"\"\"`.", "{{ .Prompt }}"),
))

SPLIT = Section("split", "`split:`", (
    "Publish a model file as llama-gguf-split shards `<name>-<KEY>/<name>-<KEY>-0000i-of-0000N.gguf`. Given at "
    "the top level it applies to every model file (base, quants, MTP draft); a quant's own `split:` overrides "
    "it, and `split: false` there publishes that quant whole."
), (
    Field("max_size", "string: `<N>M` or `<N>G`", REQUIRED,
          "Most tensor data per shard, as `llama-gguf-split --split-max-size`: a whole number of M (10^6 bytes) "
          "or G (10^9 bytes). The first shard also carries the metadata; a tensor larger than it is refused.",
          "2G"),
))

DEVICE = Section("devices[]", "`devices[]`: each target device", (
    "A device the published files are checked against: the memory llama.cpp's CPU build takes to run each model "
    "file at the device's context and KV cache type is predicted from the GGUF alone (pipeline/memory.py, "
    "the model of `ggufpipe fit`; within 0.978-1.046 of measured peak RSS, docs/devices.md) and compared with the "
    "device's memory. The manifest's `devices` section, the report and the card list every file per device and "
    "the largest quant that fits, and give a `llama-server` launch line for it (docs/devices.md#launch-lines)."
), (
    Field("name", "string `[a-z0-9][a-z0-9._-]*`, at most 32 characters", REQUIRED,
          "The device's name in the manifest, report and card; unique in the recipe.", "pi5-8g"),
    Field("memory", "string: a size, e.g. `8G`, `6144M`, `1.5GiB` (a bare number: bytes)", REQUIRED,
          "Memory the model may take on the device, parsed like `ggufpipe fit --mem`: binary units (K, M, G, T "
          "= 2^10, 2^20, 2^30, 2^40 bytes; `8G` is 8 GiB), a trailing `B` or `iB` allowed.", "6144M", range=integer(1, 2**50, "1 PiB")),
    Field("ctx", "int >= 16", 4096, "The context size the device runs the model at.", 8192, range=CTX),
    Field("kv_type", "`f32` | `f16` | `bf16` | `q8_0` | `q4_0` | `q4_1` | `iq4_nl` | `q5_0` | `q5_1` | `auto`", "f16",
          "KV cache type (llama.cpp `-ctk`/`-ctv`), case-insensitive. `auto`: the smallest of a gates eval set's "
          "`kv_types` inside the thresholds of every published quant (docs/quality-gates.md#kv-cache-types).", "q8_0"),
    Field("arch", "`x86_64` | `x86_64-avx512` | `arm64` | `arm64-dotprod` | `generic` | `jetson-orin` | "
                  "`jetson-xavier`", "x86_64",
          "CPU profile: which tensor types ggml-cpu repacks into a second buffer (docs/devices.md#repack-profiles-arch). "
          "For an `arm64` profile the publish stage warns when no published quant has a tensor repacked there. A "
          "Jetson profile offloads every layer (`-ngl`, `--no-mmap`; derived memory: docs/devices.md#jetson).",
          "arm64"),
    Field("require", "bool", False,
          "A published quant must fit this device: none fitting fails the build (naming the device and the smallest "
          "quant's need), like a failed gate.", True),
    Field("threads", "int >= 1", 4, "Threads of the device's launch line (`llama-server -t`): its fast cores.", 6, range=THREADS),
    Field("parallel", "int >= 1", 1,
          "Slots of the device's launch line (`llama-server -np`), sharing its `-c`: requests served at once.", 2, range=PARALLEL),
))
