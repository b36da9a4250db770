"""File names that both resolvers read right (issue #16).

Two programs pick a file out of a GGUF repository by its name, and each published file must get one distinct,
truthful label from both:

- **the Hugging Face Hub** (labels shown on the repo page, ``ollama run hf.co/<repo>:<TAG>``):
  ``parseGGUFQuantLabel`` of huggingface.js, ``packages/tasks/src/gguf.ts`` of ``@huggingface/tasks`` 0.21.54
  (npm): the file name upper-cased, every non-overlapping match of ``GGUF_QUANT_RE`` =
  ``(UD-)?(<llama_ftype names in enum order, then MXFP4>)(_[A-Z]+)?``, the LAST match wins. Re-implemented by
  :func:`hub_label`; ``tests/data/hub_labels.json`` holds the real library's answers for the names the tests use
  (written by ``tests/data/hub_labels.mjs`` with node).
- **llama.cpp** ``-hf <repo>:<TAG>`` (common/download.cpp of the pinned tree): ``find_best_model``
  (download.cpp:654-690) takes the FIRST listed ``.gguf`` whose path matches the regex ``TAG[.-]``
  (case-insensitive, unanchored) among the files ``gguf_filename_is_model`` keeps (download.cpp:637-652: names
  without ``mmproj``, ``imatrix``, ``mtp-``, ``eagle3-``, ``dflash-``, ``dspark-``), skipping shards other than
  ``-00001-of-``; with no tag it tries ``Q4_K_M``, then ``Q8_0``, then the first model file. An MTP sidecar is
  found by ``find_best_sibling(files, model, "mtp-", tag)`` (download.cpp:542-606) when ``--spec-type draft-mtp``
  asks for it (common/arg.cpp:396). Re-implemented by :func:`llama_pick` and :func:`llama_pick_mtp`.

The rule (a function of the recipe only, never of build results):

- base ``<name>-<OUTTYPE>.gguf`` (label ``F16``/``BF16``); quant ``<name>-<TYPE>.gguf``; a variant
  ``<name>-<TYPE>_<VARIANT>.gguf`` with VARIANT upper-case A-Z (the Hub's ``_[A-Z]+`` stops at a digit or a
  ``-``), label ``<TYPE>_<VARIANT>`` (``Q4_K_M_IMAT``);
- the MTP draft of ``mtp: separate`` ``<name>-mtp-<OUTTYPE>_MTP.gguf``: llama.cpp's ``mtp-`` sidecar marker (it is
  never picked as a model) and the Hub label ``F16_MTP``, its own;
- a split file: the folder ``<name>-<LABEL>/`` of shards ``<name>-<LABEL>-0000i-of-0000N.gguf`` (both resolvers
  read the shards' label as the file's).

:func:`check_repo` runs both resolvers over every file a recipe publishes; the recipe parser refuses a recipe
whose names would collide, in one line naming both entries.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# GGMLFileQuantizationType of @huggingface/tasks 0.21.54 (src/gguf.ts), in declaration order: the order of the
# regex alternation (a leftmost-first alternation: Q4_0 is tried before Q4_0_4_4, Q2_K before Q2_K_S).
HUB_FILE_TYPES = (
    "F32", "F16", "Q4_0", "Q4_1", "Q4_1_SOME_F16", "Q4_2", "Q4_3", "Q8_0", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S",
    "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ2_XXS", "IQ2_XS", "Q2_K_S", "IQ3_XS",
    "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ3_M", "IQ2_S", "IQ2_M", "IQ4_XS", "IQ1_M", "BF16", "Q4_0_4_4",
    "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "MXFP4_MOE", "NVFP4", "Q1_0", "Q2_0",
    "Q2_K_XL", "Q3_K_XL", "Q4_K_XL", "Q5_K_XL", "Q6_K_XL", "Q8_K_XL",
)
HUB_FILENAME_ALIASES = ("MXFP4",)  # GGUF_QUANT_FILENAME_ALIASES, appended last
HUB_QUANT_RE = re.compile(
    "(?P<prefix>UD-)?(?P<quant>" + "|".join(HUB_FILE_TYPES + HUB_FILENAME_ALIASES) + ")(_(?P<sizeVariation>[A-Z]+))?")

# download.cpp:647-652
LLAMA_NOT_MODEL = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
LLAMA_DEFAULT_TAGS = ("Q4_K_M", "Q8_0")  # download.cpp:662
_SPLIT_RE = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.I)  # download.cpp:483
_TAG_RE = re.compile(r"[-.]([A-Z0-9_]+)$", re.I)  # download.cpp:484

VARIANT_RE = re.compile(r"^[A-Za-z]{1,24}$")
MTP_MARK = "mtp-"
MTP_SUFFIX = "_MTP"


# --------------------------------------------------------------------------- the rule


def quant_label(qtype: str, variant: str | None = None) -> str:
    """``Q4_K_M`` / ``Q4_K_M_IMAT``: the file key and the label both resolvers read."""
    return f"{qtype.upper()}_{variant.upper()}" if variant else qtype.upper()


def mtp_key(outtype: str) -> str:
    """Key of the MTP draft of ``mtp: separate``: ``mtp-F16_MTP`` (file ``<name>-mtp-F16_MTP.gguf``)."""
    return f"{MTP_MARK}{outtype.upper()}{MTP_SUFFIX}"


def label_of_key(key: str) -> str:
    """The label a file key carries: the key itself, less the ``mtp-`` marker."""
    return key[len(MTP_MARK):] if key.startswith(MTP_MARK) else key


# --------------------------------------------------------------------------- the Hub


def hub_label(path: str) -> str | None:
    """``parseGGUFQuantLabel``: the last match of GGUF_QUANT_RE in the upper-cased name (None: no label)."""
    found = [m.group(0) for m in HUB_QUANT_RE.finditer(path.upper())]
    return found[-1] if found else None


def hub_resolve(paths: Sequence[str], tag: str) -> list[str]:
    """The ``.gguf`` files the Hub labels ``tag`` (its label comparison is on upper-cased text)."""
    return [p for p in paths if p.endswith(".gguf") and hub_label(p) == tag.upper()]


# --------------------------------------------------------------------------- llama.cpp


def split_info(path: str) -> tuple[str, str, int, int] | None:
    """``get_gguf_split_info`` (download.cpp:482-510): (prefix, TAG, index, count); None for a non-.gguf."""
    if not path.endswith(".gguf"):
        return None
    prefix, index, count = path[: -len(".gguf")], 1, 1
    m = _SPLIT_RE.match(prefix)
    if m:
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    t = _TAG_RE.search(prefix)
    return prefix, (t.group(1).upper() if t else ""), index, count


def is_model_file(path: str) -> bool:
    """``gguf_filename_is_model`` (download.cpp:637-652)."""
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(k in name for k in LLAMA_NOT_MODEL)


def _first_shard_or_whole(path: str) -> bool:
    info = split_info(path)
    return info is not None and not (info[3] > 1 and info[2] != 1)


def llama_candidates(paths: Sequence[str], tag: str) -> list[str]:
    """Every file ``find_best_model`` could return for a non-empty ``tag``, in listing order (it returns the
    first)."""
    try:  # the tag is a regex to llama.cpp (std::regex(tag + "[.-]", icase), download.cpp:667): not escaped
        pattern = re.compile(tag + "[.-]", re.I)
    except re.error:  # std::regex throws: nothing is fetched
        return []
    return [p for p in paths if is_model_file(p) and pattern.search(p) and _first_shard_or_whole(p)]


def llama_pick(paths: Sequence[str], tag: str = "") -> str | None:
    """``find_best_model`` (download.cpp:654-690): what ``-hf <repo>:<tag>`` downloads first."""
    for t in ([tag] if tag else list(LLAMA_DEFAULT_TAGS)):
        found = llama_candidates(paths, t)
        if found:
            return found[0]
    if not tag:
        return next((p for p in paths if is_model_file(p) and _first_shard_or_whole(p)), None)
    return None


def _leading_bits(tag: str) -> int:
    """``std::stoi(tag.substr(tag.find_first_of("0123456789")))``: the digits from the first digit on; 0 without."""
    m = re.search(r"[0-9]+", tag)
    if m and int(m.group(0)) > 2**31 - 1:
        raise OverflowError(f"std::stoi throws on {m.group(0)}")
    return int(m.group(0)) if m else 0


def _quant_bits(path: str) -> int:
    """``extract_quant_bits`` (download.cpp:513-522)."""
    info = split_info(path)
    return _leading_bits(info[1]) if info else 0


def llama_pick_mtp(paths: Sequence[str], model: str, tag: str = "") -> str | None:
    """``find_best_sibling(files, model, "mtp-", tag)`` (download.cpp:542-606): the MTP sidecar that
    ``--spec-type draft-mtp`` downloads beside ``model``."""
    tag_u = tag.upper()
    try:
        return _pick_mtp(paths, model, tag_u)
    except OverflowError:  # llama.cpp's std::stoi throws: nothing is fetched
        return None


def _pick_mtp(paths: Sequence[str], model: str, tag_u: str) -> str | None:
    model_bits = _leading_bits(tag_u) if tag_u else _quant_bits(model)
    model_dir = model.split("/")[:-1]
    best, best_key = None, None
    for f in paths:
        if not f.endswith(".gguf") or MTP_MARK not in f:
            continue
        sib_dir = f.split("/")[:-1]
        depth = 0
        while depth < min(len(model_dir), len(sib_dir)) and model_dir[depth] == sib_dir[depth]:
            depth += 1
        if depth != len(sib_dir):  # the sibling's folder must be a prefix of the model's
            continue
        exact = bool(tag_u) and f"-{tag_u}." in f.upper()
        diff = abs(_quant_bits(f) - model_bits)
        key = (depth, exact, -diff)
        if best_key is None or key > best_key:
            best, best_key = f, key
    return best


# --------------------------------------------------------------------------- one repository


@dataclass(frozen=True)
class Published:
    """One published model file (set): its label, where it came from in the recipe, and its paths in the repo
    (one, or the shards of a split file in order)."""

    label: str
    entry: str  # e.g. "quants[1]", "the base file", "the MTP draft"
    paths: tuple[str, ...]
    sidecar: bool = False  # the MTP draft: never a model for llama.cpp


def check_repo(files: Sequence[Published]) -> list[str]:
    """Problems (one line each) with the names of one repository: every file must be read with its own label by
    the Hub, and picked by llama.cpp's ``-hf <repo>:<LABEL>`` (sidecars: never picked as a model, and found as
    the MTP sidecar). The listing order is the Hub's (sorted paths); a label that matches two entries is a
    collision whatever the order."""
    listing = sorted(p for f in files for p in f.paths)
    owner = {p: f for f in files for p in f.paths}
    problems: list[str] = []
    seen: dict[str, Published] = {}
    for f in files:
        if f.label in seen:
            problems.append(f"{seen[f.label].entry} and {f.entry} are both published as {f.label}")
            continue
        seen[f.label] = f
    for f in files:
        for p in f.paths:
            got = hub_label(p)
            if got != f.label:
                problems.append(f"{f.entry}: the Hub reads {p} as {got or 'no label'}, not {f.label}")
                break
        others = {owner[p].entry for p in hub_resolve(listing, f.label)} - {f.entry}
        if others:
            problems.append(f"{f.entry} and {sorted(others)[0]} both carry the Hub label {f.label}")
        if f.sidecar:
            if any(is_model_file(p) for p in f.paths):
                problems.append(f"{f.entry}: llama.cpp would take {f.paths[0]} for a model (no `mtp-` in the name)")
            for m in files:
                if not m.sidecar and llama_pick_mtp(listing, m.paths[0], m.label) != f.paths[0]:
                    problems.append(f"{f.entry}: llama.cpp's `-hf <repo>:{m.label} --spec-type draft-mtp` does not "
                                    f"fetch {f.paths[0]} beside {m.paths[0]}")
                    break
            continue
        cands = [p for p in llama_candidates(listing, f.label) if p not in f.paths]
        if cands:
            problems.append(f"{f.entry} and {owner[cands[0]].entry if cands[0] in owner else cands[0]} both match "
                            f"llama.cpp's `-hf <repo>:{f.label}` ({f.paths[0]}, {cands[0]})")
        elif llama_pick(listing, f.label) != f.paths[0]:
            problems.append(f"{f.entry}: llama.cpp's `-hf <repo>:{f.label}` does not pick {f.paths[0]}")
    return problems
