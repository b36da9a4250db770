"""The vocabulary facts llama.cpp derives from a GGUF's metadata, computed without llama.cpp.

This mirrors ``llama_vocab::impl::load`` in ``src/llama-vocab.cpp`` of the pinned llama.cpp (build b11312,
commit 0c1e570, vendored by llama-cpp-python 0.3.36), as far as it decides the values that
``common_speculative_are_compatible`` (``common/speculative.cpp``) compares between a target and a draft
model: the vocab type (``llama_vocab_type``), ``llama_vocab_get_add_bos`` / ``llama_vocab_bos``,
``llama_vocab_get_add_eos`` / ``llama_vocab_eos`` and ``llama_vocab_n_tokens``. In order, llama.cpp:

1. maps ``tokenizer.ggml.model`` to a vocab type and default special token ids (``no_vocab``/``none``
   stop there: no BOS/EOS, no add flags, ``<arch>.vocab_size`` dummy tokens);
2. for BPE vocabs, maps ``tokenizer.ggml.pre`` to a pre-tokenizer, some of which change the defaults
   (``llama3``-like, ``tekken`` and ``chameleon`` turn add_bos on; ``chatglm-bpe``, ``glm4`` and ``glm5``
   drop the default BOS id); other vocab types get fixed per-type add_bos/add_eos defaults;
3. counts ``tokenizer.ggml.tokens``;
4. disables a default special id that lies outside the vocab, then takes ``tokenizer.ggml.bos_token_id`` /
   ``eos_token_id`` when present and inside the vocab (an out-of-range id in the file keeps the default);
5. takes ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` when present, and finally forces add_bos on
   for the Gemma 4 pre-tokenizer (``gemma4`` and ``granite-embed-multi-311m``) even if the file says false.

Where llama.cpp refuses a file while doing this (unknown tokenizer or pre-tokenizer, a key of the wrong
GGUF type, missing tokens or merges, duplicate token texts...), :func:`effective_vocab` raises
``ValueError`` with llama.cpp's message instead of returning values llama.cpp would never use.

:func:`eog_set` / :func:`eog_ids` go on to the end-of-generation set (``llama_vocab_is_eog``): the EOT, EOM and
FIM special ids (keys, then llama.cpp's detection by token text), the fixed list of EOG token texts, the EOS/EOT/EOM
insertion and the two removals (``<|end|>`` for gpt-oss-like vocabs, ``</s>`` beside ``<|tool_response>`` /
``<|plamo:eos|>``). Where the result depends on the iteration order of llama.cpp's ``std::unordered_map`` (two
token texts that could fill the same FIM id), it says so instead of guessing.

GGUF metadata is read by the project's one GGUF reader (:func:`pipeline.gguf.read_header`, given a path or
a parsed header): llama.cpp's checks only need the array types and lengths, and the token texts, which it
decodes on demand (gguf-py's GGUFReader decodes every array element and takes seconds on a 256k-token vocabulary).
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.gguf import ArrayValue, GGUFHeader, read_header
from pipeline.gguf.types import ARRAY, BOOL, FLOAT32, INT8, INT32, STRING, UINT8, UINT32, VALUE_TYPE_NAMES

__all__ = ["VOCAB_TYPES", "BPE_PRE_TOKENIZERS", "BPE_PRE_NAMES", "EogSet", "UndeterminedEog", "effective_vocab",
           "eog_ids", "eog_set"]

# enum llama_vocab_type (include/llama.h), in enum order: LLAMA_VOCAB_TYPE_NONE = 0 ... LLAMA_VOCAB_TYPE_TEST = 7.
VOCAB_TYPES = ("none", "spm", "bpe", "wpm", "ugm", "rwkv", "plamo2", "test")

# tokenizer.ggml.model -> (vocab type, default special_bos_id, default special_eos_id); None = LLAMA_TOKEN_NULL.
# Mirrors the "determine vocab type" chain at the top of llama_vocab::impl::load. "no_vocab"/"none" are
# handled apart (early return); "gemma4" also overrides tokenizer.ggml.pre with "gemma4".
_TOKENIZER_MODELS: dict[str, tuple[str, int | None, int | None]] = {
    "llama": ("spm", 1, 2),
    "bert": ("wpm", 101, None),
    "gpt2": ("bpe", 11, 11),
    "hybriddna": ("bpe", 11, 11),
    "whitespace": ("bpe", 11, 11),
    "t5": ("ugm", None, 1),
    "rwkv": ("rwkv", None, None),
    "test": ("test", None, None),
    "plamo2": ("plamo2", 1, 2),
    "gemma4": ("bpe", None, None),
}
_NO_VOCAB_MODELS = ("no_vocab", "none")
# Tokenizer models whose BPE merges must be present (gpt2-like ones may omit them for pre "kimi-k2").
_BPE_MERGES_MODELS = ("gpt2", "hybriddna", "whitespace", "gemma4")

# Flags llama_vocab::impl starts from (member initialisers in src/llama-vocab.cpp).
_IMPL_DEFAULT_FLAGS: dict[str, bool] = {
    "add_space_prefix": False,
    "add_bos": False,
    "add_eos": False,
    "add_sep": False,
    "ignore_merges": False,
    "clean_spaces": False,
    "escape_whitespaces": True,
    "lowercase": True,
}
# What every BPE vocab sets before looking at its pre-tokenizer.
_BPE_BASE_FLAGS: dict[str, bool] = {"add_space_prefix": False, "escape_whitespaces": False, "clean_spaces": True}
# The non-BPE branches after the pre-tokenizer chain ("plamo2" and "test" keep the member defaults).
_VOCAB_TYPE_FLAGS: dict[str, dict[str, bool]] = {
    "spm": {"add_space_prefix": True, "clean_spaces": False, "add_bos": True, "add_eos": False},
    "wpm": {"add_space_prefix": False, "clean_spaces": True, "add_bos": True, "add_eos": False, "add_sep": True},
    "ugm": {"add_bos": False, "add_eos": True},
    "rwkv": {"add_space_prefix": False, "clean_spaces": False, "add_bos": False, "add_eos": False},
}

# BPE pre-tokenizers known to b11312: (LLAMA_VOCAB_PRE_TYPE_* lower-cased, tokenizer.ggml.pre values, flag
# changes). Mirrors the `if (type == LLAMA_VOCAB_TYPE_BPE)` else-if chain on tokenizer_pre in
# llama_vocab::impl::load (src/llama-vocab.cpp), in its order; a missing/empty tokenizer.ggml.pre means
# "default", any value not listed here makes llama.cpp refuse the model. Flag changes use the impl member
# names; "bos_id": None is `special_bos_id = LLAMA_TOKEN_NULL`, "lowercase" is normalizer_opts.lowercase.
BPE_PRE_TOKENIZERS: tuple[tuple[str, tuple[str, ...], Mapping[str, Any]], ...] = (
    ("default", ("default",), {}),
    ("minicpm5", ("minicpm5",), {"ignore_merges": True}),
    ("llama3", ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                "jina-v5-nano"), {"ignore_merges": True, "add_bos": True}),
    ("deepseek_llm", ("deepseek-llm",), {"clean_spaces": False}),
    ("deepseek_coder", ("deepseek-coder",), {"clean_spaces": False}),
    ("deepseek3_llm", ("deepseek-v3",), {"clean_spaces": False}),
    ("spark2_5", ("spark2_5",), {"clean_spaces": False}),
    ("youtu", ("youtu",), {"clean_spaces": False, "ignore_merges": True}),
    ("falcon", ("falcon",), {}),
    ("mpt", ("mpt",), {}),
    ("starcoder", ("starcoder",), {}),
    ("gpt2", ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
              "modern-bert"), {}),
    ("jais2", ("jais-2",), {}),
    ("gemma4", ("gemma4", "granite-embed-multi-311m"), {"escape_whitespaces": True}),
    ("sarvam_moe", ("sarvam-moe",), {"escape_whitespaces": True, "clean_spaces": False}),
    ("gpt2", ("jina-v1-en", "jina-v2-code", "roberta-bpe"), {"add_sep": True}),
    ("whitespace", ("whitespace",), {"lowercase": False}),
    ("refact", ("refact",), {}),
    ("command_r", ("command-r",), {"clean_spaces": False}),
    ("qwen2", ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"), {"clean_spaces": False}),
    ("qwen35", ("qwen35",), {"clean_spaces": False}),
    ("stablelm2", ("stablelm2",), {}),
    ("olmo", ("olmo",), {}),
    ("dbrx", ("dbrx",), {}),
    ("smaug", ("smaug-bpe",), {}),
    ("poro", ("poro-chat",), {"clean_spaces": False}),
    ("chatglm4", ("chatglm-bpe",), {"bos_id": None}),
    ("chatglm4", ("glm4", "glm5"), {"bos_id": None, "ignore_merges": True}),
    ("viking", ("viking",), {"clean_spaces": False}),
    ("jais", ("jais",), {}),
    ("tekken", ("tekken",), {"clean_spaces": False, "ignore_merges": True, "add_bos": True}),
    ("smollm", ("smollm",), {"clean_spaces": False}),
    ("codeshell", ("codeshell",), {}),
    ("bloom", ("bloom",), {}),
    ("gpt3_finnish", ("gpt3-finnish",), {}),
    ("exaone", ("exaone",), {}),
    ("gpt2", ("exaone4",), {}),
    ("exaone_moe", ("exaone-moe",), {}),
    ("chameleon", ("chameleon",), {"add_bos": True, "clean_spaces": False}),
    ("minerva", ("minerva-7b",), {}),
    ("qwen2", ("megrez",), {}),
    ("gpt4o", ("gpt-4o", "llama4", "kanana2", "talkie"), {"clean_spaces": False}),
    ("granite_emb_multi", ("granite-embed-multi-97m",), {"clean_spaces": False, "ignore_merges": True}),
    ("tiny_aya", ("tiny_aya", "cohere2moe"), {"clean_spaces": False}),
    ("superbpe", ("superbpe",), {"clean_spaces": False}),
    ("trillion", ("trillion",), {"clean_spaces": False}),
    ("granite_docling", ("granite-docling",), {"clean_spaces": False}),
    ("bailingmoe", ("bailingmoe", "bailingmoe2", "llada-moe"), {"clean_spaces": False}),
    ("seed_coder", ("seed-coder",), {"clean_spaces": False}),
    ("hunyuan", ("hunyuan",), {"clean_spaces": False}),
    ("hunyuan_dense", ("hunyuan-dense",), {"clean_spaces": False}),
    ("hy_v4", ("hy_v4",), {"clean_spaces": False}),
    ("joyai_llm", ("joyai-llm",), {"clean_spaces": False}),
    ("kimi_k2", ("kimi-k2",), {"clean_spaces": False}),
    ("ufakzeka", ("ufakzeka",), {"clean_spaces": False}),
    ("grok_2", ("grok-2",), {"clean_spaces": False}),
    ("afmoe", ("afmoe",), {"clean_spaces": False}),
    ("laguna", ("laguna",), {"clean_spaces": False}),
    ("minimax_m2", ("minimax-m2",), {"clean_spaces": False}),
    ("solar_open", ("solar-open",), {"clean_spaces": False}),
    ("mellum2", ("mellum2",), {}),
)
_PRE_BY_NAME: dict[str, tuple[str, Mapping[str, Any]]] = {
    name: (pre_type, flags) for pre_type, names, flags in BPE_PRE_TOKENIZERS for name in names
}
BPE_PRE_NAMES = frozenset(_PRE_BY_NAME)  # every tokenizer.ggml.pre value a BPE vocabulary may carry
# After tokenizer.ggml.add_bos_token is read: "workaround for Gemma 4" (llama.cpp PR 21500).
_FORCE_ADD_BOS_PRE_TYPES = ("gemma4",)

# GGUF value types: the one table (pipeline/gguf/types.py).
_UINT8, _INT8, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY = UINT8, INT8, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY
_TYPE_NAMES = VALUE_TYPE_NAMES

# Keys llama.cpp reads here with get_key<uint32_t> (a present key of another type fails the load).
_SPECIAL_ID_KEYS = tuple(f"tokenizer.ggml.{k}" for k in (
    "bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id", "unknown_token_id", "seperator_token_id",
    "padding_token_id", "mask_token_id", "fim_pre_token_id", "fim_suf_token_id", "fim_mid_token_id",
    "fim_pad_token_id", "fim_rep_token_id", "fim_sep_token_id", "prefix_token_id", "suffix_token_id",
    "middle_token_id"))
# Keys read with get_key<bool> before the tokens, and after the special token ids.
_PRE_TOKENS_BOOL_KEYS = ("tokenizer.ggml.add_space_prefix", "tokenizer.ggml.remove_extra_whitespaces")
_POST_IDS_BOOL_KEYS = ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_sep_token",
                       "tokenizer.ggml.normalizer.lowercase", "tokenizer.ggml.normalizer.strip_accents")

_TOKENS = "tokenizer.ggml.tokens"
_CHARSMAP = "tokenizer.ggml.precompiled_charsmap"
# arrays whose elements are kept (the rest are only measured): what the vocab checks compare
_KEEP_STRINGS = {_TOKENS, "tokenizer.ggml.merges"}
_KEEP_RAW = {_CHARSMAP, "tokenizer.ggml.token_type"}


@dataclass(frozen=True)
class _Array:
    """A GGUF array value: element type, length, and (only for the keys that need them) its elements."""

    elem_type: int
    count: int
    strings: list[bytes] | None = None  # the elements of a string array that was asked for
    raw: bytes | None = None  # the data of a numeric array that was asked for


@dataclass(frozen=True)
class _KV:
    type: int  # the GGUF type; _ARRAY for arrays
    value: Any  # Python scalar, str, or _Array


def effective_vocab(path_or_header: str | os.PathLike | Any) -> dict[str, Any]:
    """The vocabulary facts llama.cpp b11312 derives when it loads this GGUF.

    ``path_or_header`` is a GGUF path or a parsed :class:`pipeline.gguf.GGUFHeader`. Returns a dict with:

    - ``vocab_type``: ``llama_vocab_type`` as a lower-case LLAMA_VOCAB_TYPE_* name (see :data:`VOCAB_TYPES`);
    - ``n_tokens``: ``llama_vocab_n_tokens``;
    - ``bos_id`` / ``eos_id``: ``llama_vocab_bos`` / ``llama_vocab_eos``, None for LLAMA_TOKEN_NULL;
    - ``add_bos`` / ``add_eos``: ``llama_vocab_get_add_bos`` / ``llama_vocab_get_add_eos``;
    - ``model``: ``tokenizer.ggml.model``; ``pre``: ``tokenizer.ggml.pre`` as in the file, or None (for the
      tokenizer model "gemma4" llama.cpp uses the pre-tokenizer "gemma4" whatever the file says).

    Raises ValueError where llama.cpp would fail to load the vocabulary, and the reader's PipelineError (one
    line naming the file) where it is not a readable GGUF.
    """
    return _effective(_metadata(path_or_header))


def _effective(kvs: dict[str, _KV]) -> dict[str, Any]:
    model = _get(kvs, "tokenizer.ggml.model", _STRING, required=True)
    pre_key = _get(kvs, "tokenizer.ggml.pre", _STRING)
    _get(kvs, "tokenizer.ggml.token_type_count", _UINT32)
    facts: dict[str, Any] = {"vocab_type": "none", "n_tokens": 0, "bos_id": None, "eos_id": None,
                             "add_bos": False, "add_eos": False, "model": model, "pre": pre_key}

    if model in _NO_VOCAB_MODELS:
        # no tokens; `<arch>.vocab_size` dummy ones if present, nothing else is read
        arch = _get(kvs, "general.architecture", _STRING) or ""
        facts["n_tokens"] = _get(kvs, f"{arch}.vocab_size", _UINT32) or 0
        return facts
    if model not in _TOKENIZER_MODELS:
        raise ValueError(f"unknown tokenizer: '{model}'")
    vocab_type, bos_id, eos_id = _TOKENIZER_MODELS[model]
    pre = "gemma4" if model == "gemma4" else (pre_key or "")
    _check_model_arrays(kvs, model, pre)

    flags = dict(_IMPL_DEFAULT_FLAGS)
    pre_type = "default"
    if vocab_type == "bpe":
        flags.update(_BPE_BASE_FLAGS)
        if pre:
            if pre not in _PRE_BY_NAME:
                raise ValueError(f"unknown pre-tokenizer type: '{pre}'")
            pre_type, changes = _PRE_BY_NAME[pre]
            for name, value in changes.items():
                if name == "bos_id":
                    bos_id = value
                else:
                    flags[name] = value
    else:
        flags.update(_VOCAB_TYPE_FLAGS.get(vocab_type, {}))
    for key in _PRE_TOKENS_BOOL_KEYS:
        _get(kvs, key, _BOOL)

    n_tokens = _check_tokens(kvs)

    for key in _SPECIAL_ID_KEYS:  # all are read (and type-checked); only BOS and EOS matter here
        _get(kvs, key, _UINT32)
    bos_id = _special_id(kvs, "tokenizer.ggml.bos_token_id", bos_id, n_tokens)
    eos_id = _special_id(kvs, "tokenizer.ggml.eos_token_id", eos_id, n_tokens)

    for key in _POST_IDS_BOOL_KEYS:
        _get(kvs, key, _BOOL)
    add_bos = _get(kvs, "tokenizer.ggml.add_bos_token", _BOOL)
    add_eos = _get(kvs, "tokenizer.ggml.add_eos_token", _BOOL)
    if add_bos is not None:
        flags["add_bos"] = add_bos
    if add_eos is not None:
        flags["add_eos"] = add_eos
    if pre_type in _FORCE_ADD_BOS_PRE_TYPES:
        flags["add_bos"] = True
    _get_array(kvs, "tokenizer.ggml.suppress_tokens", (_INT32,))

    facts.update(vocab_type=vocab_type, n_tokens=n_tokens, bos_id=bos_id, eos_id=eos_id,
                 add_bos=bool(flags["add_bos"]), add_eos=bool(flags["add_eos"]))
    return facts


# --------------------------------------------------------------------------- end of generation
# All of llama_vocab::impl::load in src/llama-vocab.cpp of b11312 (line numbers of that file).

# Special ids found by token text when their key is absent (2686-2843): category -> texts. Only the categories that
# reach the EOG set; FIM_PRE/SUF/MID do not.
_AUTO_DETECT: dict[str, tuple[str, ...]] = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
            "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"),  # 2693-2715
    "eom": ("<|eom_id|>",),  # 2717-2729
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),  # 2794-2810
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),  # 2812-2828
    "fim_sep": ("<|file_sep|>",),  # 2830-2842
}
_SPECIAL_KEYS = {"eot": "tokenizer.ggml.eot_token_id", "eom": "tokenizer.ggml.eom_token_id",
                 "fim_pad": "tokenizer.ggml.fim_pad_token_id", "fim_rep": "tokenizer.ggml.fim_rep_token_id",
                 "fim_sep": "tokenizer.ggml.fim_sep_token_id"}
# Tokens that are EOG by their text (2888-2917).
_EOG_TEXTS = frozenset(t.encode() for t in (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["))


class UndeterminedEog(ValueError):
    """llama.cpp's EOG set for this vocab depends on the iteration order of a hash map (:attr:`EogSet.undetermined`)."""


