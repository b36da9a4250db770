"""`ggufpipe rebuild-check` on the tiny build (tests/conftest.py: tiny_hub, tiny_build): a rebuild from the manifest
alone gives every recorded SHA256, a recorded SHA256 the rebuild does not give fails naming the file, and a
toolchain, recipe or source that differs from the recorded one is refused before anything is built."""

from __future__ import annotations

import json

import pytest
from helpers import TINY_NAME as NAME

from pipeline.errors import PipelineError
from pipeline.fsutil import sha256_file
from pipeline.stages.publish import strip_volatile


def _manifest(root):
    return json.loads((root / "artifacts" / NAME / "manifest.json").read_text())


def _tree(root):
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if ".snakemake" not in p.parts}


def test_rebuild_check_identical(tiny_hub, tiny_build, tmp_path, capsys):
    """`ggufpipe rebuild-check`: the tiny build rebuilt from its manifest in another folder with other --cores (3,
    so llama-quantize runs with 3 threads, not 2) gives the same SHA256 for every GGUF and the same manifest
    apart from the volatile `build` section; the original build folder is left as it was."""
    from pipeline.distribution.rebuild import rebuild_check

    hub, recipe = tiny_hub

    manifest = tiny_build / "artifacts" / NAME / "manifest.json"
    before = _tree(tiny_build)
    code = rebuild_check(manifest, recipe=str(recipe), cores="3", keep=str(tmp_path / "rb"),
                         hub_cache=str(hub))
    out = capsys.readouterr().out
    assert code == 0, out + (tmp_path / "rb" / "rebuild.log").read_text()[-3000:]
    rows = [ln.split() for ln in out.splitlines() if ln.startswith((f"{NAME}-", "manifest.json"))]
    files = {f"{NAME}-{t}.gguf" for t in ("F16", "Q8_0", "Q4_0")}
    assert {r[0] for r in rows} == files | {"manifest.json"} and all(r[-1] == "yes" for r in rows), out
    assert f"OK: {len(files) + 1} of {len(files) + 1} identical" in out
    m2 = json.loads((tmp_path / "rb" / "artifacts" / NAME / "manifest.json").read_text())
    assert strip_volatile(m2) == strip_volatile(_manifest(tiny_build))
    for f in files:  # the published copies too, not only what rebuild-check hashed in work/
        assert sha256_file(tmp_path / "rb" / "artifacts" / NAME / f) == sha256_file(tiny_build / "artifacts" / NAME / f)
    assert _tree(tiny_build) == before


def test_rebuild_check_mismatch_and_refusals(tiny_hub, tiny_build, tmp_path, capsys):
    """A recorded SHA256 that the rebuild does not give fails with exit 1 naming the file (--only F16: fetch and
    convert only); a toolchain, recipe or source that differs from the recorded one is refused, one line
    each, before anything is built."""
    from pipeline.distribution.rebuild import rebuild_check

    hub, recipe = tiny_hub

    m = _manifest(tiny_build)
    folder = tmp_path / "artifacts" / NAME
    folder.mkdir(parents=True)
    f16 = next(e for e in m["artifacts"] if e["quant_type"] == "F16")
    f16["sha256"] = "0" * 64
    (folder / "manifest.json").write_text(json.dumps(m))
    code = rebuild_check(folder / "manifest.json", recipe=str(recipe), cores="2", only=["F16"],
                         hub_cache=str(hub))
    out = capsys.readouterr().out
    assert code == 1, out
    assert f"MISMATCH: 1 of 1: {NAME}-F16.gguf" in out and "Q8_0" not in out.split("identical")[0]
    row = next(ln for ln in out.splitlines() if ln.startswith(f"{NAME}-F16.gguf"))
    assert row.split()[1:] == ["0000000000000000…", sha256_file(tiny_build / "artifacts" / NAME / f"{NAME}-F16.gguf")[:16]
                               + "…", "NO"], row

    m = _manifest(tiny_build)
    m["tools"]["llama_cpp_commit"] = "1234567"
    m["tools"]["python"]["converter"]["torch"] = "9.9.9"
    m["recipe"]["sha256"] = "f" * 64
    (folder / "manifest.json").write_text(json.dumps(m))
    # a refusal: one error line naming every difference, in the order found (the CLI prints it on stderr)
    with pytest.raises(PipelineError) as exc:
        rebuild_check(folder / "manifest.json", recipe=str(recipe), keep=str(tmp_path / "never"), hub_cache=str(hub))
    parts = str(exc.value).removeprefix(f"cannot rebuild {folder / 'manifest.json'}: ").split("; ")
    assert len(parts) == 3 and capsys.readouterr().out == "", parts
    assert "toolchain: llama.cpp b11312 (commit 0c1e570) here, the manifest records b11312 (commit 1234567)" in parts[0]
    assert ("toolchain: Python package torch 2.13.0+cpu in the converter environment here, the manifest records "
            "9.9.9") in parts[1]
    assert f"recipe: {recipe} has SHA256 " in parts[2] and "(edited since the build)" in parts[2]
    m = _manifest(tiny_build)
    m["source"]["commit"] = "ab" * 20
    (folder / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PipelineError) as exc:
        rebuild_check(folder / "manifest.json", recipe=str(recipe), hub_cache=str(hub))
    assert f"{'ab' * 20} is not in the hub cache ({hub})" in str(exc.value) and "toolchain:" not in str(exc.value), exc.value
    assert not (tmp_path / "never").exists()
