"""Conformance of a built draft (issue #15): the demo's draft ``smollm2-135m-draft`` (derived from the demo recipe's
``draft:``; no eval sets, so the conformance stage makes its own base logits in its scratch folder) built by the
stage entry functions (fetch from the demo hub cache, convert, quantize), then conformance, publish and gate.

- unbroken: every check passes, the scratch folder is gone, both files are published and the gate passes (the
  control: draft conformance does not always fail);
- broken: the draft's fetched HF folder gets an NFD normalizer in tokenizer.json (the converter keeps none of it:
  the base GGUF's tokenizer keys are those of the unbroken conversion), so HF splits "café" unlike the GGUF: the
  record fails in one line per difference, each naming the draft recipe and the check (tokenizer parity; the
  chat template's input ids), publish links no file of the draft (every file rejected for conformance, no GGUF
  and no temporary file in its artifact folder) and the gate refuses in one line.

The main recipe is the demo's with ``conformance: {chunks: 2}`` (the draft inherits it): half the logit check's
cost of the default 4, which the unbroken draft still passes by far."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from helpers import BOTCHAN, demo_recipe_data

from pipeline.errors import GateFailure
from pipeline.layout import Layout
from pipeline.recipe import load_recipe
from pipeline.stages import conformance
from pipeline.stages.publish import CONFORMANCE_REJECTED, check_gates, publish

DRAFT = "smollm2-135m-draft"
CHUNKS = 2
PUBLISHED_PAGES = {"manifest.json", "metrics.json", "report.md", "report.svg", "README.md"}
FIRST_FAILURE = (
    f"conformance: recipe {DRAFT}: tokenizer parity (a: no specials added, special text parsed): "
    "probe french: cause nfd (the HF normalizer NFD of tokenizer.json (TokenizersBackend), which llama.cpp's BPE "
    "tokenizer does not apply): first difference at token 1"
)


def _fetch(recipe, layout: Layout, hub, break_hf: bool) -> None:
    """The draft's fetch stage (hard links of the hub cache's files); ``break_hf``: then an NFD normalizer in the
    fetched tokenizer.json."""
    from pipeline.stages.fetch import fetch

    name = recipe.name
    layout.log(name, "x").parent.mkdir(parents=True, exist_ok=True)
    fetch(recipe, layout.hf(name), layout.fetch_record(name), hub_cache=str(hub))
    if break_hf:
        tj = layout.hf(name) / "tokenizer.json"
        data = json.loads(tj.read_text())
        data["normalizer"] = {"type": "NFD"}
        tj.unlink()  # a hard link of the hub cache's file: never write through it
        tj.write_text(json.dumps(data))


def _convert_and_quantize(recipe, layout: Layout, toolchain) -> None:
    from pipeline.stages.convert import convert
    from pipeline.stages.quantize import quantize

    name = recipe.name
    convert(
        recipe,
        layout.hf(name),
        layout.base_gguf(recipe),
        layout.convert_record(recipe),
        layout.log(name, "convert-F16"),
        tc=toolchain,
    )
    for q in recipe.quants:
        quantize(
            recipe,
            q.key,
            layout.base_gguf(recipe),
            layout.quant(recipe, q.key),
            layout.quant_record(name, q.key),
            layout.log(name, f"quantize-{q.key}"),
            threads=1,
            tc=toolchain,
        )


@pytest.fixture(scope="module")
def drafts(tmp_path_factory, demo_hub, toolchain):
    """(draft recipe, {"good": Layout, "broken": Layout}): the draft built twice, side by side, under tmp roots."""
    root = tmp_path_factory.mktemp("draft-conformance")
    data = demo_recipe_data()  # its texts made absolute
    data["conformance"] = {"chunks": CHUNKS}
    data["draft"]["speedup"] = False  # the pair records below are written, not measured: the line is the estimate's
    main_file = root / "recipes" / "smollm2-135m.yaml"
    main_file.parent.mkdir()
    main_file.write_text(yaml.safe_dump(data, sort_keys=False))
    recipe = load_recipe(main_file, str(toolchain.tool("llama-quantize"))).draft_recipe()
    assert recipe.name == DRAFT and recipe.eval_sets == () and recipe.conformance.text == BOTCHAN
    assert recipe.conformance.chunks == CHUNKS and [q.key for q in recipe.quants] == ["Q4_0"]
    layouts = {k: Layout(root / k / "artifacts", root / k / "work") for k in ("good", "broken")}
    t0 = time.monotonic()
    for k, layout in layouts.items():  # one after the other: fsutil.hashing_ahead is per process, not per thread
        _fetch(recipe, layout, demo_hub, k == "broken")
    with ThreadPoolExecutor(2) as pool:  # the stages' tools, one per core
        list(pool.map(lambda layout: _convert_and_quantize(recipe, layout, toolchain), layouts.values()))
    print(f"\n[draft conformance] two draft builds (fetch, convert, quantize): {time.monotonic() - t0:.1f}s")
    return recipe, layouts


def _show(label: str, rec: dict) -> None:
    print(f"\n[draft conformance {label}] passed={rec['passed']} seconds={rec['seconds']['total']}")
    for k, c in rec["checks"].items():
        print(f"  {k}: {'pass' if c['passed'] else 'FAIL'}: {c.get('summary') or c.get('not_run')}")
    for line in rec["failures"]:
        print(f"  {line}")


def _conformance(recipe, layout: Layout, toolchain, label: str) -> dict:
    rec = conformance.run_stage(recipe, layout, threads=2, tc=toolchain)
    _show(label, rec)
    assert json.loads(layout.conformance_record(DRAFT).read_text()) == rec
    assert rec["recipe"] == DRAFT and rec["gguf"] == f"{DRAFT}-F16.gguf"
    assert not layout.conformance_dir(DRAFT).exists()  # the draft's own base logits: scratch, removed
    lg = rec["checks"]["logits"]  # measured on those logits (the weights are the same in both builds)
    assert lg["passed"] and lg["chunks"] == CHUNKS and lg["positions"] == CHUNKS * 255, lg
    return rec


def _art_files(layout: Layout) -> set[str]:
    return {p.name for p in layout.art_dir(DRAFT).iterdir()}


def test_unbroken_draft_passes_and_publishes(drafts, toolchain):
    recipe, layouts = drafts
    L = layouts["good"]
    rec = _conformance(recipe, L, toolchain, "unbroken")
    assert rec["passed"] and rec["failures"] == [], rec["failures"]
    assert all(c["passed"] for c in rec["checks"].values()) and set(rec["checks"]) == {
        "tokenizer",
        "chat_template",
        "eog",
        "hparams",
        "logits",
    }
    assert rec["checks"]["tokenizer"]["mismatches"] == {"a": 0, "b": 0, "c": 0}
    m = publish(recipe, L)
    files = [f"{DRAFT}-F16.gguf", f"{DRAFT}-Q4_0.gguf"]
    assert [e["file"] for e in m["artifacts"]] == files and m["rejected"] == [] and "failures" not in m
    assert m["conformance"]["passed"] is True
    assert _art_files(L) == PUBLISHED_PAGES | set(files)
    check_gates(L.manifest(DRAFT), L.gate_ok(DRAFT))
    assert L.gate_ok(DRAFT).read_text() == m["build_id"] + "\n"


def test_broken_draft_fails_conformance_and_publishes_nothing(drafts, toolchain):
    from pipeline.gguf import tokenizer_sha256

    recipe, layouts = drafts
    L = layouts["broken"]
    # the converter cannot see the normalizer: the same tokenizer keys as the unbroken conversion
    assert tokenizer_sha256(L.base_gguf(recipe)) == tokenizer_sha256(layouts["good"].base_gguf(recipe))
    rec = _conformance(recipe, L, toolchain, "NFD normalizer in the HF folder")
    # the rendered conversations are tokenized by the same tokenizer: their input ids differ on the accents too
    c = rec["checks"]
    assert rec["passed"] is False and not c["tokenizer"]["passed"] and not c["chat_template"]["passed"]
    assert c["eog"]["passed"] and c["tokenizer"]["mismatches"]["a"] > 0
    failures = rec["failures"]
    prefixes = tuple(f"conformance: recipe {DRAFT}: {check}" for check in ("tokenizer parity (", "chat template: "))
    assert failures and all("\n" not in f and f.startswith(prefixes) for f in failures), failures
    assert failures[0].startswith(FIRST_FAILURE) and "37366 ' café'" in failures[0], failures[0]
    assert failures[0] in L.log(DRAFT, "conformance").read_text()

    m = publish(recipe, L)  # the publish stage (Snakefile rule publish: `ggufpipe stage publish`) does not raise:
    # it records the rejection, links no file, and the gate (the build's last job) fails the build
    assert m["artifacts"] == [] and m["conformance"]["passed"] is False
    assert sorted(e["file"] for e in m["rejected"]) == [f"{DRAFT}-F16.gguf", f"{DRAFT}-Q4_0.gguf"]
    for e in m["rejected"]:
        assert [f["message"] for f in e["failures"]] == [CONFORMANCE_REJECTED], e["failures"]
    assert [f["message"] for f in m["failures"]] == failures
    assert _art_files(L) == PUBLISHED_PAGES  # no GGUF, no half-written (hidden temporary) file
    assert json.loads(L.manifest(DRAFT).read_text()) == m
    with pytest.raises(GateFailure) as exc:
        check_gates(L.manifest(DRAFT), L.gate_ok(DRAFT))
    assert {c["check"] for c in exc.value.checks} == {"conformance"} and exc.value.published == 0
    assert exc.value.messages == list(dict.fromkeys([CONFORMANCE_REJECTED, *failures]))
    line = str(exc.value)
    print(f"\n[draft conformance gate] {line}")
    assert "\n" not in line and line.startswith(CONFORMANCE_REJECTED + "; " + FIRST_FAILURE), line
    assert line.endswith(" (0 quant(s) published)"), line
    assert not L.gate_ok(DRAFT).exists()


def test_main_manifest_names_no_unpublished_draft(drafts, toolchain):
    """The main recipe's draft section: with the draft published, each pair gets its deployment line; with the
    draft rejected by its conformance, each pair is a `draft_published` failure and names no deploy command (it
    used to print `llama-server ... -md smollm2-135m-draft-Q4_0.gguf` for a file that does not exist)."""
    from pipeline.stages.publish import _draft_section

    recipe, layouts = drafts
    main = load_recipe(recipe.path, str(toolchain.tool("llama-quantize")))
    for k, layout in layouts.items():
        if not layout.manifest(DRAFT).exists():  # this module's other tests publish it; alone, publish here
            conformance.run_stage(recipe, layout, threads=2, tc=toolchain)
            publish(recipe, layout)
        # the pair records the main recipe's draft stages would have written (vocab check, acceptance, agreement)
        for mkey, dkey in main.draft.pairs:
            for path, rec in ((layout.vocab_record(main.name, mkey, dkey), {
                    "compatible": True, "rule": "llama.cpp common/speculative.cpp", "reason": "", "diff": {},
                    "warnings": []}), (layout.spec_record(main.name, mkey, dkey), {
                    "acceptance_rate": 0.5, "accepted": 5, "drafted": 10, "best_n_max": 4})):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(rec))
        for dkey in {dk for _, dk in main.draft.pairs}:
            layout.agreement_record(main.name, dkey).write_text(json.dumps({"top1_agreement": 0.7}))
        info, failures, _ = _draft_section(main, layout)
        if k == "good":
            assert failures == [] and all(p["deploy"].endswith(f"-md {DRAFT}-Q4_0.gguf --spec-type draft-simple "
                                                               "--spec-draft-n-max 4") for p in info["pairs"]), info
        else:
            assert info["files"] == [] and all("deploy" not in p and p["published"] is False for p in info["pairs"])
            assert [f["check"] for f in failures] == ["draft_published"] * len(main.draft.pairs), failures
            msg = failures[0]["message"]
            print(f"\n[draft conformance, main manifest] {msg}")
            assert "\n" not in msg and msg.startswith("draft not published: recipe smollm2-135m, ") and \
                f"{DRAFT}-Q4_0.gguf was not published by recipe {DRAFT} ({CONFORMANCE_REJECTED})" in msg, msg