@dataclass(frozen=True)
class EogSet:
    """The end-of-generation set llama.cpp b11312 derives for a vocab (``special_eog_ids``).

    - ``ids``: the set, ascending; None when it is undetermined;
    - ``alternatives``: every set llama.cpp can end with (one when determined);
    - ``specials``: for eos, eot, eom, fim_pad, fim_rep and fim_sep, the ids llama.cpp can end with: () for none,
      one id, or several when the id comes from text detection and more than one token text matches;
    - ``texts``: the token text of every id in the alternatives and specials;
    - ``undetermined``: one line saying why the set depends on hash-map order, else None.
    """

    ids: tuple[int, ...] | None
    alternatives: tuple[tuple[int, ...], ...]
    specials: dict[str, tuple[int, ...]]
    texts: dict[int, str]
    undetermined: str | None = None


def eog_ids(path_or_header: str | os.PathLike | Any) -> list[int]:
    """The ids for which ``llama_vocab_is_eog`` is true, ascending. Raises :class:`UndeterminedEog` where the set
    depends on hash-map order, and ValueError where llama.cpp would not load the vocabulary."""
    eog = eog_set(path_or_header)
    if eog.ids is None:
        raise UndeterminedEog(eog.undetermined)
    return list(eog.ids)


def eog_set(path_or_header: str | os.PathLike | Any) -> EogSet:
    """The end-of-generation set of this GGUF as llama.cpp b11312 derives it (:class:`EogSet`)."""
    kvs = _metadata(path_or_header)
    facts = _effective(kvs)
    name = str(path_or_header) if isinstance(path_or_header, (str, os.PathLike)) else "the GGUF"
    if facts["model"] in _NO_VOCAB_MODELS:  # load() returns before any special token (1949-1969)
        return EogSet((), ((),), {k: () for k in ("eos", *_AUTO_DETECT)}, {})
    n_tokens = facts["n_tokens"]
    # token_to_id: an empty text is stored as "[EMPTY_<id>]" (2510-2514); texts are unique (checked above)
    texts = [t or f"[EMPTY_{i}]".encode() for i, t in enumerate(_get_array(kvs, _TOKENS, (_STRING,)).strings)]
    by_text = {t: i for i, t in enumerate(texts)}

    # the ids from the keys (2592-2635: absent or out of the vocab -> the default, LLAMA_TOKEN_NULL for these),
    # then, for each one still NULL, every token whose text matches (2686-2843: the first one met in
    # token_to_id, an unordered_map, wins; several matches make the result depend on hash order)
    specials: dict[str, tuple[int, ...]] = {"eos": () if facts["eos_id"] is None else (facts["eos_id"],)}
    for what, key in _SPECIAL_KEYS.items():
        got = _special_id(kvs, key, None, n_tokens)
        if got is None:
            specials[what] = tuple(sorted(by_text[t.encode()] for t in _AUTO_DETECT[what] if t.encode() in by_text))
        else:
            specials[what] = (got,)
    by_eog_text = {i for t, i in by_text.items() if t in _EOG_TEXTS}

    def derive(choice: dict[str, int | None]) -> tuple[int, ...]:
        eog = {choice[k] for k in ("fim_pad", "fim_rep", "fim_sep")} - {None}  # 2874-2886
        eog |= by_eog_text  # 2888-2917
        eog |= {choice[k] for k in ("eos", "eot", "eom")} - {None}  # 2944-2958
        present = {texts[i]: i for i in eog}
        # 2960-3002: <|end|> is not EOG beside <|return|> and <|call|>, or <|call|>/<|calls|> and <|flush|>
        has_call = b"<|call|>" in present or b"<|calls|>" in present
        if b"<|end|>" in present and has_call and (b"<|return|>" in present or b"<|flush|>" in present):
            eog.discard(present[b"<|end|>"])
        # 3004-3032: </s> is a normal token beside <|tool_response> (gemma4) or <|plamo:eos|>
        if b"</s>" in present and (b"<|tool_response>" in present or b"<|plamo:eos|>" in present):
            eog.discard(present[b"</s>"])
        return tuple(sorted(eog))

    names = list(specials)
    alternatives: set[tuple[int, ...]] = set()
    for combo in itertools.product(*(specials[k] or (None,) for k in names)):
        alternatives.add(derive(dict(zip(names, combo, strict=True))))
    ordered = tuple(sorted(alternatives))
    shown = {i for alt in ordered for i in alt} | {i for ids in specials.values() for i in ids}
    id_texts = {i: texts[i].decode("utf-8", "replace") for i in sorted(shown)}
    undetermined = None
    if len(ordered) > 1:
        why = "; ".join(f"{k} may be " + " or ".join(f"{id_texts[i]!r} ({i})" for i in ids)
                        for k, ids in specials.items() if len(ids) > 1)
        undetermined = (f"{name}: llama.cpp's EOG set depends on the order of its token hash map ({why}): "
                        f"it is one of {' / '.join(str(list(alt)) for alt in ordered)}")
    return EogSet(ordered[0] if len(ordered) == 1 else None, ordered, specials, id_texts, undetermined)


