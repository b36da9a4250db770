"""Recipe ``devices:`` (issue #20 item 1): parsing and its one-line refusals, the publish stage's ``devices`` section
(fits, margins, the best quant, ``require`` failures, the arm64 repack warning) from synthetic predictions and from
generated header-only GGUFs (pipeline/memory.py reads only the header), and the "Fits on" tables of the
report and the card. No llama.cpp tools."""

from __future__ import annotations

import json
import struct

import pytest
import yaml

from pipeline.errors import GateFailure, RecipeError
from pipeline.gguf.types import GGML_TYPES
from pipeline.layout import Layout
from pipeline.memory import ARCH_FEATURES, KV_TYPES, predict_memory, repack_types
from pipeline.recipe import load_recipe
from pipeline.recipe.devices import Device
from pipeline.recipe.schema import section
from pipeline.stages.card import card_text
from pipeline.stages.evaluate import gate_messages
from pipeline.stages.publish import check_gates
from pipeline.stages.publish_sections import devices_section, fits_section
from pipeline.stages.report_devices import fits_table

SHA = "6b5982a638c6ed4e3da15711b6a5a1328c34a53e"
GIB, MIB = 1 << 30, 1 << 20


def _recipe(tmp_path, devices, name="m") -> dict:
    return {"name": name, "source": {"repo": "org/model", "revision": SHA}, "quants": ["Q8_0", "Q4_0"],
            "devices": devices}


def _load(tmp_path, devices, **kw):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(_recipe(tmp_path, devices, **kw), sort_keys=False), encoding="utf-8")
    return load_recipe(path)


# ------------------------------------------------------------------ parsing


def test_devices_are_parsed_with_their_defaults(tmp_path):
    r = _load(tmp_path, [{"name": "pi5-8g", "memory": "8G", "arch": "arm64-dotprod", "require": True},
                         {"name": "laptop", "memory": "6144M", "ctx": 8192, "kv_type": "Q8_0"},
                         {"name": "tiny", "memory": 536870912}])
    assert r.devices == (
        Device("pi5-8g", "8G", 8 * GIB, 4096, "f16", "arm64-dotprod", True),
        Device("laptop", "6144M", 6144 * MIB, 8192, "q8_0", "x86_64", False),
        Device("tiny", "536870912", 512 * MIB),
    )
    assert r.devices[0].describe() == {"memory_bytes": 8 * GIB, "ctx": 4096, "kv_type": "f16", "arch": "arm64-dotprod",
                                       "require": True, "threads": 4, "parallel": 1}
    assert _load(tmp_path, None).devices == ()


@pytest.mark.parametrize("devices,where,what", [
    ([{"name": "a", "memory": "8G", "arch": "riscv"}], "devices[0].arch", "'riscv' is not a CPU profile"),
    ([{"name": "a", "memory": "8 gigs"}], "devices[0].memory", "'8 gigs' is not a memory size"),
    ([{"name": "a", "memory": "0G"}], "devices[0].memory", "is not a memory size"),
    ([{"name": "a", "memory": True}], "devices[0].memory", "is not a memory size"),
    ([{"name": "a", "memory": "8G"}, {"name": "a", "memory": "4G"}], "devices[1].name", "'a' repeats devices[0]"),
    ([{"name": "a", "memory": "8G", "kv_type": "q3_k"}], "devices[0].kv_type", "'q3_k' is not a KV cache type"),
    ([{"name": "a", "memory": "8G", "ctx": 8}], "devices[0].ctx", "must be an integer 16..2147483647 (llama.cpp's n_ctx is an int32), got 8"),
    ([{"name": "A b", "memory": "8G"}], "devices[0].name", "is not a device name"),
    ([{"memory": "8G"}], "devices[0].name", "missing"),
    ([{"name": "a"}], "devices[0].memory", "missing"),
    ([{"name": "a", "memory": "8G", "require": "yes"}], "devices[0].require", "must be true or false"),
    ([{"name": "a", "memory": "8G", "vram": "8G"}], "devices[0].vram", "unknown key"),
    ({"name": "a", "memory": "8G"}, "devices", "must be a list"),
])
def test_refusals_are_one_line_naming_file_and_field(tmp_path, devices, where, what):
    with pytest.raises(RecipeError) as exc:
        _load(tmp_path, devices)
    assert exc.value.path == tmp_path / "r.yaml" and exc.value.field == where and what in exc.value.message, exc.value
    assert str(exc.value) == f"{tmp_path / 'r.yaml'}: {where}: {exc.value.message}"


