"""The one-line contract, proven per command (issue #50 item 6), for the commands that look the llama.cpp tools up:
validate, plan, init and rebuild-check (their unit-tier siblings: tests/unit/test_fuzz_commands.py, which describes
the harness). At least 200 seeded inputs each, run in this process through ``pipeline.cli.main`` with the pinned
tools: the demo recipe and its committed manifest, a generated checkpoint (config.json and a safetensors header,
no weights: nothing here imports torch), mutated as YAML, JSON and flags.

rebuild-check's seed manifest records another llama.cpp build, so every input is refused before a rebuild starts
(the refusal under test is the manifest's reading). Rerun one command with ``pytest
tests/integration/test_fuzz_commands_tools.py -k <command>``; ``FUZZ_REPORT=<file>`` appends the summaries."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import struct

import pytest
import yaml
from helpers import ROOT, demo_recipe_data
from helpers.cli_fuzz import (
    BAD_ARGS,
    DECOY,
    HUGE_STRING,
    Case,
    Flag,
    Sandbox,
    argv_cases,
    in_range,
    json_cases,
    run_cases,
    run_main,
    yaml_cases,
)
from unit.test_fuzz_commands import FIFO_LIMIT, argv_as_cases, fifo, finish, mutants_as_cases, pending, seed_doc
from unit.test_plan import CFG, write_checkpoint

from pipeline.bounds import INT32_MAX

RECIPE = "recipes/r.yaml"
HF = "hf"
CONFIG = f"{HF}/config.json"
ST = f"{HF}/model.safetensors"
MANIFEST = "artifacts/smollm2-135m/manifest.json"

# ------------------------------------------------------------------ what a recipe must refuse

_INT32 = {"ctx", "max_ctx", "chunks", "n_predict", "prompts", "device_slice", "n_max"}
_NUMERIC = re.compile(r"^(ctx|max_ctx|chunks|threads|parallel|n_max|prompts|n_predict|device_slice|max_\w+|min_\w+)$")
_NOT_A_NUMBER = {".nan", ".inf", "-.inf", "-1", str(10**30), "0x7fffffffffffffff", "yes", "[]", "{}", "[[[[[[]]]]]]",
                 "''", "'..'", "../../" + DECOY, "/etc/passwd", "'\\u202e'", HUGE_STRING[:200_000]}
_NEVER_YAML = {"!!python/object/apply:os.system ['true']", "*undefined", "@reserved", "{a: 1, a: 2}"}
_NOT_A_NAME = {"'..'", "../../" + DECOY, "/etc/passwd", "'\\u202e'", "[]", "{}", ".nan"}


def recipe_checked(path, kind, value) -> bool:
    """What the recipe loader must refuse (issue #50 items 1, 4, 7): a repeated key; a YAML tag, undefined alias or
    repeated key inside a value; a numeric field that is not a finite number in range (NaN, infinity, negative,
    10^30; above the int32 of llama.cpp's n_ctx / n_chunks); a name or revision that is a path; a text_sha256 that
    is not one; the name, source or quants gone. Anything else may pass."""
    last = path[-1] if isinstance(path[-1], str) else ""
    if kind == "dup":
        return True
    if kind == "delete":
        return path in (("name",), ("source",), ("quants",))
    if value in _NEVER_YAML:
        return True
    if _NUMERIC.match(last):
        return value in _NOT_A_NUMBER or (last in _INT32 and value in ("2147483648", "1_000_000_000_000"))
    if path in (("name",), ("source", "revision"), ("source", "repo")) or last == "text_sha256":
        return value in _NOT_A_NAME or value == HUGE_STRING[:200_000]
    return False


# ------------------------------------------------------------------ validate


@pytest.fixture
def recipe_box(tmp_path, toolchain) -> Sandbox:
    def seed(folder):
        (folder / "recipes").mkdir(parents=True)
        (folder / RECIPE).write_text(yaml.safe_dump(demo_recipe_data(), sort_keys=False))
    return Sandbox(tmp_path, seed)


@pending("validate")
def test_validate(recipe_box):
    rng = random.Random(50_11)
    doc = demo_recipe_data()
    cases = mutants_as_cases(yaml_cases(rng, doc, 185, recipe_checked), RECIPE, ["validate", RECIPE])
    cases += argv_as_cases(argv_cases(rng, ["validate", RECIPE], [], 15))
    cases += [fifo(RECIPE, ["validate", RECIPE]), Case("a folder holding a FIFO", ["validate", "recipes"],
                                                       {"recipes/x.yaml": None}, True, FIFO_LIMIT),
              Case("the recipe twice under two names", ["validate", RECIPE, "recipes/s.yaml"],
                   {"recipes/s.yaml": (recipe_box.pristine / RECIPE).read_bytes()}),
              Case("a GGUF as the recipe", ["validate", "x.yaml"], {"x.yaml": b"GGUF\x03\x00\x00\x00" + bytes(64)}),
              Case("an empty recipe", ["validate", "x.yaml"], {"x.yaml": b""})]
    finish(run_cases("validate", recipe_box, cases))


# ------------------------------------------------------------------ plan


def _plan_recipe(source: str, ctx: int = 512, chunks: int = 16) -> dict:
    return {"name": "planned", "source": {"path": source}, "quants": ["Q8_0", "Q4_K_M"], "bench": False,
            "gates": [{"name": "botchan", "text": str(ROOT / "data" / "botchan.txt"), "ctx": ctx, "chunks": chunks}],
            "devices": [{"name": "pi5", "memory": "8G", "ctx": 4096}]}


def _plan_seed(folder):
    write_checkpoint(folder / HF)
    index = folder / "hf-index"
    index.mkdir()
    (index / "config.json").write_text(json.dumps(CFG))
    (index / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 1000}, "weight_map": {"model.embed_tokens.weight": "model-1.safetensors"}}))
    (folder / "recipes").mkdir()
    (folder / RECIPE).write_text(yaml.safe_dump(_plan_recipe(str(folder / HF)), sort_keys=False))
    (folder / "hub").mkdir()


@pytest.fixture
def plan_box(tmp_path, toolchain) -> Sandbox:
    return Sandbox(tmp_path, _plan_seed)


# the config.json numbers the plan and init read: an integer or null each, llama.cpp's bounds where it has them
_LAYER_KEYS = {"num_hidden_layers", "n_layer"}  # LLAMA_MAX_LAYERS 512
_EXPERT_KEYS = {"num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok"}  # LLAMA_MAX_EXPERTS 1024
_DIM_KEYS = {"hidden_size", "n_embd", "num_attention_heads", "n_head", "num_key_value_heads", "head_dim", "vocab_size",
             "intermediate_size", "n_inner", "moe_intermediate_size", "shared_expert_intermediate_size",
             "decoder_sparse_step", "sliding_window", "max_position_embeddings"}


def config_checked(path, kind, value) -> bool:
    """A config.json number the plan (and init) reads that is not an integer in range: refused naming the key."""
    key = path[0]
    if len(path) > 1 or kind == "delete" or value is None:
        return False
    hi = 512 if key in _LAYER_KEYS else 1024 if key in _EXPERT_KEYS else INT32_MAX if key in _DIM_KEYS else None
    return hi is not None and not in_range(value, 0, hi, integer=True)


def _header_checked(path, kind, value) -> bool:
    """A tensor's entry that is not a mapping, a dtype that is not a string, a shape that is not a list of
    non-negative integers (a dtype the plan does not know counts 2 bytes per element; a shorter shape is a shape)."""
    if len(path) == 1:
        return kind != "delete" and not isinstance(value, dict)
    if path[1] == "dtype":
        return kind == "delete" or not isinstance(value, str)
    if path[1] == "shape":
        if len(path) == 2:
            return kind == "delete" or not (isinstance(value, list) and all(in_range(x, 0, 2**63, True) for x in value))
        return kind != "delete" and not in_range(value, 0, 2**63, integer=True)
    return False


def _index_checked(path, kind, value) -> bool:
    if path in (("metadata",), ("weight_map",)):
        return kind != "delete" and value is not None and not isinstance(value, dict)
    if path == ("metadata", "total_size"):
        return kind != "delete" and bool(value) and not in_range(value, 0, 2**63, integer=True)
    return False


def _header_cases(rng, data: bytes, n: int) -> list:
    """The safetensors file: its header length and JSON mutated, the file truncated."""
    (hlen,) = struct.unpack("<Q", data[:8])
    header, rest = json.loads(data[8:8 + hlen]), data[8 + hlen:]
    out = []
    for m in json_cases(rng, header, n - n // 4, _header_checked):
        out.append(type(m)(f"safetensors header: {m.label}", struct.pack("<Q", len(m.data)) + m.data + rest, m.path,
                           m.bad))
    for v in (0, 1, 7, hlen - 1, hlen + 1, 2**40, 2**64 - 1)[: n // 4]:
        out.append(type(out[0])(f"safetensors header length {v}", struct.pack("<Q", v) + data[8:], None, True))
    return out


def test_plan(plan_box):
    rng = random.Random(50_12)
    argv = ["plan", RECIPE, "--work", "work", "--artifacts", "artifacts", "--hub-cache", "hub", "--source", HF]
    cases = mutants_as_cases(json_cases(rng, dict(CFG), 80, config_checked), CONFIG, argv)
    st = (plan_box.pristine / ST).read_bytes()
    cases += mutants_as_cases(_header_cases(rng, st[:8 + struct.unpack("<Q", st[:8])[0]], 24), ST, argv)
    idx = seed_doc(plan_box, "hf-index/model.safetensors.index.json")
    cases += mutants_as_cases(json_cases(rng, idx, 20, _index_checked),
                              "hf-index/model.safetensors.index.json", argv + ["--source", "hf-index"])
    doc = yaml.safe_load((plan_box.pristine / RECIPE).read_text())
    cases += mutants_as_cases(yaml_cases(rng, doc, 40, recipe_checked), RECIPE, argv)
    flags = [Flag("--cores", "8"), Flag("--name", "planned", BAD_ARGS[1:]), Flag("--source", HF),
             Flag("--hub-cache", "hub"), Flag("--work", "work"), Flag("--json")]
    items = argv_cases(rng, argv, flags, 40)
    # --hub-cache and --work are only read (the source is a folder): any path may pass
    cases += argv_as_cases([(lbl, a, bad and not lbl.startswith(("--hub-cache", "--work"))) for lbl, a, bad in items])
    cases += [fifo(CONFIG, argv), fifo(ST, argv), Case("tokenizer.json is a FIFO", argv, {f"{HF}/tokenizer.json": None},
                                                      False, FIFO_LIMIT),
              fifo("hf-index/model.safetensors.index.json", argv + ["--source", "hf-index"])]
    finish(run_cases("plan", plan_box, cases))


BOTCHAN_TOKENS_MAX = (ROOT / "data" / "botchan.txt").stat().st_size + 2  # the recipe's bound: a token per byte


@pytest.mark.parametrize("ctx,chunks,refused", [(INT32_MAX, 1, True), (512, INT32_MAX, True),
                                               (INT32_MAX, INT32_MAX, True), (BOTCHAN_TOKENS_MAX, 1, False),
                                               (512, BOTCHAN_TOKENS_MAX // 512, False)])
def test_plan_at_the_largest_values_in_range_stays_sane(tmp_path, toolchain, ctx, chunks, refused):
    """The largest ctx and chunks a recipe may hold: llama.cpp's int32, and no more tokens than the eval text has
    bytes. Beyond that: one line naming the field, before any plan. At the largest the text allows: every number of
    the plan finite, not negative, in units a reader takes in (no ``824108720.5 GiB``)."""
    box = Sandbox(tmp_path, _plan_seed)
    (box.case / RECIPE).write_text(yaml.safe_dump(_plan_recipe(str(box.case / HF), ctx, chunks), sort_keys=False))
    o = run_main(["plan", RECIPE, "--work", "work", "--artifacts", "artifacts", "--hub-cache", "hub"], box.case, box.root)
    assert o.crash is None and o.code == (1 if refused else 0), o.crash or o.err
    if refused:
        assert o.err.startswith(f"error: {RECIPE}: gates[0].chunks: ctx {ctx} x {chunks} chunks needs ") \
            and len(o.err.splitlines()) == 1, o.err
        return
    sizes = re.findall(r"(-?[\d.]+) ([KMGTPE]iB)", o.out)
    assert sizes and all(0 <= float(v) < 1024 for v, _ in sizes), sizes
    total = re.search(r"total hours on the box: (\S+)", o.out)
    assert total and math.isfinite(float(total.group(1))), o.out[-500:]


# ------------------------------------------------------------------ init


def _init_seed(folder):
    hf = write_checkpoint(folder / HF, {**CFG, "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 2048})
    (hf / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (hf / "README.md").write_text("---\nlicense: mit\n---\n# a card\n")
    (folder / "recipes").mkdir()


@pytest.fixture
def init_box(tmp_path, toolchain) -> Sandbox:
    return Sandbox(tmp_path, _init_seed)


def init_config_checked(path, kind, value) -> bool:
    if path == ("architectures",) or path[:1] == ("architectures",) and kind != "delete":
        return not (isinstance(value, str) and value == "LlamaForCausalLM")
    if path == ("architectures",) and kind == "delete":
        return True
    return config_checked(path, kind, value) and path[0] == "max_position_embeddings"


def test_init(init_box):
    rng = random.Random(50_13)
    argv = ["init", HF, "--out", "recipes/new.yaml"]
    cfg = seed_doc(init_box, CONFIG)
    cases = mutants_as_cases(json_cases(rng, cfg, 90, init_config_checked), CONFIG, argv)
    st = (init_box.pristine / ST).read_bytes()
    cases += mutants_as_cases(_header_cases(rng, st[:8 + struct.unpack("<Q", st[:8])[0]], 16), ST, argv)
    devices = (*BAD_ARGS, "pi5", "pi5:8G:4k", "pi5:8G:0", "pi5:8G:2147483648", "pi5:8G:1e999", "pi5:-8G", "pi5:0G",
               "pi5:99999999999999T", "Pi5:8G", "pi5:8G:4096:sparc", "pi5:8G:4096:arm64:x", ":8G", "pi5:8G:nan")
    flags = [Flag("--device", "pi5:8G", devices), Flag("--quants", "Q8_0", (*BAD_ARGS[1:], "Q9_9", ",", "Q8_0,,x", "f16")),
             Flag("--gates", str(ROOT / "data" / "botchan.txt"), (*BAD_ARGS, "/dev/zero", "recipes")),
             Flag("--name", "x", ("Bad Name", "../x", "/", "..", "a" * 5000, "名前", ".x", "x/y")),
             Flag("--out", "recipes/new.yaml", ("recipes", CONFIG, "/", "..", "a" * 5000, "/dev/null"))]
    items = argv_cases(rng, argv, flags, 90, positional_bad=(*BAD_ARGS, "org/name", "org/name@..", "a/b@../../x"))
    cases += argv_as_cases(items)
    cases += [fifo(CONFIG, argv), fifo(ST, argv),  # the optional files below are skipped, not waited for
              Case("tokenizer_config.json is a FIFO", argv, {f"{HF}/tokenizer_config.json": None}, False, FIFO_LIMIT),
              Case("README.md is a FIFO", argv, {f"{HF}/README.md": None}, False, FIFO_LIMIT),
              Case("--gates is a FIFO", argv + ["--gates", "g.txt"], {"g.txt": None}, True, FIFO_LIMIT),
              Case("--out exists", argv, {"recipes/new.yaml": b"x"})]
    finish(run_cases("init", init_box, cases))


# ------------------------------------------------------------------ rebuild-check


def _rebuild_seed(folder):
    (folder / "recipes").mkdir(parents=True)
    text = yaml.safe_dump(demo_recipe_data(), sort_keys=False)
    (folder / "recipes" / "smollm2-135m.yaml").write_text(text)
    m = json.loads((ROOT / MANIFEST).read_text())
    m["recipe"]["sha256"] = hashlib.sha256(text.encode()).hexdigest()
    m["tools"]["llama_cpp_build"] = 1  # never this toolchain: every input is refused before a rebuild starts
    m["tools"].pop("python", None)  # (each recorded environment would be asked for its versions)
    (folder / MANIFEST).parent.mkdir(parents=True)
    (folder / MANIFEST).write_text(json.dumps(m, indent=1))


@pytest.fixture
def rebuild_box(tmp_path, toolchain, monkeypatch) -> Sandbox:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hub"))
    return Sandbox(tmp_path, _rebuild_seed)


@pending("rebuild-check")
def test_rebuild_check(rebuild_box):
    rng = random.Random(50_14)
    argv = ["rebuild-check", MANIFEST]
    doc = seed_doc(rebuild_box, MANIFEST)
    cases = mutants_as_cases(json_cases(rng, doc, 180), MANIFEST, argv, bad=True)
    flags = [Flag("--recipe", "recipes/smollm2-135m.yaml"), Flag("--cores", "2"), Flag("--keep", "keep"),
             Flag("--only", "Q8_0"), Flag("--hub-cache", "hub")]
    cases += argv_as_cases(argv_cases(rng, argv, flags, 20))
    cases += [fifo(MANIFEST, argv), fifo("recipes/smollm2-135m.yaml", argv)]
    finish(run_cases("rebuild-check", rebuild_box, cases))


# ------------------------------------------------------------------ the defects the fuzzing found in plan and init


@pytest.mark.parametrize("key,value,what", [
    ("num_hidden_layers", 10**18, "must be an integer 0..512 (llama.cpp's LLAMA_MAX_LAYERS), got 1000000000000000000"),
    ("num_hidden_layers", float("nan"), "must be an integer 0..512 (llama.cpp's LLAMA_MAX_LAYERS), got nan"),
    ("hidden_size", [None], "must be an integer 0..2147483647 (a model dimension), got [None]"),
    ("intermediate_size", "line\nbreak", "got 'line\\nbreak'"),
    ("num_key_value_heads", 1.5, "got 1.5"),
    ("num_experts", 4096, "must be an integer 0..1024 (llama.cpp's LLAMA_MAX_EXPERTS), got 4096"),
    ("text_config", [1], "text_config: must be a JSON object"),
])
def test_plan_refuses_a_config_number_naming_the_key(plan_box, key, value, what):
    (plan_box.case / CONFIG).write_text(json.dumps({**CFG, key: value}))
    o = run_main(["plan", RECIPE, "--source", HF, "--hub-cache", "hub"], plan_box.case, plan_box.root, 4.0)
    assert o.crash is None and o.code == 1, o.crash or o.out[-300:]
    assert o.err.startswith(f"error: {CONFIG}: ") and what in o.err and o.err.count("\n") == 1, o.err


@pytest.mark.parametrize("damage,what", [
    ("fifo", "model.safetensors: not a regular file (a FIFO, socket or device)"),
    ("long", "not a safetensors file (header length"),
    ("shape", "tensor 'model.embed_tokens.weight': not a safetensors entry"),
    ("config", "config.json: cannot read the checkpoint's config: not a regular file"),
])
def test_plan_refuses_a_damaged_checkpoint_without_waiting(plan_box, damage, what):
    st = plan_box.case / ST
    if damage == "fifo":
        st.unlink()
        os.mkfifo(st)
    elif damage == "long":
        st.write_bytes(struct.pack("<Q", 10**6) + st.read_bytes()[8:100])
    elif damage == "shape":
        (n,) = struct.unpack("<Q", st.read_bytes()[:8])
        header = json.loads(st.read_bytes()[8:8 + n])
        header["model.embed_tokens.weight"]["shape"] = 1.5
        raw = json.dumps(header).encode()
        st.write_bytes(struct.pack("<Q", len(raw)) + raw)
    else:
        (plan_box.case / CONFIG).unlink()
        os.mkfifo(plan_box.case / CONFIG)
    o = run_main(["plan", RECIPE, "--source", HF, "--hub-cache", "hub"], plan_box.case, plan_box.root, 4.0)
    assert o.crash is None and o.code == 1 and what in o.err and o.err.count("\n") == 1, o.crash or o.err


@pytest.mark.parametrize("cores", ["0", "-1", "65537", "nan"])
def test_plan_cores_out_of_range_are_usage_errors(plan_box, cores):
    o = run_main(["plan", RECIPE, "--source", HF, f"--cores={cores}"], plan_box.case, plan_box.root)
    assert o.crash is None and o.code == 2 and "ggufpipe plan: error: argument --cores: " in o.err, o.crash or o.err


@pytest.mark.parametrize("argv,files,what", [
    (["--device", "pi5:8G:2147483648"], {}, "the context size: must be an integer 16..2147483647 "
                                            "(llama.cpp's n_ctx is an int32), got 2147483648"),
    (["--device", "pi5:99999999999999T"], {}, "'99999999999999T' is out of range: a memory size is 1 byte to 8 EiB"),
    ([], {CONFIG: {"architectures": 1.5}}, "config.json names no architecture"),
    ([], {CONFIG: {"max_position_embeddings": 1.5}}, "config.json: max_position_embeddings: must be an integer"),
    ([], {CONFIG: {"max_position_embeddings": float("nan")}}, "max_position_embeddings: must be an integer"),
    ([], {CONFIG: {"num_nextn_predict_layers": [1]}}, "num_nextn_predict_layers: must be an integer"),
])
def test_init_refuses_in_one_line(init_box, argv, files, what):
    for rel, over in files.items():
        p = init_box.case / rel
        p.write_text(json.dumps({**json.loads(p.read_text()), **over}))
    o = run_main(["init", HF, "--out", "recipes/new.yaml", *argv], init_box.case, init_box.root)
    assert o.crash is None and o.code == 1 and what in o.err and o.err.count("\n") == 1, o.crash or o.err
    assert not (init_box.case / "recipes" / "new.yaml").exists()


@pytest.mark.parametrize("name", ["tokenizer_config.json", "README.md"])
def test_init_skips_an_optional_file_that_is_a_fifo(init_box, name):
    (init_box.case / HF / name).unlink()
    os.mkfifo(init_box.case / HF / name)
    o = run_main(["init", HF, "--out", "recipes/new.yaml"], init_box.case, init_box.root, 4.0)
    assert o.crash is None and o.code == 0, o.crash or o.err
