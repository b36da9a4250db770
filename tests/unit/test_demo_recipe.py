"""The demo recipe points at the commit under which `ggufpipe setup-demo` places the demo snapshot."""

from __future__ import annotations

from helpers import DEMO_RECIPE


def test_demo_recipe_points_at_fixture_commit():
    from pipeline.demo import DEMO_COMMIT, DEMO_REPO

    text = DEMO_RECIPE.read_text()
    assert DEMO_COMMIT in text and DEMO_REPO in text


QUICK_RECIPE = DEMO_RECIPE.parent / "quick" / "smollm2-135m-quick.yaml"


def test_the_newcomers_demo_is_the_showcase_at_a_smaller_size():
    """`make demo`'s recipe shows each capability of `make demo-full`'s once, on the same model and the same
    thresholds (fixed before the showcase was first measured): only sample sizes, quants and pairs are fewer."""
    from pipeline.recipe import load_recipe

    quick, full = load_recipe(QUICK_RECIPE), load_recipe(DEMO_RECIPE)
    assert quick.source == full.source and quick.name == f"{full.name}-quick"
    assert {q.key for q in quick.quants} < {q.key for q in full.quants}
    for es in quick.eval_sets:  # two axes: prose (with a KV type beside f16) and chat
        twin = full.eval_set(es.name)
        assert (es.text, es.render, es.ctx, es.thresholds) == (twin.text, twin.render, twin.ctx, twin.thresholds)
        assert es.chunks <= twin.chunks
        for q in quick.quants:
            assert quick.thresholds(q.key, es.name) == full.thresholds(q.key, es.name), (q.key, es.name)
    assert [es.name for es in quick.eval_sets] == ["botchan", "chat"] and quick.eval_sets[0].kv_extra == ("q8_0",)
    assert quick.conformance.enabled and quick.conformance.chunks >= 1  # with its logit check
    d = quick.draft
    assert d.source == full.draft.source and d.speedup is not None and d.min_acceptance == full.draft.min_acceptance
    assert set(d.pairs) <= set(full.draft.pairs)
    assert [dev.name for dev in quick.devices] == [dev.name for dev in full.devices][:2]  # fit and launch lines
