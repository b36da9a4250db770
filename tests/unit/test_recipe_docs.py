"""docs/recipes.md is rendered from pipeline/recipe/schema.py, and that table agrees with the parser.

The checks against the parser are parametrized over the table, so a key added to it is covered at once:
each documented key, set to its documented example in an otherwise minimal recipe, loads and reaches the
parsed Recipe; an undocumented key is refused with the parser's own one-line error naming the field; and
every documented plain default is what ``load_recipe`` puts in the Recipe when the key is left out.
Recipes are loaded without llama-quantize (the unit tier has no llama.cpp tools).
"""

from __future__ import annotations

import copy
import hashlib
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.errors import RecipeError
from pipeline.recipe import docs as recipe_docs
from pipeline.recipe import load_recipe
from pipeline.recipe.schema import REQUIRED, SECTIONS, Field, Note, Section, section

ROOT = Path(__file__).resolve().parents[2]
SHA = "6b5982a638c6ed4e3da15711b6a5a1328c34a53e"

# What a section needs besides its required keys' examples to load (the table marks these "one of ..."
# Notes, as the parser wants exactly one of two keys).
EXTRA = {
    "": lambda: {"gates": copy.deepcopy(section("").fields[_index("", "gates")].example)},  # for quant gates, draft
    "source": lambda: {"repo": "org/model", "revision": SHA},
    "draft.source": lambda: {"repo": "org/small-model", "revision": SHA},
    "draft": lambda: {"source": {"repo": "org/small-model", "revision": SHA}, "quants": ["Q4_0"]},
}
# Keys that replace others when set (exactly one of them is allowed).
EXCLUSIVE = {
    ("source", "path"): ("repo", "revision"),
    ("draft.source", "path"): ("repo", "revision"),
    ("draft", "gguf"): ("source", "quants"),
    ("draft", "mtp"): ("source", "quants"),
}
# Keys that only go with others: tested with them.
COMPANIONS = {("gates[]", "max_ctx"): {"ctx": "long", "chunks": 1}}
# Keys the parser checks but does not keep (a pin): tested by refusing a wrong value instead.
PINS = {("awq", "calibration_sha256"), ("imatrix", "calibration_sha256"), ("sensitivity", "text_sha256")}
# Attribute of the parsed object that holds a key, where it is not the key's own name.
ATTRS = {("", "gates"): "eval_sets"}


def _index(path: str, key: str) -> int:
    return [f.key for f in section(path).fields].index(key)


def _placeholder_value(key: str) -> str:
    if key == "<eval set name>":
        return minimal_mapping("")["gates"][0]["name"]
    raise KeyError(f"no test value for the placeholder {key}: extend _placeholder_value")


def minimal_mapping(path: str) -> dict:
    """The smallest valid mapping of a section: its required keys (at their examples) and EXTRA."""
    s = section(path)
    out = {f.key: copy.deepcopy(f.example) for f in s.fields if f.default is REQUIRED}
    out.update(EXTRA.get(path, dict)())
    return out


def recipe_with(path: str, mapping: dict) -> dict:
    """A minimal recipe whose section ``path`` is ``mapping`` (parents minimal; lists of one entry), completed by
    what a mix and a `sensitivity:` section need of each other (:func:`_with_mix`)."""
    recipe = minimal_mapping("")
    if not path:
        return _with_mix({**recipe, **mapping})
    node = recipe
    parts = path.split(".")
    for i, part in enumerate(parts):
        value = mapping if i == len(parts) - 1 else minimal_mapping(".".join(parts[:i + 1]))
        node[part.removesuffix("[]")] = [value] if part.endswith("[]") else value
        node = value
    return _with_mix(recipe)


MIX = {"type": "mix", "label": "Q4_K_M_MIX", "budget": {"size_of": "Q4_K_M"}}


def _with_mix(recipe: dict) -> dict:
    """A quant with a mix key is a mix (`type: mix`, a label, one of budget / target) and brings a `sensitivity:`;
    a `sensitivity:` brings a mix quant (the parser refuses either alone)."""
    quants = recipe.get("quants", [])
    for q in quants:
        if isinstance(q, dict) and any(k in q for k in ("label", "budget", "target", "candidates")):
            q["type"] = "mix"
            q.setdefault("label", MIX["label"])
            if "target" not in q:
                q.setdefault("budget", MIX["budget"])
    if any(isinstance(q, dict) and q.get("type") == "mix" for q in quants):
        recipe.setdefault("sensitivity", copy.deepcopy(section("sensitivity").fields[0].example and
                                                       {"text": section("sensitivity").fields[0].example}))
    elif "sensitivity" in recipe:
        recipe["quants"] = [*quants, dict(MIX)]
    return recipe