def test_memory_units_are_fits():
    """G is 2^30 as in `ggufpipe fit --mem`, and the reference says so."""
    from pipeline.memory_profiles import parse_size

    assert parse_size("8G") == 8 * GIB
    assert "2^30" in next(f.doc for f in section("devices[]").fields if f.key == "memory")


def test_schema_lists_the_memory_models_profiles_and_kv_types():
    fields = {f.key: f for f in section("devices[]").fields}
    assert fields["arch"].type == " | ".join(f"`{a}`" for a in ARCH_FEATURES)
    assert fields["kv_type"].type == " | ".join(f"`{k}`" for k in (*KV_TYPES, "auto"))


# ------------------------------------------------------------------ the manifest section

FILES = [("F16", "base", 270 * MIB, "f16"), ("Q8_0", "quant", 145 * MIB, "q8"), ("Q4_K_M", "quant", 105 * MIB, "q4"),
         ("Q4_0", "quant", 95 * MIB, "q40")]
TOTALS = {"f16": 400 * MIB, "q8": 260 * MIB, "q4": 210 * MIB, "q40": 200 * MIB}


def _predict(repacked=()):
    def predict(path, d):
        return {"total": TOTALS[path], "details": {"repacked_tensors": ["blk.0.ffn_up.weight"] if path in repacked else []}}
    return predict


def test_fits_best_and_margins_from_synthetic_predictions():
    devs = [Device("big", "1G", GIB), Device("mid", "220M", 220 * MIB), Device("small", "100M", 100 * MIB)]
    section_, failures, warnings = fits_section("m", devs, FILES, _predict())
    assert failures == [] and warnings == []
    assert section_["big"] == {"memory_bytes": GIB, "ctx": 4096, "kv_type": "f16", "arch": "x86_64", "require": False,
                               "threads": 4, "parallel": 1,
                               "files": {k: {"total": TOTALS[p], "fits": True, "margin_bytes": GIB - TOTALS[p]}
                                         for k, _, _, p in FILES},
                               "best": "Q8_0"}  # the largest quant by file bytes; never the base
    assert section_["mid"]["best"] == "Q4_K_M"
    assert section_["mid"]["files"]["Q8_0"] == {"total": 260 * MIB, "fits": False, "margin_bytes": -40 * MIB}
    assert section_["small"]["best"] is None
    assert json.loads(json.dumps(section_)) == section_


def test_require_without_a_fitting_quant_is_a_failure():
    devs = [Device("small", "100M", 100 * MIB, ctx=2048, kv_type="q8_0", arch="arm64", require=True),
            Device("ok", "1G", GIB, require=True)]
    _, failures, _ = fits_section("m", devs, FILES, _predict(repacked={"q40"}))
    assert len(failures) == 1
    f = failures[0]
    assert f["check"] == "device" and f["device"] == "small"
    assert f["message"] == ("device does not fit: recipe m, device small (100M, 100.0 MiB; ctx 2048, KV q8_0, arm64): "
                            "no published quant fits; the smallest, Q4_0, needs 200.0 MiB (100.0 MiB more)")
    _, failures, _ = fits_section("m", devs[:1], FILES[:1], _predict())  # every quant rejected: none published
    assert failures[0]["message"].endswith("no quant was published")


def test_required_device_fails_check_gates(tmp_path):
    _, failures, _ = fits_section("m", [Device("small", "100M", 100 * MIB, require=True)], FILES, _predict())
    manifest = {"build_id": "m-0", "artifacts": [], "rejected": [], "failures": failures}
    assert gate_messages(manifest) == [failures[0]["message"]]
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    with pytest.raises(GateFailure) as exc:
        check_gates(path, tmp_path / "ok")
    assert [(c["check"], c["device"]) for c in exc.value.checks] == [("device", "small")] and exc.value.published == 0
    assert not (tmp_path / "ok").exists()


