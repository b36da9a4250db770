"""Recipes: ``recipes/<name>.yaml``, one schema, validated in one place.

Every error is one line naming the recipe file and the field, e.g.::

    recipes/foo.yaml: quants[2].type: unknown quant type 'Q4_Z' (llama-quantize b11312 accepts ...)

Every key, with its type and default, is declared once in :mod:`pipeline.recipe.schema` (the allowed-key
sets of ``model`` are taken from it; keys not listed there are refused) and documented in ``docs/recipes.md``,
which ``make docs`` (``python -m pipeline.recipe.docs``) renders from it.

With ``awq:``, the published base file (``<name>-F16.gguf``) is still the unmodified model: it is the
reference every quant's gates are measured against, AWQ quants included. The AWQ-scaled base is an
intermediate under ``work/``. Plain and calibrated flavours of one type coexist through variants.
"""

from __future__ import annotations

# The package's API (modules: ``model`` what a recipe is, ``parse`` one parser per section, ``quant_types``,
# ``load`` the entry points); everything else is imported from its module.
from pipeline.recipe.load import load_recipe, load_recipes
from pipeline.recipe.model import (
    COMMIT_RE,
    FAMILY_DEFAULTS,
    IMATRIX_DEFAULT_FAMILIES,
    MIN_SCORED_TOKENS,
    NEEDS_IMATRIX,
    NOT_QUANTS,
    QUANT_ALIASES,
    THRESHOLDS,
    AwqConfig,
    Conformance,
    Draft,
    EvalSet,
    ImatrixConfig,
    Publish,
    Quant,
    Recipe,
    Source,
    Split,
    default_thresholds,
    quant_family,
    scored_tokens,
)
from pipeline.recipe.quant_types import file_types_in_source, gguf_file_types, key_ref, known_quant_types

__all__ = [
    "COMMIT_RE", "FAMILY_DEFAULTS", "IMATRIX_DEFAULT_FAMILIES", "MIN_SCORED_TOKENS", "NEEDS_IMATRIX", "NOT_QUANTS",
    "QUANT_ALIASES", "THRESHOLDS", "AwqConfig", "Conformance", "Draft", "EvalSet", "ImatrixConfig", "Publish",
    "Quant", "Recipe", "Source", "Split", "default_thresholds", "file_types_in_source", "gguf_file_types", "key_ref",
    "known_quant_types", "load_recipe", "load_recipes", "quant_family", "scored_tokens",
]
