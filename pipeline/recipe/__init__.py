"""Recipes: ``recipes/<name>.yaml``, one schema, validated in one place.

Every error is one line naming the recipe file and the field, e.g.::

    recipes/foo.yaml: quants[2].type: unknown quant type 'Q4_Z' (llama-quantize b11312 accepts ...)

Every key, with its type and default, is declared once in :mod:`pipeline.recipe.schema` (the allowed-key
sets below are taken from it; keys not listed there are refused) and documented in ``docs/recipes.md``,
which ``make docs`` (``python -m pipeline.recipe.docs``) renders from it.

With ``awq:``, the published base file (``<name>-F16.gguf``) is still the unmodified model: it is the
reference every quant's gates are measured against, AWQ quants included. The AWQ-scaled base is an
intermediate under ``work/``. Plain and calibrated flavours of one type coexist through variants.
"""

from __future__ import annotations

from pipeline.recipe.load import (  # noqa: F401
    load_recipe,
    load_recipes,
)
from pipeline.recipe.model import (  # noqa: F401
    AWQ_KEYS,
    AWQ_VERSIONS,
    COMMIT_RE,
    CONFORMANCE_KEYS,
    DRAFT_KEYS,
    EVAL_KEYS,
    EVAL_NAME_RE,
    FAMILY_DEFAULTS,
    IMATRIX_DEFAULT_FAMILIES,
    IMATRIX_KEYS,
    MIN_SCORED_TOKENS,
    MTP_MODES,
    NAME_RE,
    NEEDS_IMATRIX,
    NOT_QUANTS,
    OUTTYPES,
    PUBLISH_KEYS,
    QUANT_ALIASES,
    QUANT_KEYS,
    REPO_PATH_RE,
    REPO_RE,
    REVISION_RE,
    SHA256_RE,
    SOURCE_KEYS,
    SPLIT_KEYS,
    SPLIT_SIZE_RE,
    SPLIT_UNITS,
    TENSOR_TYPE_RE,
    THRESHOLDS,
    TOP_KEYS,
    VARIANT_RE,
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
from pipeline.recipe.parse import (  # noqa: F401
    _calibration,
    _check_quant_type,
    _Ctx,
    _file_sha256,
    _file_sha256_cached,
    _integer,
    _parse_awq,
    _parse_conformance,
    _parse_draft,
    _parse_eval_sets,
    _parse_imatrix,
    _parse_publish,
    _parse_quant,
    _parse_quant_gates,
    _parse_quants,
    _parse_source,
    _parse_split,
    _text_path,
    _thresholds,
)
from pipeline.recipe.quant_types import (  # noqa: F401
    file_types_in_source,
    gguf_file_types,
    key_ref,
    known_quant_types,
)
