"""pipeline/recipe/naming.py's re-implementation of llama.cpp's ``-hf <repo>:<TAG>`` file choice (``llama_pick``,
``llama_candidates``, ``llama_pick_mtp``) against the real pinned tools.

Each case serves a repository from a stand-in Hub on 127.0.0.1 (tests/helpers/hf_standin.py: the refs, tree and
resolve endpoints llama.cpp's downloader reads, files listed in sorted path order unless a case gives its own)
and runs the real ``llama-tokenize -hf <repo>:<TAG>`` (``llama-speculative-simple ... --spec-type draft-mtp`` for
the MTP sidecar) with ``MODEL_ENDPOINT`` pointing there and a fresh ``LLAMA_CACHE``. What the tool downloaded
(the GETs the stand-in answered) must be what naming.py predicts: the picked file (all shards of a split file)
and, with ``--spec-type draft-mtp``, the ``mtp-`` sidecar. The bytes are no models: the tools fail after the
download, which is all these tests read."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import ROOT
from helpers.hf_standin import run_download, standin_bytes

from pipeline.recipe import naming

CALIB = "smollm2-135m-calib"
# recipes/smollm2-135m-calib.yaml under issue #16's rule (base F16, plain quants, variants imat/awq/awqimat)
NEW_LABELS = (
    "F16",
    "Q4_K_M",
    "Q4_K_M_IMAT",
    "Q4_K_M_AWQ",
    "Q4_K_M_AWQIMAT",
    "Q3_K_M",
    "Q3_K_M_IMAT",
    "Q3_K_M_AWQ",
    "Q3_K_M_AWQIMAT",
)
NEW_NAMES = [f"{CALIB}-{label}.gguf" for label in NEW_LABELS]
# the same repository before the rename: the variant after a '-', lower case
OLD_NAMES = [f"{CALIB}-F16.gguf"] + [
    f"{CALIB}-{q}{v}.gguf" for q in ("Q4_K_M", "Q3_K_M") for v in ("", "-imat", "-awq", "-awqimat")
]
# tags that are no label of these repositories, but that someone may type
NON_LABELS = (
    "",
    "q4_k_m",
    "q4_k_m_imat",
    "Q4_K",
    "Q4_K_M_",
    "IMAT",
    "imat",
    "AWQ",
    "awqimat",
    "135m",
    "calib",
    "Q8_0",
    "Q4_K_M-imat",
    "Q4_K_M.gguf",
    "F16_MTP",
    "mtp-F16",
)

HUB_LABELS = json.loads((ROOT / "tests" / "data" / "hub_labels.json").read_text())["labels"]  # the real library's


def shards(paths: list[str], first: str) -> list[str]:
    """``get_split_files`` (download.cpp:524-539): every file with the split prefix and count of ``first``."""
    prefix, _, _, count = naming.split_info(first)
    if count <= 1:
        return [first]
    return [p for p in paths if (i := naming.split_info(p)) and i[0] == prefix and i[3] == count]


def predicted(paths: list[str], tag: str, draft_mtp: bool = False) -> list[str]:
    """What naming.py says ``-hf <repo>:<tag>`` downloads from a repo listing ``paths`` (sorted)."""
    model = naming.llama_pick(paths, tag)
    out = shards(paths, model) if model else []
    if draft_mtp:
        sidecar = naming.llama_pick_mtp(paths, model or "", tag)
        if sidecar:
            out.append(sidecar)
    return sorted(out)


def downloads(toolchain, listing: list[str], tags, draft_mtp: bool = False) -> dict[str, list[str]]:
    """The real tool's downloads (sorted paths) per tag, for the repository ``listing`` (in that order)."""
    files = [(p, standin_bytes(p)) for p in listing]

    def one(tag: str) -> list[str]:
        return sorted(run_download(toolchain, files, tag, draft_mtp).fetched)

    with ThreadPoolExecutor(4) as pool:
        return dict(zip(tags, pool.map(one, tags), strict=True))


def assert_agree(toolchain, listing: list[str], tags, draft_mtp: bool = False) -> dict[str, list[str]]:
    real = downloads(toolchain, listing, tags, draft_mtp)
    wrong = {
        t: (got, predicted(listing, t, draft_mtp)) for t, got in real.items() if got != predicted(listing, t, draft_mtp)
    }
    assert not wrong, "llama.cpp (real) != naming.py: " + "; ".join(
        f"tag {t!r}: {g} != {w}" for t, (g, w) in wrong.items()
    )
    return real


def test_calib_new_names_each_label_picks_its_own_file(toolchain):
    """(1) The calibration demo's files under the new rule: every label fetches exactly its file, both resolvers
    agree on it, and no other file is a candidate."""
    listing = sorted(NEW_NAMES)
    real = assert_agree(toolchain, listing, NEW_LABELS + NON_LABELS)
    for label, name in zip(NEW_LABELS, NEW_NAMES, strict=True):
        assert real[label] == [name]
        assert naming.llama_candidates(listing, label) == [name]
        assert HUB_LABELS[name] == label
    assert (
        naming.check_repo(
            [naming.Published(label, label, (name,)) for label, name in zip(NEW_LABELS, NEW_NAMES, strict=True)]
        )
        == []
    )
    assert real[""] == [f"{CALIB}-Q4_K_M.gguf"]  # no tag: Q4_K_M
    assert real["Q4_K"] == real["Q8_0"] == real["F16_MTP"] == []