def parsed(recipe, path: str):
    """The parsed object of section ``path`` (the first entry of a list)."""
    obj = recipe
    for part in path.split(".") if path else []:
        name = part.removesuffix("[]")
        obj = getattr(obj, ATTRS.get(("", name), name) if obj is recipe else name)
        if part.endswith("[]"):
            obj = obj[0]
    return obj


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)


@pytest.fixture
def recipes_dir(tmp_path) -> Path:
    """tmp/recipes/, with every relative file the table's examples name (../data/*.txt, ../drafts/*.gguf)."""
    folder = tmp_path / "recipes"
    folder.mkdir()
    for s in SECTIONS:
        for f in s.fields:
            for v in _strings(f.example):
                if not v.startswith("../"):
                    continue
                p = (folder / v).resolve()
                p.parent.mkdir(parents=True, exist_ok=True)
                if p.suffix == ".gguf":  # GGUF v3 header, no tensors, no metadata
                    p.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, 0))
                elif p.suffix == ".map":  # a tensor-type map (quants[].tensor_types_file)
                    p.write_text("^blk\\.0\\.attn_v\\.weight$=q8_0\n")
                elif not p.exists():
                    p.write_text(f"{p.name}: " + "the quick brown fox jumps over the lazy dog. " * 400 + "\n")
    return folder


def write_and_load(folder: Path, recipe: dict):
    path = folder / "r.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    return load_recipe(path)  # no quantize_exe: the unit tier has no llama.cpp tools


def _fill_pins(folder: Path, mapping: dict) -> None:
    """``X_sha256`` set to the SHA256 of the file its sibling ``X`` names."""
    for k in list(mapping):
        if k.endswith("_sha256") and mapping[k] is None and k.removesuffix("_sha256") in mapping:
            mapping[k] = hashlib.sha256((folder / mapping[k.removesuffix("_sha256")]).read_bytes()).hexdigest()


def _normal(value):
    return [_normal(v) for v in value] if isinstance(value, (list, tuple)) else value


FIELDS = [(s, f) for s in SECTIONS for f in s.fields]
FIELD_IDS = [f"{s.path or 'top'}:{f.key}" for s, f in FIELDS]


def _is_plain(f: Field) -> bool:
    """A default that is a value (not "required", not a Note that depends on the rest of the recipe)."""
    return not f.placeholder and f.default is not REQUIRED and not isinstance(f.default, Note)


PLAIN = [(s, f) for s, f in FIELDS if _is_plain(f)]


def test_committed_docs_are_rendered_from_the_table():
    doc = ROOT / "docs" / "recipes.md"
    assert doc.is_file(), "docs/recipes.md is missing: run `make docs`"
    assert doc.read_text(encoding="utf-8") == recipe_docs.render(), "docs/recipes.md is out of date: run `make docs`"


