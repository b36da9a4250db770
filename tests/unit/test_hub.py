"""The recipe's ``publish:`` section: one-line errors and defaults."""

from __future__ import annotations

import pytest
from helpers import HUB_REPO, HUB_SOURCE_COMMIT, hub_recipe_data, recipe_error, write_hub_recipe

from pipeline.distribution.hub import upload_plan
from pipeline.errors import RecipeError
from pipeline.recipe import load_recipe


@pytest.mark.parametrize("publish, field, message", [
    ({"hf_repo": "not a repo"}, "publish.hf_repo", "is not a Hugging Face repo id"),
    ({}, "publish.hf_repo", "missing"),
    ({"hf_repo": HUB_REPO, "token": "x"}, "publish.token", "unknown key"),
    ({"hf_repo": HUB_REPO, "revision": HUB_SOURCE_COMMIT}, "publish.revision", "is not a branch name"),
    ({"hf_repo": HUB_REPO, "path_in_repo": "../up"}, "publish.path_in_repo", "is not a folder path in the repo"),
    ({"hf_repo": HUB_REPO, "path_in_repo": "a/.hidden"}, "publish.path_in_repo", "is not a folder path in the repo"),
    ({"hf_repo": HUB_REPO, "private": "yes"}, "publish.private", "must be true or false"),
    ({"hf_repo": HUB_REPO, "ollama": False, "ollama_template": "{{ .Prompt }}"}, "publish.ollama_template",
     "only valid with `ollama: true`"),
    ({"hf_repo": HUB_REPO, "ollama_template": 'a """ b'}, "publish.ollama_template", 'must not contain """'),
])
def test_publish_section_errors_are_one_line(tmp_path, publish, field, message):
    data = hub_recipe_data()
    data["publish"] = publish
    path = write_hub_recipe(tmp_path, data)
    exc = recipe_error(path)
    assert exc.field == field and message in exc.message, exc


def test_publish_section_defaults(tmp_path):
    r = load_recipe(write_hub_recipe(tmp_path, hub_recipe_data()))
    p = r.publish
    assert (p.hf_repo, p.revision, p.private, p.path_in_repo, p.ollama, p.ollama_template) == (
        HUB_REPO, "main", False, "", True, None)
    data = hub_recipe_data()
    del data["publish"]
    plain = load_recipe(write_hub_recipe(tmp_path, data))
    assert plain.publish is None
    with pytest.raises(RecipeError) as exc:
        upload_plan(plain, {}, tmp_path)
    assert (exc.value.path, exc.value.field) == (plain.path, "publish") and exc.value.message.startswith("missing")
