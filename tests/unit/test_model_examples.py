"""The ready real-model recipes of docs/models.md (docs/examples/minicpm*.yaml) validate offline: every key, the
text's SHA256, the draft built beside the main. What only the Hub can settle is the revision lookup: they follow
``main`` until pinned, which ``ggufpipe ci`` refuses (its pin check, run here as well)."""

from __future__ import annotations

import pytest
from helpers import ROOT

from pipeline.distribution.ci_select import pin_problems
from pipeline.recipe import load_recipe

EXAMPLES = ROOT / "docs" / "examples"
MINICPM = sorted(EXAMPLES.glob("minicpm*.yaml"))


def test_minicpm_examples_exist_and_are_linked():
    assert [p.name for p in MINICPM] == ["minicpm4-8b.yaml", "minicpm5-2b.yaml"]
    models = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    assert all(f"examples/{p.name}" in models for p in MINICPM)


@pytest.mark.parametrize("path", MINICPM, ids=lambda p: p.name)
def test_minicpm_example_validates_offline(path):
    r = load_recipe(path)
    assert r.name == path.stem and r.source.repo.startswith("openbmb/MiniCPM")
    # MiniCPM 1-4 name remote code (auto_map): the fetch refuses it without the explicit opt-in; MiniCPM5 is a
    # stock LlamaForCausalLM and needs none
    remote = not r.name.startswith("minicpm5")
    assert r.source.trust_remote_code is remote and r.draft.source.trust_remote_code is remote
    assert r.draft.source.repo.startswith("openbmb/MiniCPM") and r.draft.source.repo != r.source.repo
    d = r.draft_recipe()
    assert d.name == f"{r.name}-draft" and [q.key for q in d.quants] == ["Q8_0"]
    assert r.draft.pairs == (("Q4_K_M", "Q8_0"), ("Q8_0", "Q8_0"))
    assert r.eval_sets and r.first_eval_set is r.eval_sets[0] and r.first_eval_set.text.is_file()
    assert r.conformance.enabled and r.conformance.chunks == (2 if remote else 4)
    # the revision lookup is the one step left to the Hub: CI refuses the recipe until both sources are pinned
    assert r.source.revision == r.draft.source.revision == "main"
    assert [line.split(": ", 1)[1] for line in pin_problems(r, path.name)] == [
        "source.revision: 'main' is not a full commit SHA (CI builds need pinned sources)",
        "draft.source.revision: 'main' is not a full commit SHA (CI builds need pinned sources)"]