def test_check_command_passes_on_the_repo():
    out = subprocess.run([sys.executable, "-m", "pipeline.recipe.docs", "--check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_check_command_fails_on_a_stale_page_and_rewrites_it(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "docs" / "recipes.md"
    monkeypatch.setattr(recipe_docs, "DOC", doc)
    assert recipe_docs.main(["--check"]) == 1  # missing
    assert recipe_docs.main([]) == 0
    assert doc.read_text(encoding="utf-8") == recipe_docs.render()
    assert [p.name for p in doc.parent.iterdir()] == ["recipes.md"]  # no temporary left
    assert recipe_docs.main(["--check"]) == 0
    doc.write_text(doc.read_text(encoding="utf-8").replace("| `bench` |", "| `benchmark` |"), encoding="utf-8")
    capsys.readouterr()
    assert recipe_docs.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [f"error: {doc} is out of date: run `make docs`"]


def test_render_is_deterministic_and_complete():
    page = recipe_docs.render()
    assert page == recipe_docs.render()
    assert (ROOT / "recipes" / "smollm2-135m.yaml").read_text(encoding="utf-8") in page  # the example, verbatim
    for s, f in FIELDS:
        assert f"| `{f.key}` |" in page, f"{s.path}:{f.key} not rendered"
    from pipeline.recipe import FAMILY_DEFAULTS, NEEDS_IMATRIX, QUANT_ALIASES

    for fam, values in FAMILY_DEFAULTS.items():
        assert f"| {fam} |" in page and " | ".join(repr(v) for v in values) in page
    assert all(f"`{a}` -> `{b}`" in page for a, b in QUANT_ALIASES.items())
    assert all(f"`{t}`" in page for t in NEEDS_IMATRIX)


@pytest.mark.parametrize("s,f", FIELDS, ids=FIELD_IDS)
def test_documented_key_is_accepted_and_read(recipes_dir, s: Section, f: Field):
    assert f.type and f.doc  # every column is filled
    mapping = minimal_mapping(s.path)
    for k in EXCLUSIVE.get((s.path, f.key), ()):
        mapping.pop(k, None)
    key = _placeholder_value(f.key) if f.placeholder else f.key
    if f.example is None and not f.key.endswith("_sha256"):
        pytest.fail(f"{s.path}:{f.key} has no example to test (and show) it with")
    mapping[key] = copy.deepcopy(f.example)
    mapping.update(COMPANIONS.get((s.path, f.key), {}))
    _fill_pins(recipes_dir, mapping)
    recipe = write_and_load(recipes_dir, recipe_with(s.path, mapping))
    if _is_plain(f) and (s.path, f.key) not in PINS and f.example != f.default:
        got = getattr(parsed(recipe, s.path), ATTRS.get((s.path, f.key), f.key))
        assert _normal(got) != _normal(f.default), f"{s.path}:{f.key}={f.example!r} left the default {f.default!r}"


@pytest.mark.parametrize("s", SECTIONS, ids=[s.path or "top" for s in SECTIONS])
def test_undocumented_key_is_refused(recipes_dir, s: Section):
    mapping = {**minimal_mapping(s.path), "bogus_key": 1}
    where = (s.path.replace("[]", "[0]") + ".bogus_key") if s.path else "bogus_key"
    with pytest.raises(RecipeError) as exc:
        write_and_load(recipes_dir, recipe_with(s.path, mapping))
    assert exc.value.path == recipes_dir / "r.yaml" and exc.value.field == where, exc.value
    assert exc.value.message.startswith("unknown key"), exc.value


@pytest.mark.parametrize("s,f", PLAIN, ids=[f"{s.path or 'top'}:{f.key}" for s, f in PLAIN])
def test_documented_default_is_the_parsers(recipes_dir, s: Section, f: Field):
    mapping = minimal_mapping(s.path)
    assert f.key not in mapping
    recipe = write_and_load(recipes_dir, recipe_with(s.path, mapping))
    obj = parsed(recipe, s.path)
    if (s.path, f.key) in PINS:  # not kept: a pin that the file does not match is refused
        assert f.default is None
        with pytest.raises(RecipeError, match="not the pinned") as exc:
            write_and_load(recipes_dir, recipe_with(s.path, {**mapping, f.key: "0" * 64}))
        assert exc.value.field == f"{s.path}.{f.key}", exc.value
        return
    attr = ATTRS.get((s.path, f.key), f.key)
    assert hasattr(obj, attr), f"{type(obj).__name__} has no attribute {attr!r} for {s.path}:{f.key}"
    got = getattr(obj, attr)
    assert _normal(got) == _normal(f.default) and type(_normal(got)) is type(_normal(f.default)), (
        f"{s.path}:{f.key}: documented default {f.default!r}, parser gives {got!r}")


def test_sections_cover_the_parsers_key_sets():
    """Every allowed-key set of the parser (pipeline/recipe/model.py, where all of them are defined) is a documented
    section's (same object of truth, and none left out)."""
    from pipeline.recipe import model as R

    sets = {name: getattr(R, name) for name in dir(R) if name.endswith("_KEYS") and isinstance(getattr(R, name), set)}
    documented = [s.keys for s in SECTIONS]
    assert sets and all(v in documented for v in sets.values()), sets
    assert R.THRESHOLDS == tuple(f.key for f in section("quants[].gates").fields if not f.placeholder)