def test_calib_old_names_are_ambiguous(toolchain):
    """(2) The names before the rename (issue #16): tag Q4_K_M matches four files; llama.cpp takes the first listed,
    the AWQ one (sorted: '-' < '.'), so `-hf <repo>:Q4_K_M` never reaches the plain Q4_K_M, and the Hub labels all
    four Q4_K_M."""
    listing = sorted(OLD_NAMES)
    tags = ("F16", "Q4_K_M", "Q3_K_M", "Q4_K_M-imat", "Q4_K_M-awq", "Q4_K_M-awqimat", "Q3_K_M-imat") + NON_LABELS
    real = assert_agree(toolchain, listing, tags)
    q4 = [f"{CALIB}-Q4_K_M{v}.gguf" for v in ("-awq", "-awqimat", "-imat", "")]
    assert naming.llama_candidates(listing, "Q4_K_M") == q4
    assert real["Q4_K_M"] == real[""] == real["q4_k_m"] == [f"{CALIB}-Q4_K_M-awq.gguf"]
    assert real["Q3_K_M"] == [f"{CALIB}-Q3_K_M-awq.gguf"]
    assert real["imat"] == real["IMAT"] == [f"{CALIB}-Q3_K_M-awqimat.gguf"]  # the first 'imat.' in the listing
    assert real["Q4_K_M-imat"] == [f"{CALIB}-Q4_K_M-imat.gguf"]
    assert [f"{CALIB}-Q4_K_M.gguf"] not in real.values()  # the plain Q4_K_M: no tag reaches it
    assert {HUB_LABELS[p] for p in q4} == {"Q4_K_M"}


def test_old_names_pick_follows_the_listing_order(toolchain):
    """The pick among ambiguous names is the first in the listing: with the plain file listed first (a listing
    order of the stand-in's choosing, not the sorted one) llama.cpp takes it, as llama_pick does for that order."""
    listing = [f"{CALIB}-Q4_K_M.gguf", f"{CALIB}-Q4_K_M-imat.gguf", f"{CALIB}-Q4_K_M-awq.gguf", f"{CALIB}-F16.gguf"]
    real = assert_agree(toolchain, listing, ("Q4_K_M", "", "imat", "F16"))
    assert real["Q4_K_M"] == [f"{CALIB}-Q4_K_M.gguf"]


