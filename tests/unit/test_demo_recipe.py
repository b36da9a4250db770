"""The demo recipe points at the commit under which `ggufpipe setup-demo` places the demo snapshot."""

from __future__ import annotations

from helpers import DEMO_RECIPE


def test_demo_recipe_points_at_fixture_commit():
    from pipeline.demo import DEMO_COMMIT, DEMO_REPO

    text = DEMO_RECIPE.read_text()
    assert DEMO_COMMIT in text and DEMO_REPO in text