# --------------------------------------------------------------------------- llama.cpp's load-time checks


def _check_model_arrays(kvs: dict[str, _KV], model: str, pre: str) -> None:
    """The per-tokenizer-model array checks of the "determine vocab type" block."""
    if model in _BPE_MERGES_MODELS:
        if "tokenizer.ggml.merges" not in kvs:
            if model == "gemma4" or pre != "kimi-k2":
                raise ValueError("cannot find tokenizer merges in model file")
        else:
            _get_array(kvs, "tokenizer.ggml.merges", (_STRING,))
    elif model == "t5" and _CHARSMAP in kvs:
        charsmap = _get_array(kvs, _CHARSMAP, (_INT8, _UINT8))
        data = charsmap.raw or b""
        if len(data) < 4:
            raise ValueError("precompiled_charsmap too small for xcda_blob_size header!")
        if struct.unpack_from("<I", data)[0] + 4 >= len(data):
            raise ValueError("Index out of array bounds in precompiled charsmap!")


def _special_id(kvs: dict[str, _KV], key: str, default: int | None, n_tokens: int) -> int | None:
    """A default id outside the vocab is disabled; the key's id replaces it unless it is outside the vocab."""
    if default is not None and default >= n_tokens:
        default = None
    new_id = _get(kvs, key, _UINT32)
    return new_id if new_id is not None and new_id < n_tokens else default


