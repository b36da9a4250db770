"""The naming rule in the recipe parser (pipeline/recipe/naming.py, issue #16): every recipe of this repository and the
test fixtures' recipes give each published file one label that both resolvers read right; names that would
collide, variants the Hub cannot read and labels that are another type's name are refused in one line naming the
entries. (The resolvers themselves are checked against the real huggingface.js and llama.cpp in
tests/unit/test_naming_hub.py and tests/integration/test_naming_llama.py.)"""

from __future__ import annotations

import pytest
from helpers import GOOD_RECIPE, ROOT, recipe_error, write_recipe_text

from pipeline.recipe import key_ref, load_recipe, naming


def _tables(r) -> dict[str, tuple[str, str | None]]:
    """{label: (the Hub's only file, llama.cpp's pick)} over the recipe's published names."""
    pub = r.published_names()
    listing = sorted(p for f in pub for p in f.paths)
    out = {}
    for f in pub:
        hub = naming.hub_resolve(listing, f.label)
        assert len({p.split("/")[0] for p in hub}) == 1, (f.label, hub)
        out[f.label] = (hub[0], None if f.sidecar else naming.llama_pick(listing, f.label))
    return out


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_repository_recipes_resolve_one_file_per_label(path):
    r = load_recipe(path)
    for rr in (r, r.draft_recipe()):
        if rr is None:
            continue
        table = _tables(rr)
        print(f"\n{rr.name}: " + "; ".join(f"{k}: Hub {h}, llama.cpp {p}" for k, (h, p) in table.items()))
        assert naming.check_repo(rr.published_names()) == []
        for f in rr.published_names():
            assert table[f.label] == (f.paths[0], None if f.sidecar else f.paths[0])


def test_calibration_demo_labels():
    r = load_recipe(ROOT / "recipes" / "smollm2-135m-calib.yaml")
    assert [q.key for q in r.quants] == ["Q4_K_M", "Q4_K_M_IMAT", "Q4_K_M_AWQ", "Q4_K_M_AWQIMAT",
                                         "Q3_K_M", "Q3_K_M_IMAT", "Q3_K_M_AWQ", "Q3_K_M_AWQIMAT"]
    assert r.file_for("Q4_K_M_IMAT") == "smollm2-135m-calib-Q4_K_M_IMAT.gguf"


def test_split_and_mtp_names(tmp_path):
    text = GOOD_RECIPE + "mtp: separate\nsplit: {max_size: 2G}\n"
    r = load_recipe(write_recipe_text(tmp_path, text))
    pub = {f.label: f for f in r.published_names()}
    # the MTP draft stays whole at the root: llama.cpp looks for it in the model's folder or above
    assert pub["F16_MTP"].paths == ("demo-a-mtp-F16_MTP.gguf",) and pub["F16_MTP"].sidecar
    listing = sorted(p for f in pub.values() for p in f.paths)
    assert naming.llama_pick(listing, "Q4_K_M_EMBQ") == "demo-a-Q4_K_M_EMBQ/demo-a-Q4_K_M_EMBQ-00001-of-00002.gguf"
    assert naming.llama_pick_mtp(listing, naming.llama_pick(listing, "Q8_0"), "Q8_0")== "demo-a-mtp-F16_MTP.gguf"
    assert naming.check_repo(list(pub.values())) == []
    # in a shard folder of its own it would not be found beside any model
    moved = [naming.Published("F16_MTP", "the MTP draft", ("demo-a-mtp-F16_MTP/demo-a-mtp-F16_MTP-00001-of-00002.gguf",),
                              sidecar=True) if f.sidecar else f for f in pub.values()]
    assert any("does not fetch demo-a-mtp-F16_MTP/" in p for p in naming.check_repo(moved)), naming.check_repo(moved)


BAD = [
    ("digit in variant", GOOD_RECIPE.replace("variant: embq", "variant: embq8"),
     "quants[1].variant", "'embq8' is not a variant: 1-24 letters A-Z"),
    ("variant makes another type", GOOD_RECIPE + "  - {type: Q2_K, variant: s}\n",
     "quants[3].variant", "Q2_K with variant S would be labelled Q2_K_S, the name of another quant type"),
    ("quant type in the name", GOOD_RECIPE.replace("name: demo-a", "name: demo-q8_0"),
     "quants", "file names collide: quants[0] (Q8_0) and the base file (F16) both match llama.cpp's `-hf <repo>:Q8_0`"),
    ("name that is an MTP sidecar", GOOD_RECIPE.replace("name: demo-a", "name: mtp-demo"),
     "quants", "file names collide: the base file (F16): llama.cpp's `-hf <repo>:F16` does not pick mtp-demo-F16.gguf"),
    ("quant type in path_in_repo", GOOD_RECIPE + "publish: {hf_repo: a/b, path_in_repo: gguf/Q8_0-x}\n",
     "quants", "file names collide: quants[0] (Q8_0) and the base file (F16) both match llama.cpp's `-hf <repo>:Q8_0` "
     "(gguf/Q8_0-x/demo-a-Q8_0.gguf, gguf/Q8_0-x/demo-a-F16.gguf)"),
    ("same label twice", GOOD_RECIPE + "  - {type: Q4_K_M, variant: EMBQ}\n", "quants[3]", "Q4_K_M_EMBQ repeats quants[1]"),
]


@pytest.mark.parametrize("label,text,field,what", BAD, ids=[b[0] for b in BAD])
def test_names_refused_in_one_line(tmp_path, label, text, field, what):
    exc = recipe_error(write_recipe_text(tmp_path, text))
    assert exc.field == field and what in exc.message, exc


def test_key_references_old_and_new():
    assert key_ref("Q4_K_M-imat") == key_ref("q4_k_m_imat") == "Q4_K_M_IMAT"
    assert key_ref("q4_k") == "Q4_K_M" and key_ref("gguf") == "gguf"
    assert key_ref("mtp-F16") == key_ref("mtp-F16_MTP") == "mtp-F16_MTP"
