"""pipeline/recipe/naming.py's re-implementation of the Hub's label (``hub_label``) against the real library.

tests/data/hub_labels.json holds what ``parseGGUFQuantLabel`` of @huggingface/tasks 0.21.54 (npm) returns for
every name of its corpus, written by tests/data/hub_labels.mjs under node (see its header for the two commands);
nothing here derives a label from naming.py, so the comparison is not circular."""

from __future__ import annotations

import json

from helpers import ROOT

from pipeline.recipe import naming

HUB_LABELS = ROOT / "tests" / "data" / "hub_labels.json"
SOURCE = "@huggingface/tasks 0.21.54 parseGGUFQuantLabel"
COUNT = 642  # names hub_labels.mjs writes: rerun it and update this when its corpus changes

# the demo recipes' file names under issue #16's rule (recipes/smollm2-135m*.yaml and the draft)
DEMO_LABELS = (
    "F16",
    "Q8_0",
    "Q5_K_M",
    "Q4_K_M",
    "Q3_K_M",
    "Q4_K_M_IMAT",
    "Q4_K_M_AWQ",
    "Q4_K_M_AWQIMAT",
    "Q3_K_M_IMAT",
    "Q3_K_M_AWQ",
    "Q3_K_M_AWQIMAT",
    "Q4_0",
)
DEMO_NAMES = ("smollm2-135m", "smollm2-135m-calib", "smollm2-135m-draft")


def _doc() -> dict:
    return json.loads(HUB_LABELS.read_text())


def test_hub_labels_json_is_the_real_librarys_output():
    doc = _doc()
    assert doc["source"] == SOURCE
    labels = doc["labels"]
    assert len(labels) == COUNT
    assert all(v is None or isinstance(v, str) for v in labels.values())
    # the upstream spec's cases (packages/gguf/src/gguf.spec.ts), as the spec states them
    assert labels["Codestral-22B-v0.1-Q4_0_4_4.gguf"] == "Q4_0"
    assert labels["Qwen3-4B-UD-Q2_K_XL.gguf"] == "UD-Q2_K_XL"
    assert labels["Codestral-22B-v0.1.gguf"] is None
    # the corpus holds every demo file name under the new rule, and reads each as its label
    for name in DEMO_NAMES:
        for label in DEMO_LABELS:
            assert labels[f"{name}-{label}.gguf"] == label
    assert labels["smollm2-135m-mtp-F16_MTP.gguf"] == "F16_MTP"


def test_hub_label_matches_the_real_library():
    labels = _doc()["labels"]
    wrong = {name: (naming.hub_label(name), want) for name, want in labels.items() if naming.hub_label(name) != want}
    assert not wrong, "naming.hub_label (got, library): " + "; ".join(
        f"{n}: {g!r} != {w!r}" for n, (g, w) in wrong.items()
    )


def test_hub_resolve_against_the_real_labels():
    """``hub_resolve`` keeps exactly the .gguf files the library labels with the tag (case-insensitive tag)."""
    labels = _doc()["labels"]
    paths = sorted(labels)
    for tag in ("Q4_K_M", "q4_k_m_imat", "F16", "F16_MTP", "Q2_K_S", "MXFP4"):
        want = [p for p in paths if p.endswith(".gguf") and labels[p] == tag.upper()]
        assert naming.hub_resolve(paths, tag) == want, tag