def test_split_folders(toolchain):
    """(3) Split files in folders of shards ``<name>-<LABEL>/<name>-<LABEL>-0000i-of-0000N.gguf``: the label
    fetches every shard of its file, never a shard other than the first as the pick."""
    listing = sorted(
        [
            "m-F16.gguf",
            "m-Q4_K_M.gguf",
            *(f"m-Q4_K_M_IMAT/m-Q4_K_M_IMAT-{i:05d}-of-00003.gguf" for i in (1, 2, 3)),
            *(f"m-Q8_0/m-Q8_0-{i:05d}-of-00002.gguf" for i in (1, 2)),
            *(f"m-Q4_K_M-imat/m-Q4_K_M-imat-{i:05d}-of-00002.gguf" for i in (1, 2)),
        ]
    )
    tags = ("F16", "Q4_K_M", "Q4_K_M_IMAT", "Q8_0", "", "IMAT", "imat", "00002", "00003", "of", "Q4_K_M-imat")
    real = assert_agree(toolchain, listing, tags)
    assert real["Q4_K_M_IMAT"] == [f"m-Q4_K_M_IMAT/m-Q4_K_M_IMAT-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    assert real["Q8_0"] == [f"m-Q8_0/m-Q8_0-{i:05d}-of-00002.gguf" for i in (1, 2)]
    # the old-style folder's '-imat' text matches tag Q4_K_M in the folder name: listed before m-Q4_K_M.gguf
    assert real["Q4_K_M"] == [f"m-Q4_K_M-imat/m-Q4_K_M-imat-{i:05d}-of-00002.gguf" for i in (1, 2)]
    # a tag matches anywhere in the path: the shard count too ('-of-00002.'), giving the first shard's file
    assert real["00002"] == real["Q4_K_M"]
    assert real["00003"] == real["Q4_K_M_IMAT"]


MTP_REPO = ["m-F16.gguf", "m-Q4_K_M.gguf", "m-mtp-F16_MTP.gguf"]
MTP_TAGS = ("Q4_K_M", "F16", "F16_MTP", "mtp-F16_MTP", "", "Q8_0", "nope", "q4_k_m")


@pytest.mark.parametrize("draft_mtp", [False, True], ids=["model", "draft-mtp"])
def test_mtp_sidecar(toolchain, draft_mtp):
    """(4) The MTP draft ``<name>-mtp-<OUTTYPE>_MTP.gguf``: never a model for llama.cpp; with ``--spec-type
    draft-mtp`` it is fetched beside the model of any tag (and alone for a tag no model has)."""
    listing = sorted(MTP_REPO)
    real = assert_agree(toolchain, listing, MTP_TAGS, draft_mtp)
    side = ["m-mtp-F16_MTP.gguf"] if draft_mtp else []
    assert real["Q4_K_M"] == sorted(["m-Q4_K_M.gguf", *side])
    assert real["F16"] == sorted(["m-F16.gguf", *side])
    assert real["F16_MTP"] == real["nope"] == side
    assert HUB_LABELS["m-mtp-F16_MTP.gguf"] == "F16_MTP"


def test_mtp_sidecar_choice_among_several(toolchain):
    """find_best_sibling's order (deepest shared folder, then an exact ``-TAG.``, then the nearest bits), with the
    model in a split folder that holds a sidecar of its own and sidecars elsewhere."""
    listing = sorted(
        [
            "m-F16.gguf",
            "m-Q8_0.gguf",
            "m-mtp-F16_MTP.gguf",
            "m-mtp-Q8_0_MTP.gguf",
            "m-mtp-F16.gguf",
            "m-Q4_K_M/m-Q4_K_M-00001-of-00002.gguf",
            "m-Q4_K_M/m-Q4_K_M-00002-of-00002.gguf",
            "m-Q4_K_M/m-mtp-Q4_K_M_MTP.gguf",
            "other/m-mtp-Q4_0_MTP.gguf",
        ]
    )
    real = assert_agree(
        toolchain, listing, ("Q8_0", "F16", "Q4_K_M", "", "Q4_0", "Q4_0_MTP", "F16_MTP", "Q2_K"), draft_mtp=True
    )
    assert real["Q8_0"] == ["m-Q8_0.gguf", "m-mtp-Q8_0_MTP.gguf"]
    assert real["Q4_K_M"] == [
        "m-Q4_K_M/m-Q4_K_M-00001-of-00002.gguf",
        "m-Q4_K_M/m-Q4_K_M-00002-of-00002.gguf",
        "m-Q4_K_M/m-mtp-Q4_K_M_MTP.gguf",
    ]
    assert real["F16"] == ["m-F16.gguf", "m-mtp-F16.gguf"]  # exact "-F16." beats F16_MTP's equal bits


@pytest.mark.parametrize(
    "listing, want",
    [
        (NEW_NAMES, f"{CALIB}-Q4_K_M.gguf"),
        (["m-F16.gguf", "m-Q8_0.gguf", "m-Q5_K_M.gguf"], "m-Q8_0.gguf"),
        (["m-F16.gguf", "m-Q5_K_M.gguf", "m-Q4_K_M_IMAT.gguf"], "m-F16.gguf"),  # no Q4_K_M[.-]: the first model file
        (
            ["m-Q4_K_M/m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M/m-Q4_K_M-00002-of-00002.gguf", "m-Q8_0.gguf"],
            "m-Q4_K_M/m-Q4_K_M-00001-of-00002.gguf",
        ),
        (["mmproj-m-F16.gguf", "m.imatrix.gguf", "m-mtp-F16_MTP.gguf", "m-Q6_K.gguf"], "m-Q6_K.gguf"),
        (["mmproj-m-F16.gguf", "m-imatrix-Q4_K_M.gguf", "m-mtp-Q4_K_M_MTP.gguf", "README.md"], None),
    ],
    ids=["calib-new", "q8_0", "first-model", "split", "skips-sidecars", "no-model"],
)
def test_no_tag_default(toolchain, listing, want):
    """(5) No tag: Q4_K_M, then Q8_0, then the first model file (mmproj/imatrix/mtp- files are no models)."""
    listing = sorted(listing)
    real = assert_agree(toolchain, listing, ("",))
    assert naming.llama_pick(listing, "") == want
    assert real[""] == (shards(listing, want) if want else [])


# llama.cpp builds `std::regex(tag + "[.-]", icase)` from the tag unescaped (download.cpp:667), and std::stoi of an
# out-of-range digit run throws (find_best_sibling / extract_quant_bits): naming.py does the same. Labels of the rule
# (A-Z, 0-9, _) never meet this; tags a user types with . ( | do. (Where std::regex's ECMAScript and Python's re
# part, e.g. "Q4_K_M[": llama.cpp throws and fetches nothing, Python reads "[[.-]" as one class, naming.py differs.)
@pytest.mark.parametrize(
    "tag, draft_mtp",
    [
        ("Q4.K.M", False),  # '.' matches any character: m-Q4_K_M.gguf
        ("Q(4)_K_M", False),  # a group: m-Q4_K_M.gguf
        ("Q4_K_M_IMAT|F16", False),  # an alternation: m-F16.gguf
        ("Q99999999999_K", True),  # stoi throws: nothing fetched
    ],
)
def test_tags_with_regex_characters(toolchain, tag, draft_mtp):
    assert_agree(
        toolchain,
        sorted(["m-F16.gguf", "m-Q4_K_M.gguf", "m-Q4_K_M_IMAT.gguf", "m-mtp-F16_MTP.gguf"]),
        (tag,),
        draft_mtp,
    )