def _check_tokens(kvs: dict[str, _KV]) -> int:
    """Token count; the token list, scores and token types checks, and the duplicate-text assertion."""
    if _TOKENS not in kvs:
        raise ValueError("cannot find tokenizer vocab in model file")
    tokens = _get_array(kvs, _TOKENS, (_STRING,))
    n_tokens = tokens.count
    scores = _get_array(kvs, "tokenizer.ggml.scores", (_INT32, _FLOAT32))
    if scores is not None and scores.count < n_tokens:
        raise ValueError(f"Index out of array bounds for scores ({scores.count} < {n_tokens})")
    toktypes = _get_array(kvs, "tokenizer.ggml.token_type", (_INT32,))
    if toktypes is not None and toktypes.count < n_tokens:
        raise ValueError(f"Index out of array bounds for toktypes ({toktypes.count} < {n_tokens})")
    # token_to_id is keyed by text (an empty text becomes "[EMPTY_<id>]"); GGML_ASSERT(sizes equal) aborts
    texts = {t or f"[EMPTY_{i}]".encode() for i, t in enumerate(tokens.strings or ())}
    if tokens.strings is not None and len(texts) != n_tokens:
        raise ValueError(f"duplicate token texts: {n_tokens} tokens but {len(texts)} distinct texts "
                         "(llama.cpp aborts: id_to_token.size() == token_to_id.size())")
    return n_tokens