def test_arm64_warning_only_when_no_quant_is_repacked():
    for arch in ("arm64", "arm64-dotprod"):
        sec, _, warnings = fits_section("m", [Device("pi", "8G", 8 * GIB, arch=arch)], FILES, _predict())
        w = sec["pi"]["warning"]
        assert warnings == [f"recipe m, device pi: {w}"]
        assert all(t in w for t in ("Q4_0", "IQ4_NL", "Q4_K", "Q8_0")) and arch in w
        assert ", ".join(repack_types(arch)) in w
    sec, _, warnings = fits_section("m", [Device("pi", "8G", 8 * GIB, arch="arm64")], FILES, _predict({"q40"}))
    assert "warning" not in sec["pi"] and warnings == []
    # the base alone repacked does not count; an x86 profile never warns
    sec, _, _ = fits_section("m", [Device("pi", "8G", 8 * GIB, arch="arm64")], FILES, _predict({"f16"}))
    assert "warning" in sec["pi"]
    sec, _, _ = fits_section("m", [Device("pc", "8G", 8 * GIB, arch="generic")], FILES, _predict())
    assert "warning" not in sec["pc"]


# ------------------------------------------------------------------ generated GGUFs (header only)

TYPE_ID = {name: tid for tid, (name, _, _) in GGML_TYPES.items()}


def _s(text: str) -> bytes:
    return struct.pack("<Q", len(text.encode())) + text.encode()


def write_gguf(path, wtype: str, n_layer=2, n_embd=256, n_ff=512, n_vocab=512):
    """A llama GGUF v3 with tokens and tensor infos; the matmul weights of type ``wtype``, data zeros."""
    kvs = b"".join([
        _s("general.architecture") + struct.pack("<I", 8) + _s("llama"),
        *(_s(f"llama.{k}") + struct.pack("<II", 4, v) for k, v in (
            ("block_count", n_layer), ("embedding_length", n_embd), ("attention.head_count", 8),
            ("attention.head_count_kv", 2), ("feed_forward_length", n_ff))),
        _s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, n_vocab) + b"".join(_s(f"t{i}") for i in range(n_vocab)),
    ])
    tensors = [("token_embd.weight", (n_embd, n_vocab), "F16"), ("output_norm.weight", (n_embd,), "F32")]
    for il in range(n_layer):
        tensors += [(f"blk.{il}.attn_q.weight", (n_embd, n_embd), wtype), (f"blk.{il}.attn_k.weight", (n_embd, 64), wtype),
                    (f"blk.{il}.attn_v.weight", (n_embd, 64), wtype), (f"blk.{il}.attn_output.weight", (n_embd, n_embd), wtype),
                    (f"blk.{il}.ffn_up.weight", (n_embd, n_ff), wtype), (f"blk.{il}.ffn_down.weight", (n_ff, n_embd), wtype)]
    infos, offset = b"", 0
    for name, shape, tname in tensors:
        _, blck, tsize = GGML_TYPES[TYPE_ID[tname]]
        n = 1
        for d in shape:
            n *= d
        infos += _s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        infos += struct.pack("<IQ", TYPE_ID[tname], offset)
        offset += (n // blck * tsize + 31) // 32 * 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 7) + kvs + infos
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head + b"\0" * ((-len(head)) % 32) + b"\0" * offset)
    return path


