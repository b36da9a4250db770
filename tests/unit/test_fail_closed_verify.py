"""Issue #50, the manifest readers (pipeline/distribution/manifest_check.py): ``verify``, ``dvc-link``,
``rebuild-check``, ``hub-publish``'s plan, ``ci``'s summary and ``info`` refuse a malformed manifest (or input file) in
one line naming the file and the field, never follow a ``../`` in a manifest's file names, and ``dvc-link`` changes
nothing -- its ``dvc.lock`` least of all -- when it refuses bad input. Tiny GGUFs and manifests in tmp_path; no
llama.cpp tools."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import gguf
import numpy as np
import pytest

from pipeline.cli import main
from pipeline.distribution import manifest_check
from pipeline.distribution import verify as verify_mod
from pipeline.distribution.manifest_check import check_manifest, read_manifest
from pipeline.errors import ArtifactError, PipelineError
from pipeline.gguf import read_header
from pipeline.layout import Layout
from pipeline.stages.publish_devices import SLICE_FILE

ROOT = Path(__file__).resolve().parents[2]
NAME, KEY = "m", "Q8_0"
FILE = f"{NAME}-{KEY}.gguf"


def write_gguf(path: Path, split: tuple[int, int, int] | None = None) -> Path:
    """A one-tensor GGUF of file type Q8_0; ``split``: (split.no, split.count, split.tensors.count) keys."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    if split is not None:
        w.add_uint16("split.no", split[0])
        w.add_uint16("split.count", split[1])
        w.add_int32("split.tensors.count", split[2])
    w.add_tensor("tok_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def entry_of(path: Path) -> dict:
    f = read_header(path).facts(sha(path)).as_dict()
    return {k: f[k] for k in ("file", "quant_type", "sha256", "size_bytes", "tensor_count", "gguf_version")}


def published(tmp_path: Path) -> tuple[Path, dict]:
    """``artifacts/m/`` with one GGUF and its manifest; (the GGUF, the manifest)."""
    gguf_path = write_gguf(tmp_path / "artifacts" / NAME / FILE)
    manifest = {"name": NAME, "build_id": f"{NAME}-0123456789ab", "artifacts": [entry_of(gguf_path)]}
    write_manifest(gguf_path.parent, manifest)
    return gguf_path, manifest


def write_manifest(folder: Path, data, raw: str | None = None) -> Path:
    path = folder / "manifest.json"
    path.write_text(raw if raw is not None else json.dumps(data))
    return path


def one_error_line(capsys, argv: list[str]) -> str:
    """Run the CLI; it must exit 1 with exactly one line, ``error: ...``, on stderr (a traceback fails the test)."""
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err.strip()


def deep(n: int = 100_000) -> str:
    return "[" * n + "]" * n


# ------------------------------------------------------------------ defect 7 (verify part): one line, never a traceback

def _drop(key):
    def edit(m):
        del m["artifacts"][0][key]
    return edit


def _set(path: str, value):
    def edit(m):
        *head, last = path.split(".")
        at = m
        for k in head:
            at = at[int(k)] if isinstance(at, list) else at[k]
        if isinstance(at, list):
            at[int(last)] = value
        else:
            at[last] = value
    return edit


MALFORMED = [  # (id, edit of the good manifest or raw text, the field the line names, what it says)
    ("no-size_bytes", _drop("size_bytes"), "artifacts[0].size_bytes", "missing"),
    ("no-sha256", _drop("sha256"), "artifacts[0].sha256", "missing"),
    ("no-quant_type", _drop("quant_type"), "artifacts[0].quant_type", "missing"),
    ("no-file", _drop("file"), "artifacts[0].file", "missing"),
    ("artifacts-object", _set("artifacts", {"file": FILE}), "artifacts", "must be an array, got an object"),
    ("artifacts-string", _set("artifacts", "x"), "artifacts", "must be an array, got a string"),
    ("artifacts-missing", lambda m: m.pop("artifacts"), "artifacts", "missing"),
    ("entry-list", _set("artifacts.0", [FILE]), "artifacts[0]", "must be an object, got an array"),
    ("size-string", _set("artifacts.0.size_bytes", "x"), "artifacts[0].size_bytes",
     "must be an integer 0..9223372036854775807, got 'x'"),
    ("size-negative", _set("artifacts.0.size_bytes", -1), "artifacts[0].size_bytes", "must be an integer 0..9223372036854775807, got -1"),
    ("size-2^63", _set("artifacts.0.size_bytes", 2**63), "artifacts[0].size_bytes", "got 9223372036854775808"),
    ("size-float", _set("artifacts.0.size_bytes", 1.5), "artifacts[0].size_bytes", "must be an integer"),
    ("size-bool", _set("artifacts.0.size_bytes", True), "artifacts[0].size_bytes", "got True"),
    ("sha-short", _set("artifacts.0.sha256", "abc"), "artifacts[0].sha256", "must be a SHA256 (64 lowercase hex"),
    ("quant-number", _set("artifacts.0.quant_type", 8), "artifacts[0].quant_type", "must be a string, got 8"),
    ("tensor-count-inf", _set("artifacts.0.tensor_count", float("inf")), "artifacts[0].tensor_count",
     "must be an integer"),
    ("split-string", _set("artifacts.0.split", "yes"), "artifacts[0].split", "must be an object, got a string"),
    ("shards-empty", _set("artifacts.0.split", {"shards": [], "unsplit": {}}), "artifacts[0].split.shards",
     "must not be empty"),
    ("mix-no-map", _set("artifacts.0.mix", {"flavour": "plain"}), "artifacts[0].mix.map", "missing"),
    ("slice-chunks-0", _set("device_check", {"file": SLICE_FILE, "size_bytes": 1, "sha256": "a" * 64, "chunks": 0,
                                             "eval_set": "g"}), "device_check.chunks", "got 0"),
    ("name-number", _set("name", 5), "name", "must be a plain file name (a string), got 5"),
]


@pytest.mark.parametrize("case_id,edit,field,says", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_verify_names_the_manifest_field_in_one_line(tmp_path, capsys, case_id, edit, field, says):
    gguf_path, manifest = published(tmp_path)
    assert main(["verify", str(gguf_path)]) == 0 and capsys.readouterr().out.startswith(f"OK  {gguf_path} (Q8_0, ")
    edit(manifest)
    mpath = write_manifest(gguf_path.parent, manifest)
    line = one_error_line(capsys, ["verify", str(gguf_path)])
    assert line.startswith(f"error: {mpath}: {field}: ") and says in line, line


@pytest.mark.parametrize("case_id,raw,says", [
    ("nested-100000", deep(), "cannot read the manifest: nested too deeply"),
    ("object-nested-100000", '{"artifacts": ' + deep() + "}", "cannot read the manifest: nested too deeply"),
    ("top-level-list", "[]", "must be a JSON object (a ggufpipe manifest), got an array"),
    ("top-level-null", "null", "must be a JSON object (a ggufpipe manifest), got null"),
    ("not-json", "{", "cannot read the manifest: Expecting property name"),
    ("not-utf8", '{"name": "\xff"}'.encode("latin-1").decode("utf-8", "surrogateescape"), "not UTF-8"),
    ("nan-size", None, "artifacts[0].size_bytes: must be an integer 0..9223372036854775807, got nan"),
])
def test_verify_refuses_an_unreadable_manifest_in_one_line(tmp_path, capsys, case_id, raw, says):
    gguf_path, manifest = published(tmp_path)
    mpath = gguf_path.parent / "manifest.json"
    if raw is None:  # Python's json reads the NaN literal: the range check must refuse it
        mpath.write_text(json.dumps(manifest).replace(f'"size_bytes": {manifest["artifacts"][0]["size_bytes"]}',
                                                      '"size_bytes": NaN'))
    else:
        mpath.write_bytes(raw.encode("utf-8", "surrogateescape"))
    line = one_error_line(capsys, ["verify", str(gguf_path)])
    assert line.startswith(f"error: {mpath}: ") and says in line, line


def test_verify_refuses_a_fifo_as_the_manifest(tmp_path, capsys):
    gguf_path, _ = published(tmp_path)
    fifo = tmp_path / "manifest.fifo"
    os.mkfifo(fifo)
    line = one_error_line(capsys, ["verify", str(gguf_path), "--manifest", str(fifo)])
    assert line == f"error: {fifo}: cannot read the manifest: not a regular file (a FIFO, socket or device)"


# ------------------------------------------------------------------ defect 10: no path out of the folder


def _outside_split(tmp_path: Path, shard_name: str) -> tuple[Path, Path]:
    """A split file's folder ``artifacts/m/m-Q8_0/`` (empty) whose manifest lists one shard by ``shard_name``, and a
    valid one-shard GGUF planted where that name leads: (the folder, the planted file)."""
    folder = tmp_path / "artifacts" / NAME / f"{NAME}-{KEY}"
    folder.mkdir(parents=True)
    planted = write_gguf((folder / shard_name).resolve(), split=(0, 1, 1))
    digest, size = sha(planted), planted.stat().st_size
    entry = {"file": folder.name, "quant_type": "Q8_0", "size_bytes": size, "tensor_count": 1,
             "split": {"count": 1, "shards": [{"file": shard_name, "size_bytes": size, "sha256": digest,
                                               "tensor_count": 1}],
                       "unsplit": {"file": f"{folder.name}.gguf", "sha256": digest, "size_bytes": size}}}
    write_manifest(folder.parent, {"name": NAME, "build_id": "b", "artifacts": [entry]})
    return folder, planted


def _hashed(monkeypatch) -> list[Path]:
    """The files verify hashes, recorded."""
    seen: list[Path] = []
    real = verify_mod.sha256_file
    monkeypatch.setattr(verify_mod, "sha256_file", lambda p, *a: (seen.append(Path(p).resolve()), real(p, *a))[1])
    return seen


@pytest.mark.parametrize("shard_name", ["../../../outside/m-Q8_0-00001-of-00001.gguf",
                                        "../m-Q8_0-00001-of-00001.gguf"])
def test_verify_never_hashes_a_shard_outside_its_folder(tmp_path, monkeypatch, shard_name):
    """Before: ``OK ... every SHA256 matches`` for a shard read from outside the split folder."""
    folder, planted = _outside_split(tmp_path, shard_name)
    hashed = _hashed(monkeypatch)
    with pytest.raises(ArtifactError) as exc:
        verify_mod.verify(folder)
    assert str(exc.value) == (f"{folder.parent / 'manifest.json'}: artifacts[0].split.shards[0].file: {shard_name!r} "
                              "is not a plain file name: a manifest's files never leave its folder")
    assert hashed == [] and planted.is_file()


def test_verify_never_hashes_a_mix_map_outside_the_folder(tmp_path, monkeypatch):
    """Before: ``OK ...; map ../../outside/m.tensor-types.txt matches``, the map read from outside the folder."""
    gguf_path, manifest = published(tmp_path)
    outside = tmp_path / "outside" / "m.tensor-types.txt"
    outside.parent.mkdir()
    outside.write_text("blk\\..*=q8_0\n")
    name = "../../outside/m.tensor-types.txt"
    manifest["artifacts"][0]["mix"] = {"flavour": "plain", "map": {"file": name, "sha256": sha(outside)}}
    mpath = write_manifest(gguf_path.parent, manifest)
    hashed = _hashed(monkeypatch)
    with pytest.raises(ArtifactError, match=r"artifacts\[0\]\.mix\.map\.file: '\.\./\.\./outside/m\.tensor-types\.txt' "
                                            "is not a plain file name") as exc:
        verify_mod.verify(gguf_path)
    assert exc.value.path == mpath and outside.resolve() not in hashed


@pytest.mark.parametrize("field,value", [
    ("artifacts.0.file", "../m-Q8_0.gguf"), ("artifacts.0.file", "/etc/passwd"), ("artifacts.0.file", ".hidden"),
    ("artifacts.0.file", "a\\b.gguf"), ("recipe", {"file": "../../x.yaml", "sha256": "a" * 64}),
    ("device_check", {"file": "../device-slice.logits", "size_bytes": 1, "sha256": "a" * 64, "chunks": 1,
                      "eval_set": "g"}),
    ("ollama", [{"file": "../../Modelfile", "sha256": "a" * 64}]),
    ("hub", {"files": [{"file": "/tmp/params", "sha256": "a" * 64}]}),
    ("sensitivity", {"../plain": {"sha256": "a" * 64, "text_sha256": "a" * 64}}),
    ("rejected", [{"file": "../m-Q4_0.gguf"}]),
])
def test_every_file_name_in_a_manifest_is_one_plain_segment(field, value, tmp_path):
    m = {"artifacts": [{"file": FILE, "size_bytes": 1, "quant_type": "Q8_0", "sha256": "a" * 64}]}
    _set(field, value)(m)
    with pytest.raises(ArtifactError, match="is not a plain file name: a manifest's files never leave its folder|"
                                            "the key .* is not a plain file name"):
        check_manifest(m, tmp_path / "manifest.json")


def test_the_committed_manifests_pass_the_check():
    """What the publish stage writes holds: the demo's manifests, with every section rebuild-check requires."""
    found = sorted((ROOT / "artifacts").glob("*/manifest.json"))
    assert found
    for path in found:
        read_manifest(path, require=("name", "recipe", "source", "tools", "artifacts"))


def test_a_split_file_still_verifies(tmp_path):
    """The check lets a well-formed split through: the same shard, inside its folder, is OK."""
    folder = tmp_path / "artifacts" / NAME / f"{NAME}-{KEY}"
    shard = write_gguf(folder / f"{folder.name}-00001-of-00001.gguf", split=(0, 1, 1))
    digest, size = sha(shard), shard.stat().st_size
    entry = {"file": folder.name, "quant_type": "Q8_0", "size_bytes": size, "tensor_count": 1,
             "split": {"shards": [{"file": shard.name, "size_bytes": size, "sha256": digest, "tensor_count": 1}],
                       "unsplit": {"file": f"{folder.name}.gguf", "sha256": digest}}}
    write_manifest(folder.parent, {"name": NAME, "artifacts": [entry]})
    assert verify_mod.verify(shard).startswith(f"OK  {folder} (Q8_0, 1 shard(s), ")


# ------------------------------------------------------------------ dvc-link: bad input changes nothing


LOCK = ("schema: '2.0'\nstages:\n  gguf@m-Q8_0:\n    cmd: python -m pipeline.cli dvc-link --name m --file m-Q8_0.gguf\n"
        "  gguf@m-Q4_0:\n    cmd: python -m pipeline.cli dvc-link --name m --file m-Q4_0.gguf\n")


def tree(folder: Path) -> dict:
    """Every entry under ``folder`` (links not followed): its bytes, or where a link leads."""
    out = {}
    for p in sorted(folder.rglob("*")):
        out[str(p.relative_to(folder))] = (f"-> {os.readlink(p)}" if p.is_symlink() else
                                           p.read_bytes() if p.is_file() else "dir")
    return out


class Project:
    """``artifacts/m/`` (the manifest), ``work/m/`` (the built GGUF and device slice) and ``dvc.lock``."""

    def __init__(self, tmp_path: Path):
        self.root = tmp_path
        self.layout = Layout(tmp_path / "artifacts", tmp_path / "work")
        built = write_gguf(self.layout.built(NAME, FILE))
        self.slice = self.layout.device_slice(NAME)
        self.slice.parent.mkdir(parents=True)
        self.slice.write_bytes(b"slice bytes")
        self.manifest = {"name": NAME, "build_id": "b", "artifacts": [entry_of(built)],
                         "rejected": [{"file": f"{NAME}-Q4_0.gguf", "failures": [{"message": "mean KLD 0.2 > 0.1"}]}],
                         "device_check": {"file": SLICE_FILE, "size_bytes": 11, "sha256": sha(self.slice),
                                          "chunks": 2, "eval_set": "g"}}
        self.art = self.layout.art_dir(NAME)
        self.art.mkdir(parents=True)
        self.write()
        self.lock = tmp_path / "dvc.lock"
        self.lock.write_text(LOCK)

    def write(self, raw: str | None = None) -> Path:
        return write_manifest(self.art, self.manifest, raw)

    def argv(self, file: str = FILE, stage: str = f"gguf@{NAME}-{KEY}", name: str = NAME) -> list[str]:
        return ["dvc-link", "--name", name, "--file", file, "--stage", stage, "--artifacts", str(self.layout.artifacts),
                "--work", str(self.layout.work), "--lock", str(self.lock)]


def test_dvc_link_publishes_and_drops_the_lock_entry_of_a_rejected_file(tmp_path, capsys):
    p = Project(tmp_path)
    assert main(p.argv()) == 0 and (p.art / FILE).samefile(p.layout.built(NAME, FILE))
    assert main(p.argv(file=SLICE_FILE, stage=f"gguf@{NAME}-device-slice")) == 0 and (p.art / SLICE_FILE).is_file()
    assert p.lock.read_text() == LOCK
    capsys.readouterr()
    line = one_error_line(capsys, p.argv(file=f"{NAME}-Q4_0.gguf", stage=f"gguf@{NAME}-Q4_0"))
    assert line.endswith("not published by " f"{p.art / 'manifest.json'} (mean KLD 0.2 > 0.1); DVC does not track it")
    assert "gguf@m-Q4_0" not in p.lock.read_text() and "gguf@m-Q8_0" in p.lock.read_text()  # a rejection drops it


BAD_INPUT = [  # (id, how the project is spoiled -> argv, what the line says)
    ("rejected-entry-without-file", lambda p: (p.manifest["rejected"].append({"failures": []}), p.write(),
                                               p.argv(file=f"{NAME}-Q4_0.gguf", stage=f"gguf@{NAME}-Q4_0"))[-1],
     "manifest.json: rejected[1].file: missing"),
    ("failures-not-a-list", lambda p: (p.manifest["rejected"][0].update(failures="x"), p.write(),
                                       p.argv(file=f"{NAME}-Q4_0.gguf", stage=f"gguf@{NAME}-Q4_0"))[-1],
     "manifest.json: rejected[0].failures: must be an array, got a string"),
    ("artifacts-not-a-list", lambda p: (p.manifest.update(artifacts={}), p.write(),
                                        p.argv(file=f"{NAME}-Q4_0.gguf", stage=f"gguf@{NAME}-Q4_0"))[-1],
     "manifest.json: artifacts: must be an array, got an object"),
    ("manifest-nested-deep", lambda p: (p.write(raw=deep()), p.argv(file=f"{NAME}-Q4_0.gguf",
                                                                    stage=f"gguf@{NAME}-Q4_0"))[-1],
     "manifest.json: cannot read the manifest: nested too deeply"),
    ("shard-traversal", lambda p: (p.manifest["artifacts"][0].update(
        split={"shards": [{"file": "../../x.gguf", "size_bytes": 1, "sha256": "a" * 64, "tensor_count": 1}],
               "unsplit": {"file": "x.gguf", "sha256": "a" * 64}}), p.write(), p.argv())[-1],
     "artifacts[0].split.shards[0].file: '../../x.gguf' is not a plain file name"),
    ("file-traversal", lambda p: p.argv(file="../../etc/passwd"),
     "--file: '../../etc/passwd' is not a plain file name"),
    ("file-absolute", lambda p: p.argv(file="/etc/passwd"), "--file: '/etc/passwd' is not a plain file name"),
    ("stage-traversal", lambda p: p.argv(file=f"{NAME}-Q4_0.gguf", stage="../gguf@m-Q4_0"),
     "--stage: '../gguf@m-Q4_0' is not a DVC stage name"),
    ("stage-absolute", lambda p: p.argv(file=f"{NAME}-Q4_0.gguf", stage="/gguf@m-Q4_0"),
     "--stage: '/gguf@m-Q4_0' is not a DVC stage name"),
    ("stage-dotdot", lambda p: p.argv(file=f"{NAME}-Q4_0.gguf", stage="gguf@m..Q4_0"),
     "--stage: 'gguf@m..Q4_0' is not a DVC stage name"),
    ("name-traversal", lambda p: p.argv(name="../m"), "'../m' is not a recipe name"),
    ("lock-not-yaml", lambda p: (p.lock.write_text("stages: [\n"), p.argv(file=f"{NAME}-Q4_0.gguf",
                                                                          stage=f"gguf@{NAME}-Q4_0"))[-1],
     "dvc.lock: cannot read the DVC lock file: "),
    ("lock-stages-a-list", lambda p: (p.lock.write_text("stages: [gguf@m-Q4_0]\n"),
                                      p.argv(file=f"{NAME}-Q4_0.gguf", stage=f"gguf@{NAME}-Q4_0"))[-1],
     "dvc.lock: not a DVC lock file (`stages` must be a mapping); the gguf@m-Q4_0 entry was not dropped"),
    ("source-links-outside-work", lambda p: (p.layout.built(NAME, FILE).rename(p.root / "elsewhere.gguf"),
                                             p.layout.built(NAME, FILE).symlink_to(p.root / "elsewhere.gguf"),
                                             p.argv())[-1],
     f"work/{NAME}/quants/{FILE}: a symlink to "),
]


@pytest.mark.parametrize("case_id,spoil,says", BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
def test_dvc_link_refuses_bad_input_in_one_line_and_changes_nothing(tmp_path, capsys, case_id, spoil, says):
    p = Project(tmp_path)
    argv = spoil(p)
    lock, art = p.lock.read_bytes(), tree(p.art)
    line = one_error_line(capsys, argv)
    assert says in line, line
    assert p.lock.read_bytes() == lock and tree(p.art) == art


@pytest.mark.parametrize("file,stage", [(SLICE_FILE, f"gguf@{NAME}-device-slice"), (FILE, f"gguf@{NAME}-{KEY}"),
                                        (f"{NAME}-Q4_0.gguf", f"gguf@{NAME}-Q4_0")])
def test_dvc_link_never_writes_through_a_symlinked_folder(tmp_path, capsys, file, stage):
    """Before: the device slice was linked into the folder the symlink ``artifacts/m`` leads to."""
    p = Project(tmp_path)
    outside = tmp_path / "outside" / NAME
    outside.parent.mkdir()
    p.art.rename(outside)
    p.art.symlink_to(outside)
    before = tree(outside)
    line = one_error_line(capsys, p.argv(file=file, stage=stage))
    assert f"{p.art}: is a symlink to {outside}" in line, line
    assert tree(outside) == before and p.lock.read_text() == LOCK


# ------------------------------------------------------------------ the other readers


def _rebuild_manifest() -> dict:
    return {"name": NAME, "build_id": "b", "recipe": {"file": f"{NAME}.yaml", "sha256": "a" * 64},
            "source": {"repo": "org/m", "revision": "main", "commit": "c" * 40},
            "tools": {"llama_cpp_build": 11312, "llama_cpp_commit": "0c1e570"},
            "artifacts": [{"file": FILE, "size_bytes": 1, "quant_type": "Q8_0", "sha256": "a" * 64}]}


@pytest.mark.parametrize("case_id,edit,says", [
    ("recipe-file-traversal", _set("recipe.file", "../../../etc/passwd"),
     "recipe.file: '../../../etc/passwd' is not a plain file name"),
    ("commit-traversal", _set("source.commit", "../../../x"), "source.commit: must be a commit id"),
    ("repo-traversal", _set("source.repo", "../x"), "source.repo: must be a Hub repo id <org>/<name>"),
    ("hub-source-without-commit", lambda m: m["source"].pop("commit"), "source.commit: missing"),
    ("no-tools", lambda m: m.pop("tools"), "tools: missing (not a ggufpipe manifest)"),
    ("calibration-string", _set("artifacts.0.calibration", "x"), "artifacts[0].calibration: must be an object"),
    ("calibration-sha-missing", _set("artifacts.0.calibration", {"imatrix": {"threads": 2}}),
     "artifacts[0].calibration.imatrix.calibration_sha256: missing"),
    ("eval-threads-huge", _set("build", {"eval_threads": {"g": 10**6}}),
     "build.eval_threads['g']: must be an integer 1..512"),
    ("eval-set-without-text", _set("eval_sets", [{"name": "g"}]), "eval_sets[0].text_sha256: missing"),
    ("python-versions-list", _set("tools.python", {"build": ["torch"]}), "tools.python['build']: must be an object"),
    ("llama-build-string", _set("tools.llama_cpp_build", "11312"), "tools.llama_cpp_build: must be an integer"),
])
def test_rebuild_check_refuses_a_malformed_manifest_before_any_build(tmp_path, capsys, monkeypatch, case_id, edit,
                                                                     says):
    from pipeline.distribution import rebuild

    monkeypatch.setattr(rebuild, "_snakemake", lambda *a, **k: pytest.fail("a build started"))
    m = _rebuild_manifest()
    edit(m)
    mpath = write_manifest(tmp_path, m)
    line = one_error_line(capsys, ["rebuild-check", str(mpath)])
    assert line.startswith(f"error: {mpath}: ") and says in line, line


def test_rebuild_check_gets_past_the_check_with_a_good_manifest(tmp_path, capsys):
    """The check is not what refuses a well-formed manifest: the next step (finding the recipe) is."""
    mpath = write_manifest(tmp_path, _rebuild_manifest())
    assert "recipe.file: m.yaml not found in " in one_error_line(capsys, ["rebuild-check", str(mpath)])


def test_hub_plan_reads_a_checked_manifest(tmp_path):
    from pipeline.distribution.hub import load_manifest

    m = _rebuild_manifest()
    m["ollama"] = [{"file": "../../../.ssh/authorized_keys", "sha256": "a" * 64}]
    write_manifest(tmp_path, m)
    with pytest.raises(ArtifactError, match=r"manifest\.json: ollama\[0\]\.file: '\.\./\.\./\.\./\.ssh/authorized_keys'"
                                            " is not a plain file name"):
        load_manifest(tmp_path)
    m.pop("build_id")
    write_manifest(tmp_path, m)
    with pytest.raises(ArtifactError, match=r"manifest\.json: build_id: missing \(not a ggufpipe manifest\)"):
        load_manifest(tmp_path)


def test_ci_summary_reports_a_malformed_manifest_as_an_error_of_its_recipe(tmp_path):
    from pipeline.distribution.ci_summary import RecipeResult, collect_results

    layout = Layout(tmp_path / "artifacts", tmp_path / "work")
    layout.gate_ok(NAME).parent.mkdir(parents=True)
    layout.gate_ok(NAME).touch()
    layout.art_dir(NAME).mkdir(parents=True)
    m = _rebuild_manifest()
    m["rejected"] = [{"file": f"{NAME}-Q4_0.gguf", "failures": [{"message": "x", "metric": ["kld_mean"]}]}]
    write_manifest(layout.art_dir(NAME), m)
    res = RecipeResult(types.SimpleNamespace(name=NAME, draft_recipe=lambda: None), "r.yaml", "changed")
    collect_results([res], layout, [], "", 0)
    assert res.errors == [f"{NAME}: {layout.manifest(NAME)}: rejected[0].failures[0].metric: must be a string, got "
                          "['kld_mean']"] and not res.passed and res.manifests == {}


def test_info_refuses_what_is_not_a_regular_file_without_blocking(tmp_path):
    """``info`` on a FIFO opened it and waited for a writer forever; a folder gave ``cannot read: Is a directory``."""
    fifo = tmp_path / "x.gguf"
    os.mkfifo(fifo)
    for path, what in ((fifo, "a FIFO, socket or device"), (tmp_path, "a folder")):
        res = subprocess.run([sys.executable, "-m", "pipeline.cli", "info", str(path)], capture_output=True, text=True,
                             timeout=60, cwd=ROOT)
        assert res.returncode == 1 and res.stderr == (f"error: {path}: not a regular file ({what}): info reads a GGUF "
                                                      "file\n"), res.stderr


def test_the_check_is_one_place_and_stdlib_only():
    """verify (on a device: no numpy, no yaml) imports the check and nothing heavy with it."""
    code = ("import sys; import pipeline.distribution.verify; "
            "print(sorted(m for m in ('yaml', 'numpy', 'gguf') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.stdout.strip() == "[]", res.stdout + res.stderr
    assert manifest_check.read_manifest is verify_mod.read_manifest


def test_a_check_error_is_a_pipeline_error_with_the_manifest_as_its_path(tmp_path):
    with pytest.raises(ArtifactError) as exc:
        check_manifest({"artifacts": [{}]}, tmp_path / "manifest.json")
    assert isinstance(exc.value, PipelineError) and exc.value.path == tmp_path / "manifest.json"
    assert str(exc.value) == f"{tmp_path / 'manifest.json'}: artifacts[0].file: missing"


def test_a_nan_measurement_of_a_rejected_quant_does_not_block_verify(tmp_path, capsys):
    """A metric the gate refused (NaN) stays in the manifest; the readers only show it, so verify still checks the
    published files."""
    gguf_path, manifest = published(tmp_path)
    manifest["rejected"] = [{"file": f"{NAME}-Q2_K.gguf", "metrics": {"g": {"kld_mean": float("nan")}},
                             "failures": [{"check": "gate", "metric": "kld_mean", "message": "kld_mean is NaN"}]}]
    write_manifest(gguf_path.parent, manifest)
    assert main(["verify", str(gguf_path)]) == 0 and capsys.readouterr().out.startswith("OK  ")


def test_ci_reads_only_well_formed_stage_error_records(tmp_path):
    from pipeline.distribution.ci_summary import read_errors

    path = tmp_path / "errors.jsonl"
    path.write_text("\n".join(['{"name": "m", "stage": "fetch", "message": "boom"}', "[]", '{"message": 5}', deep(),
                               "not json", '{"name": "m", "message": "two"}']) + "\n")
    assert [r["message"] for r in read_errors(path)] == ["boom", "two"]
