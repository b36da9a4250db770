"""Render the recipe reference ``docs/recipes.md`` from the schema table (pipeline/recipe/schema.py).

``python -m pipeline.recipe.docs`` (``make docs``) writes the page; ``--check`` exits 1 when the committed
page differs from what the table renders now. The family thresholds, quant aliases and imatrix rules come
from pipeline/recipe/'s constants, and the example is the demo recipe's text read at render time, so
none of them can drift from the code.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from pipeline import recipe as R
from pipeline.fsutil import write_text_atomic
from pipeline.gguf import FILE_TYPES
from pipeline.recipe.schema import REQUIRED, SECTIONS, Note, Section
from pipeline.tools import PINNED_BUILD

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "recipes.md"
EXAMPLE = ROOT / "recipes" / "smollm2-135m.yaml"

# Placeholders the schema's texts may use, filled from the parser's constants.
def _or(items) -> str:
    items = [f"`{i}`" for i in items]
    return ", ".join(items[:-1]) + " or " + items[-1] if len(items) > 1 else "".join(items)


FACTS = {
    "{imatrix_families}": _or(R.IMATRIX_DEFAULT_FAMILIES),
    "{min_scored_tokens}": str(R.MIN_SCORED_TOKENS),
}
_BARE_NUMBER_RE = re.compile(r"^(int|number)( (>=|>) [0-9.]+| [0-9.]+\.\.[0-9.]+|, [0-9]+ to [0-9]+| 1\.\.64)?$")
_PLAIN_RE = re.compile(r"^[A-Za-z_./][A-Za-z0-9_./-]*$")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}


def _fill(text: str) -> str:
    for k, v in FACTS.items():
        text = text.replace(k, v)
    return text


def yaml_flow(value: Any) -> str:
    """``value`` as one line of YAML (flow style), quoting strings a YAML reader would take for another type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if _PLAIN_RE.match(value) and value.lower() not in _YAML_WORDS:
            return value
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_flow(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_flow(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no YAML rendering for {value!r}")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_default(default: Any) -> str:
    if default is REQUIRED:
        return "**required**"
    if isinstance(default, Note):
        return _fill(str(default))
    if default is None:
        return "none"
    return f"`{yaml_flow(default)}`"


def render_type(f) -> str:
    """The type a user reads, with the range the parser checks (pipeline/bounds.py) where the field is numeric."""
    if f.range is None:
        return f.type
    if isinstance(f.range, dict):
        return f"{f.type}; " + "; ".join(f"`{k}`: {r.describe()}" for k, r in f.range.items())
    if _BARE_NUMBER_RE.match(f.type):  # "int >= 16": the range says it, with the upper bound
        return f.range.describe()
    return f"{f.type}; {'each ' if f.type.startswith('list') else ''}{f.range.describe()}"


def render_section(s: Section) -> list[str]:
    lines = [f"## {s.title}", "", _fill(s.intro), "",
             "| key | type | default | meaning |", "|---|---|---|---|"]
    for f in s.fields:
        meaning = _fill(f.doc)
        if f.example is not None:
            meaning += f" Example: `{yaml_flow(f.example)}`."
        lines.append("| " + " | ".join(_cell(c) for c in (f"`{f.key}`", render_type(f), render_default(f.default),
                                                            meaning)) + " |")
    return lines + [""]


def family_types() -> dict[str, list[str]]:
    """The quant types of the pinned llama.cpp (pipeline.gguf.types.FILE_TYPES, in its order) grouped by
    recipe.quant_family: the rule the parser applies, not a retyped list."""
    out: dict[str, list[str]] = {fam: [] for fam in R.FAMILY_DEFAULTS}
    for t in FILE_TYPES.values():
        if t in R.NOT_QUANTS or t == "GUESSED":
            continue
        out[R.quant_family(t)].append(t)
    return out


def render_families() -> list[str]:
    types = family_types()
    lines = ["## Default thresholds per quant family", "",
             "Every threshold that neither the eval set nor the quant sets takes the default of the quant type's "
             "family. They are set for small (0.1-2B) models, which lose more to a given type than 7B+ models: "
             "generous enough for a healthy quant of a small model, tight enough to catch a broken one.", "",
             f"| family | types (llama.cpp b{PINNED_BUILD}) | " + " | ".join(R.THRESHOLDS) + " |",
             "|---|---|" + "---|" * len(R.THRESHOLDS)]
    for fam, values in R.FAMILY_DEFAULTS.items():
        names = ", ".join(f"`{t}`" for t in types[fam]) or "-"
        lines.append(f"| {fam} | {names} | " + " | ".join(repr(v) for v in values) + " |")
    return lines + [""]


def render_quant_rules() -> list[str]:
    aliases = ", ".join(f"`{a}` -> `{b}`" for a, b in R.QUANT_ALIASES.items())
    needs = ", ".join(f"`{t}`" for t in sorted(R.NEEDS_IMATRIX))
    not_quants = ", ".join(f"`{t}`" for t in sorted(R.NOT_QUANTS))
    families = _or(R.IMATRIX_DEFAULT_FAMILIES)
    return [
        "## Quant types", "",
        "- A quant's type is upper-cased, and llama-quantize's aliases are resolved so that file names and the "
        f"type read back agree: {aliases}.",
        f"- {not_quants} are not quantizations and are refused in `quants` (the unquantized file comes from "
        "`outtype`).",
        "- The type must be one the installed `gguf` Python package can name (the result is read back with it), "
        "and, when the recipe is loaded with llama.cpp's tools (a build, `ggufpipe validate`), one that "
        "`llama-quantize` accepts.",
        f"- Types llama.cpp only makes with an importance matrix: {needs}. They are refused unless the quant uses "
        "the recipe's `imatrix:` (`imatrix: false` on such a quant is refused too).",
        f"- With an `imatrix:` section, quants of the families {families} use it by default; with an `awq:` "
        "section, every quant is made from the AWQ-scaled base by default.",
        "- Files: the base is `<name>-<OUTTYPE>.gguf` (`<name>-F16.gguf`), each quant `<name>-<TYPE>[_<VARIANT>].gguf`, "
        "and with `mtp: separate` the MTP draft `<name>-mtp-<OUTTYPE>_MTP.gguf`, all in `artifacts/<name>/`; a split "
        "file is a folder `<name>-<KEY>/` of shards `<name>-<KEY>-0000i-of-0000N.gguf` (KEY: `TYPE[_VARIANT]`, the "
        "file's label). Two quants with the same key are refused: give one a `variant`; so is a recipe whose names "
        "the Hub or llama.cpp's `-hf` would read to the wrong file ([publishing](publishing.md#file-names)). A "
        "`draft.source` draft is the recipe `<name>-draft`, in `artifacts/<name>-draft/`.",
        "",
    ]


def render_example() -> list[str]:
    rel = EXAMPLE.relative_to(ROOT).as_posix()
    text = EXAMPLE.read_text(encoding="utf-8")
    return ["## A complete example", "",
            f"`{rel}`, the full showcase that `make demo-full` builds (relative paths are relative to the recipe "
            "file; `make demo` builds the newcomer's `recipes/quick/smollm2-135m-quick.yaml`):", "",
            "```yaml", text.rstrip("\n"), "```", ""]


def render() -> str:
    """The whole page; deterministic (no dates, the table's own order)."""
    lines = [
        "# Recipe reference", "",
        "<!-- Generated file: do not edit. Edit pipeline/recipe/schema.py and run `make docs`. -->", "",
        "This page is generated by `make docs` (`python -m pipeline.recipe.docs`) from the schema table in "
        "`pipeline/recipe/schema.py`, the same table `pipeline/recipe/` takes its allowed keys from; do not "
        "edit it by hand.", "",
        "A recipe is one YAML file `recipes/<name>.yaml` per model. It is validated when the Snakefile, the CLI or "
        "`ggufpipe validate` load it: an unknown key, a bad value or a missing field gives one line naming the "
        "file and the field, e.g.", "",
        "```",
        f"error: recipes/foo.yaml: quants[2].type: unknown quant type 'Q4_Z' (llama-quantize b{PINNED_BUILD} "
        "accepts: ...)",
        "```", "",
        "Relative paths (`text`, `calibration`, `eval_text`, `gguf`, `source.path`) are relative to the recipe "
        "file. A default of *none* means the key is unset: the feature is off, or the value is not used.", "",
    ]
    for s in SECTIONS:
        lines += render_section(s)
    lines += render_families()
    lines += render_quant_rules()
    lines += render_example()
    page = "\n".join(lines).rstrip("\n") + "\n"
    leftover = re.search(r"\{[a-z_]+\}", page.replace(EXAMPLE.read_text(encoding="utf-8"), ""))
    if leftover:
        raise RuntimeError(f"unfilled placeholder {leftover.group(0)} in the schema texts")
    return page


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.recipe.docs", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/recipes.md differs from the rendering")
    args = ap.parse_args(argv)
    text = render()
    rel = DOC.relative_to(ROOT).as_posix() if DOC.is_relative_to(ROOT) else str(DOC)
    if args.check:
        try:
            current = DOC.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            current = None
        if current != text:
            print(f"error: {rel} is out of date: run `make docs`", file=sys.stderr)
            return 1
        return 0

    write_text_atomic(DOC, text)  # a temporary file beside it, then os.replace
    print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