def test_devices_section_predicts_on_the_whole_ggufs(tmp_path):
    r = _load(tmp_path, [{"name": "pi", "memory": "64M", "ctx": 512, "arch": "arm64", "require": True},
                         {"name": "pc", "memory": "1G", "kv_type": "q8_0"}])
    L = Layout(tmp_path / "artifacts", tmp_path / "work")
    arts = []
    for key, wtype, role in (("F16", "F16", "base"), ("Q8_0", "Q8_0", "quant"), ("Q4_0", "Q4_0", "quant")):
        p = write_gguf(L.gguf("m", key), wtype)
        arts.append({"file": f"m-{key}.gguf", "role": role, "size_bytes": p.stat().st_size})
    # a split quant is listed by its folder, predicted on its whole GGUF in work/
    arts[2] = {**arts[2], "file": "m-Q4_0", "split": {"count": 2}}
    sec, failures, warnings = devices_section(r, L, arts)
    assert list(sec) == ["pi", "pc"] and failures == [] and warnings == []  # Q4_0 and Q8_0 repack on arm64
    for dev in r.devices:
        for key in ("F16", "Q8_0", "Q4_0"):
            want = predict_memory(L.gguf("m", key), dev.ctx, kv_type=dev.kv_type, arch=dev.arch)["total"]
            assert sec[dev.name]["files"][key] == {"total": want, "fits": want <= dev.memory_bytes,
                                                   "margin_bytes": dev.memory_bytes - want}
    assert sec["pc"]["best"] == "Q8_0" and sec["pi"]["best"] == "Q8_0"
    assert sec == devices_section(r, L, arts)[0]  # deterministic
    # Q5_0 tensors are repacked on no profile: an arm64 device gets the warning
    r2 = _load(tmp_path, [{"name": "pi", "memory": "8G", "arch": "arm64"}])
    write_gguf(L.gguf("m", "Q5_0"), "Q5_0")
    sec, _, warnings = devices_section(r2, L, [arts[0], {"file": "m-Q5_0.gguf", "role": "quant", "size_bytes": 1}])
    assert sec["pi"]["best"] == "Q5_0" and "warning" in sec["pi"] and len(warnings) == 1
    assert devices_section(_load(tmp_path, None), L, arts) == ({}, [], [])  # no devices: nothing


# ------------------------------------------------------------------ report and card


def _manifest():
    devs = [Device("pi5", "220M", 220 * MIB, arch="arm64", require=True), Device("pc", "1G", GIB)]
    sec, failures, _ = fits_section("m", devs, FILES, _predict())
    return {"name": "m", "build_id": "m-0123456789ab", "tools": {"llama_cpp_build": 11312, "llama_cpp_commit": "abc"},
            "source": {}, "artifacts": [], "rejected": [], "devices": sec, "failures": failures}


def test_report_fits_table():
    text = fits_table(_manifest())
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| device |"))
    assert lines[head] == "| device | memory | ctx | KV | CPU | F16 | Q8_0 | Q4_K_M | Q4_0 | best |"
    assert lines[head + 2] == ("| pi5 (required) | 220 MiB | 4096 | f16 | arm64 | ✗ 400 MiB | ✗ 260 MiB | ✓ 210 MiB | "
                               "✓ 200 MiB | `m-Q4_K_M` (210 MiB) |")
    assert lines[head + 3].startswith("| pc | 1.0 GiB | 4096 | f16 | x86_64 | ✓ 400 MiB |")
    assert lines[head + 3].endswith("| `m-Q8_0` (260 MiB) |")
    assert any(line.startswith("Warning (pi5): no published quant has a tensor") for line in lines)
    m = _manifest()
    m["devices"]["pi5"]["files"]["Q4_0"]["fits"] = m["devices"]["pi5"]["files"]["Q4_K_M"]["fits"] = False
    m["devices"]["pi5"]["best"] = None
    assert "none fits" in fits_table(m)
    assert fits_table({"name": "m"}) == ""


def test_card_has_the_short_table_only_with_devices():
    card = card_text(_manifest())
    part = card[card.index("## Fits on"):]
    assert "| device | memory | ctx | KV | CPU | best file (predicted memory) |" in part
    assert "| pi5 | 220 MiB | 4096 | f16 | arm64 | `m-Q4_K_M` (210 MiB) |" in part
    assert "✗" not in part  # the short version: no per-file cells
    m = _manifest()
    del m["devices"], m["failures"]
    assert "Fits on" not in card_text(m)
