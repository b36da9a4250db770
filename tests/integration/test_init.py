"""`ggufpipe init` (issue #20 item 3) on the tiny Llama of tests/helpers/hf_factory.py (make_tiny_llama), from its
folder and from the local hub cache at its pinned commit (the `tiny_hub` fixture): the written recipe is one
load_recipe accepts (with llama-quantize's type list); what the build could not use is refused in one line; an
existing file is never overwritten; `--device` adds the largest stock quant whose estimated memory fits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import BOTCHAN, TINY_COMMIT, TINY_REPO

from pipeline.cli import main
from pipeline.recipe import load_recipe


@pytest.fixture(scope="module")
def hub(tiny_hub):
    return tiny_hub[0]


@pytest.fixture(scope="module")
def tiny_folder(hub):
    return hub.parent / "hf"  # the folder tiny_hub put in the hub cache


def init(capsys, monkeypatch, hub, *args) -> tuple[int, str, str]:
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc = main(["init", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def copy_with(folder: Path, dest: Path, **config) -> Path:
    shutil.copytree(folder, dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg.update(config)
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def test_init_from_folder(tmp_path, capsys, monkeypatch, hub, tiny_folder, quantize_exe):
    out = tmp_path / "recipes" / "t.yaml"
    rc, stdout, err = init(capsys, monkeypatch, hub, tiny_folder, "--out", out)
    assert rc == 0, err
    assert f"wrote {out}" in stdout and f"next: ggufpipe build {out}" in stdout
    r = load_recipe(out, quantize_exe)
    assert r.name == "hf" and r.source.path == str(tiny_folder.resolve()) and r.source.repo is None
    assert r.outtype == "f16"  # the checkpoint is F16
    assert [q.key for q in r.quants] == ["Q8_0", "Q4_K_M"]
    (es,) = r.eval_sets
    assert es.name == "botchan" and es.ctx == 512 and es.chunks == 16  # max_position_embeddings 512
    assert Path(es.text).resolve() == BOTCHAN.resolve()
    text = out.read_text()
    assert "mtp:" not in text and "# license: no license found" in text and "chat template: none found" in text
    assert not list(out.parent.glob(".*"))  # no temporary file left


def test_init_from_hub_cache_pins_the_commit(tmp_path, capsys, monkeypatch, hub):
    for spec in (TINY_REPO, f"{TINY_REPO}@main", f"{TINY_REPO}@{TINY_COMMIT}"):
        out = tmp_path / f"{len(spec)}.yaml"
        rc, stdout, err = init(capsys, monkeypatch, hub, spec, "--out", out)
        assert rc == 0, err
        r = load_recipe(out)
        assert (r.name, r.source.repo, r.source.revision) == ("tiny-llama", TINY_REPO, TINY_COMMIT)
        assert "HF_HUB_OFFLINE=1 ggufpipe build" in stdout


def test_init_default_out_and_license(tmp_path, capsys, monkeypatch, hub, tiny_folder):
    folder = copy_with(tiny_folder, tmp_path / "My_Model.v2", num_nextn_predict_layers=1)
    (folder / "README.md").write_text("---\nlicense: mit\ntags: [x]\n---\n# a card\n")
    monkeypatch.chdir(tmp_path)
    rc, stdout, err = init(capsys, monkeypatch, hub, folder, "--quants", "q8_0")
    assert rc == 0, err
    out = tmp_path / "recipes" / "my_model.v2.yaml"
    r = load_recipe(out)
    assert r.license == "mit" and r.mtp == "keep" and [q.key for q in r.quants] == ["Q8_0"]
    assert "num_nextn_predict_layers = 1" in out.read_text()
    assert "MTP layers: 1" in stdout


@pytest.mark.parametrize("edit, expected", [
    ({"architectures": ["FooBarForCausalLM"]},
     "FooBarForCausalLM is not supported by the pinned llama.cpp converter (b11312)"),
    ({"auto_map": {"AutoModelForCausalLM": "modeling_x.X"}}, "needs custom code (auto_map): the recipe needs "
                                                            "source.trust_remote_code: true"),
])
def test_init_refusals_are_one_line(tmp_path, capsys, monkeypatch, hub, tiny_folder, edit, expected):
    folder = copy_with(tiny_folder, tmp_path / "m", **edit)
    out = tmp_path / "r.yaml"
    rc, _, err = init(capsys, monkeypatch, hub, folder, "--out", out)
    assert rc == 1 and err.count("\n") == 1 and expected in err, err
    assert not out.exists()


def test_init_refuses_pickles_and_a_folder_without_config(tmp_path, capsys, monkeypatch, hub, tiny_folder):
    folder = copy_with(tiny_folder, tmp_path / "m")
    for f in folder.glob("*.safetensors"):
        f.rename(f.with_suffix(".bin"))
    rc, _, err = init(capsys, monkeypatch, hub, folder, "--out", tmp_path / "r.yaml")
    assert rc == 1 and err.count("\n") == 1 and "source.allow_pickle: true" in err, err
    (folder / "config.json").unlink()
    rc, _, err = init(capsys, monkeypatch, hub, folder, "--out", tmp_path / "r.yaml")
    assert rc == 1 and err.count("\n") == 1 and "no config.json" in err, err


def test_init_never_overwrites(tmp_path, capsys, monkeypatch, hub, tiny_folder):
    out = tmp_path / "r.yaml"
    out.write_text("mine\n")
    rc, _, err = init(capsys, monkeypatch, hub, tiny_folder, "--out", out)
    assert rc == 1 and "exists: not overwritten" in err and out.read_text() == "mine\n"


def test_init_device_suggestions(tmp_path, capsys, monkeypatch, hub, tiny_folder):
    from pipeline.init import STOCK_QUANTS, inspect_source, suggest
    from pipeline.tools import find_toolchain

    tc = find_toolchain()
    src = inspect_source(str(tiny_folder), tc.convert_script, tc.build_number)
    from pipeline.recipe.devices import Device

    _, est = suggest(src, Device("x", "1T", 1 << 40, ctx=1024, arch="arm64"))
    assert [est[q] for q in STOCK_QUANTS] == sorted(est.values(), reverse=True)  # larger quant, more memory
    between = (est["Q6_K"] + est["Q5_K_M"]) // 2  # Q5_K_M fits, Q6_K does not
    out = tmp_path / "r.yaml"
    rc, _, err = init(capsys, monkeypatch, hub, tiny_folder, "--out", out, "--device", "big:64G",
                      "--device", f"mid:{between}:1024:arm64", "--device", "none:1M:1024")
    assert rc == 0, err
    r = load_recipe(out)
    assert [q.key for q in r.quants] == ["Q8_0", "Q5_K_M", "Q4_K_M"]
    text = out.read_text()
    assert "# big (64G, ctx 4096, x86_64): Q8_0, about" in text
    assert f"# mid ({between}, ctx 1024, arm64): Q5_K_M, about {est['Q5_K_M'] / (1 << 20):.0f} MiB" in text
    assert "# none (1M, ctx 1024, x86_64): no stock quant fits: Q2_K needs about" in text
    assert yaml.safe_load(text)["quants"] == ["Q8_0", "Q5_K_M", "Q4_K_M"]
    # the devices go into the recipe: the build's fit table and launch lines are made for them
    assert [(d.name, d.memory_bytes, d.ctx, d.arch) for d in r.devices] == [
        ("big", 64 << 30, 4096, "x86_64"), ("mid", between, 1024, "arm64"), ("none", 1 << 20, 1024, "x86_64")]
    rc, _, err = init(capsys, monkeypatch, hub, tiny_folder, "--out", tmp_path / "x.yaml", "--device", "pi:8G:4k")
    assert rc == 1 and "the context size: must be an integer 16..2147483647 (llama.cpp's n_ctx is an int32), got '4k'" in err
    rc, _, err = init(capsys, monkeypatch, hub, tiny_folder, "--out", tmp_path / "x.yaml", "--device", "Pi|5:8G")
    assert rc == 1 and "the name 'Pi|5' is not a device name" in err and not (tmp_path / "x.yaml").exists()


def test_init_bf16_checkpoint_gets_bf16_outtype(tmp_path, capsys, monkeypatch, hub, tiny_folder):
    from safetensors.torch import load_file, save_file

    folder = copy_with(tiny_folder, tmp_path / "m")
    (st,) = folder.glob("*.safetensors")
    save_file({k: v.bfloat16() for k, v in load_file(st).items()}, st, metadata={"format": "pt"})
    out = tmp_path / "r.yaml"
    rc, _, err = init(capsys, monkeypatch, hub, folder, "--out", out)
    assert rc == 0, err
    assert load_recipe(out).outtype == "bf16" and "outtype: bf16  # the checkpoint is BF16" in out.read_text()
