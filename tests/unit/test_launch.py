"""A device's launch line (pipeline/launch.py, issue #30 item 4) on generated header-only GGUFs: the largest
power-of-two context that fits, the slots, the draft's weights and KV counted, the draft left out when it costs the
device's context, no line when nothing fits, and the recipe keys' one-line refusals. No llama.cpp tools."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from helpers import recipe_error

from pipeline.launch import CTX_MIN, MIB, launch, server_memory
from pipeline.memory import ModelShape
from pipeline.recipe.devices import Device
from pipeline.stages.report_devices import launch_table
from unit.test_memory_model import llama_like

SHA = "6b5982a638c6ed4e3da15711b6a5a1328c34a53e"
TRAINED = 8192


@pytest.fixture
def files(tmp_path):
    ctx = {".context_length": TRAINED}
    main = llama_like(tmp_path, "main.gguf", n_layer=8, n_embd=512, n_head=8, n_head_kv=8, n_ff=1024, extra=ctx)
    draft = llama_like(tmp_path, "draft.gguf", n_layer=2, n_embd=256, n_head=4, n_head_kv=4, n_ff=512, extra=ctx)
    return main, draft


def _device(memory_bytes: int, **kw) -> Device:
    return Device(name="dev", memory=f"{memory_bytes}", memory_bytes=memory_bytes, **kw)


def _draft(path):
    return {"file": "draft.gguf", "path": path, "label": "main.gguf + draft.gguf", "speedup": 1.8,
            "spec": ["-md", "draft.gguf", "--spec-type", "draft-simple", "--spec-draft-n-max", "4"]}


def _need(path, ctx, dev, draft=None) -> int:
    return server_memory(ModelShape.from_gguf(path), ctx, dev, ModelShape.from_gguf(draft) if draft else None)["total"]


def test_the_largest_power_of_two_that_fits(files):
    main, _ = files
    probe = _device(1 << 40)
    # memory between what -c 2048 and -c 4096 need: the line says 2048, and its prediction is within the memory
    mem = (_need(main, 2048, probe) + _need(main, 4096, probe)) // 2
    e = launch(_device(mem), [("main.gguf", main)], {})
    assert e["ctx"] == 2048 and e["memory"]["total"] <= mem < _need(main, 4096, probe)
    assert e["line"] == f"llama-server -m main.gguf -c 2048 -np 1 -t 4 --cache-ram {(mem - e['memory']['total']) // MIB}"
    # plenty of memory: the trained context, not more; --cache-ram at most the server's default 8192 MiB
    big = launch(_device(64 << 30), [("main.gguf", main)], {})
    assert big["ctx"] == TRAINED and big["cache_ram_mib"] == 8192 and big["gpu"] is None


def test_slots_share_the_context_and_each_keeps_a_row_of_logits(files):
    main, _ = files
    one, four = _device(64 << 30), _device(64 << 30, parallel=4, threads=6)
    e = launch(four, [("main.gguf", main)], {})
    assert (e["ctx"], e["ctx_per_slot"]) == (4 * TRAINED, TRAINED) and " -np 4 -t 6 " in e["line"]
    # the same -c with four slots: the same KV cells, three more rows of logits (n_vocab floats each)
    assert _need(main, 4096, replace(four, threads=4)) - _need(main, 4096, one) == 3 * 1000 * 4


def test_the_draft_counts_its_weights_and_kv(files):
    main, draft = files
    probe = _device(1 << 40)
    with_draft = _need(main, TRAINED, probe, draft)
    assert with_draft - _need(main, TRAINED, probe) > (draft.stat().st_size * 9) // 10  # its weights, at least
    e = launch(_device(with_draft + 64 * MIB), [("main.gguf", main)], {"main.gguf": _draft(draft)})
    assert e["ctx"] == TRAINED and e["draft"] == {"label": "main.gguf + draft.gguf", "speedup": 1.8}
    assert e["line"].startswith("llama-server -m main.gguf -md draft.gguf --spec-type draft-simple "
                                "--spec-draft-n-max 4 -c 8192 -np 1 -t 4 --cache-ram ")
    # quantized KV: -ctk/-ctv for the main model, -ctkd/-ctvd for the draft's own cache
    q = launch(_device(64 << 30, kv_type="q8_0"), [("main.gguf", main)], {"main.gguf": _draft(draft)})
    assert " -ctk q8_0 -ctv q8_0 -ctkd q8_0 -ctvd q8_0 " in q["line"]


def test_a_draft_that_costs_the_device_its_context_is_left_out(files):
    main, draft = files
    probe = _device(1 << 40)
    mem = _need(main, 4096, probe) + MIB  # the main file alone fits ctx 4096; with the draft only less
    assert _need(main, 4096, probe, draft) > mem
    e = launch(_device(mem), [("main.gguf", main)], {"main.gguf": _draft(draft)})
    assert e["draft"] is None and "-md" not in e["line"] and e["ctx"] == 4096
    assert e["note"].startswith("the draft draft.gguf is left out: with it main.gguf fits only -c ")


def test_no_line_when_nothing_fits(files):
    main, _ = files
    e = launch(_device(64 << 20), [], {})
    assert e["line"] is None and e["why"] == "no published quant fits 67108864 at ctx 4096 (KV f16, x86_64): see the fit table"
    small = _need(main, CTX_MIN, _device(1 << 40)) - 1  # a candidate the server cannot start even at 256 cells
    e = launch(_device(small), [("main.gguf", main)], {})
    assert e["line"] is None and "256 cells per slot" in e["why"]
    table = launch_table({"build": {"launch": {"dev": e}}})
    assert f"| dev | no line: {e['why']} | – |" in table


def test_a_smaller_quant_when_the_largest_does_not_start(files, tmp_path):
    main, _ = files
    q4 = llama_like(tmp_path, "q4.gguf", n_layer=8, n_embd=512, n_head=8, n_head_kv=8, n_ff=1024, wtype="Q4_0",
                    extra={".context_length": TRAINED})
    mem = _need(q4, 1024, _device(1 << 40))  # Q4_0 fits at 1024; F16 at none
    assert _need(main, CTX_MIN, _device(1 << 40)) > mem
    e = launch(_device(mem), [("main.gguf", main), ("q4.gguf", q4)], {})
    assert e["file"] == "q4.gguf" and e["ctx"] == 1024


@pytest.mark.parametrize("field,value,what", [
    ("parallel", 0, "must be an integer 1..256 (llama-server -np; llama.cpp's LLAMA_MAX_SEQ), got 0"),
    ("threads", 0, "must be an integer 1..512 (ggml's GGML_MAX_N_THREADS), got 0"),
    ("threads", 2.5, "must be an integer 1..512 (ggml's GGML_MAX_N_THREADS), got 2.5"),
    ("parallel", True, "must be an integer 1..256 (llama-server -np; llama.cpp's LLAMA_MAX_SEQ), got True"),
])
def test_bad_slots_or_threads_one_line(tmp_path, field, value, what):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "m", "source": {"repo": "org/m", "revision": SHA}, "quants": ["Q8_0"],
                                    "devices": [{"name": "pi", "memory": "8G", field: value}]}))
    exc = recipe_error(path)
    assert exc.field == f"devices[0].{field}" and exc.message == what, exc


def test_the_demo_declares_edge_devices():
    """make demo's card shows the fit table and a launch line per device (recipes/smollm2-135m.yaml)."""
    from pipeline.recipe import load_recipe
    r = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m.yaml")
    assert [(d.name, d.arch, d.parallel) for d in r.devices] == [
        ("pi5-8g", "arm64-dotprod", 1), ("phone-4g", "arm64", 1), ("laptop-16g", "x86_64", 2)]
    assert [d.memory_bytes for d in r.devices] == [6 << 30, 2 << 30, 12 << 30]


def test_a_jetson_line_offloads_every_layer_without_mmap(files):
    main, draft = files
    e = launch(_device(64 << 30, arch="jetson-orin"), [("main.gguf", main)], {"main.gguf": _draft(draft)})
    assert " -ngl 999 -ngld 999 --no-mmap --cache-ram " in e["line"]
    assert e["gpu"]["cuda_arch"] == "87" and e["gpu"]["mmap"] is False and "derived" in e["gpu"]["memory"]
    cpu = launch(_device(64 << 30, arch="arm64-dotprod"), [("main.gguf", main)], {})
    assert cpu["gpu"] is None and "-ngl" not in cpu["line"] and "--no-mmap" not in cpu["line"]
    # the MTP heads live in the main file: no -ngld
    mtp = launch(_device(64 << 30, arch="jetson-xavier"), [("main.gguf", main)], {"main.gguf": _draft(None)})
    assert " -ngl 999 --no-mmap " in mtp["line"] and "-ngld" not in mtp["line"] and mtp["gpu"]["cuda_arch"] == "72"