def _get(kvs: dict[str, _KV], key: str, gguf_type: int, required: bool = False) -> Any:
    """llama_model_loader::get_key: None when absent (or an error if required), an error on a wrong type."""
    kv = kvs.get(key)
    if kv is None:
        if required:
            raise ValueError(f"key not found in model: {key}")
        return None
    if kv.type != gguf_type:
        raise ValueError(f"key {key} has wrong type {_TYPE_NAMES[kv.type]} but expected type {_TYPE_NAMES[gguf_type]}")
    return kv.value


def _get_array(kvs: dict[str, _KV], key: str, elem_types: tuple[int, ...]) -> Any:
    """An array key llama.cpp checks with gguf_get_kv_type/gguf_get_arr_type: None when absent."""
    kv = kvs.get(key)
    if kv is None:
        return None
    if kv.type != _ARRAY or kv.value.elem_type not in elem_types:
        raise ValueError(f"invalid gguf type for {key}")
    return kv.value


# --------------------------------------------------------------------------- GGUF metadata


def tokenizer_metadata(path_or_header: Any) -> dict[str, Any]:
    """Tokenizer keys for the draft checks, read fast and byte-exact: token texts and merges as
    ``bytes`` (not necessarily UTF-8), token types as raw bytes, other values as Python scalars."""
    out: dict[str, Any] = {}
    for key, kv in _metadata(path_or_header).items():
        if not key.startswith("tokenizer."):
            continue
        v = kv.value
        out[key] = (v.strings if v.strings is not None else v.raw) if isinstance(v, _Array) else v
    return out


def _metadata(path_or_header: Any) -> dict[str, _KV]:
    """The metadata of a GGUF path or a parsed header (:func:`pipeline.gguf.read_header`: a malformed file
    raises its PipelineError); token texts, merges and the raw arrays the checks need are read from the file."""
    if isinstance(path_or_header, (str, os.PathLike)):
        header = read_header(path_or_header)
    elif isinstance(path_or_header, GGUFHeader):
        header = path_or_header
    else:
        raise TypeError(f"expected a GGUF path or a pipeline.gguf.GGUFHeader, got {type(path_or_header).__name__}")
    out: dict[str, _KV] = {}
    for key, value in header.metadata.items():
        vtype = header.value_types[key]
        if isinstance(value, ArrayValue):
            strings = raw = None
            if key in _KEEP_STRINGS and value.elem_type == _STRING:
                strings = header.array(key, raw_strings=True)
            elif key in _KEEP_RAW and value.elem_type != _STRING:
                raw = header.array_bytes(key)
            value = _Array(value.elem_type, value.count, strings, raw)
        out[key] = _KV(vtype, value)
    return out
