"""The llama.cpp backend of the tools (pipeline/tools_backend.py, docs/gpu.md): the CPU cache folder keeps its
name, CUDA is opt-in with explicit architectures, ``-ngl`` only on a GPU backend, and rebuild-check refuses a
rebuild on another backend while no GPU measurement backs the tolerances. No llama.cpp tools, no GPU."""

from __future__ import annotations

import hashlib
import json

import pytest

from pipeline import tools, tools_backend, tools_install
from pipeline.distribution import rebuild
from pipeline.errors import PipelineError

# The CPU folder CI restores from its cache (a new CPU key would cost a 6-minute rebuild): update only with a
# deliberate change of what shapes the CPU tools (a target, a flag, a helper's source).
CPU_FOLDER = "b11312-0c1e570-ef8076cc00f9"


def test_cpu_key_and_folder_unchanged():
    assert tools.cache_key() == CPU_FOLDER.rsplit("-", 1)[1]
    assert tools.pinned_name() == tools.pinned_name("cpu", None) == CPU_FOLDER
    # the key's spec for the CPU is the one from before backends existed: no backend, no architectures
    spec = {"build": tools.PINNED_BUILD, "commit": tools.PINNED_COMMIT, "sdist_sha256": tools.SDIST_SHA256,
            "tools": list(tools.TOOLS), "cmake_flags": list(tools.CMAKE_FLAGS), "assets": list(tools.ASSETS),
            "helpers": tools.helper_sources(), "helper_cmake": tools.HELPER_CMAKE}
    assert tools.cache_key() == hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    assert not any("CUDA" in f for f in tools.CMAKE_FLAGS)


def test_cuda_folder_keyed_by_backend_and_archs():
    k90, k86_90 = tools.cache_key(None, "cuda", "90"), tools.cache_key(None, "cuda", "86;90")
    assert len({tools.cache_key(), k90, k86_90}) == 3
    assert tools.cache_key(None, "cuda", "86,90") == tools.cache_key(None, "cuda", " 86 ; 90 ") == k86_90
    assert tools.pinned_name("cuda", "90") == f"b11312-0c1e570-cuda-{k90}"


@pytest.mark.parametrize("archs", [None, "", "native", "all", "all-major", "sm_90"])
def test_cuda_needs_explicit_archs(archs):
    with pytest.raises(PipelineError, match="CUDA architectures|CUDA_ARCHS=90"):
        tools_backend.normalize_archs("cuda", archs)
    with pytest.raises(PipelineError):
        tools.cache_key(None, "cuda", archs)


def test_archs_refused_for_cpu_and_unknown_backend():
    with pytest.raises(PipelineError, match="only for --backend cuda"):
        tools_backend.normalize_archs("cpu", "90")
    with pytest.raises(PipelineError, match="not one of cpu, cuda"):
        tools_backend.normalize_archs("metal", None)


def _print_cmake(capsys, *argv: str) -> tuple[int, list[str], str]:
    rc = tools_install.main(["install", *argv, "--print-cmake", "-j", "3"])
    got = capsys.readouterr()
    return rc, got.out.splitlines(), got.err


def test_print_cmake_cuda(capsys):
    rc, lines, _ = _print_cmake(capsys, "--backend", "cuda", "--cuda-archs", "90")
    assert rc == 0 and len(lines) == 2
    configure, build = lines
    assert configure.startswith("cmake -S ") and "-DGGML_CUDA=ON" in configure.split()
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in configure.split()
    assert f"-cuda-{tools.cache_key(None, 'cuda', '90')}/build" in configure
    assert build.startswith("cmake --build ") and "-j 3" in build and "llama-perplexity" in build


def test_print_cmake_cpu_is_todays_command(capsys):
    rc, lines, _ = _print_cmake(capsys)
    assert rc == 0
    configure = lines[0].split()
    assert configure[5:] == list(tools.CMAKE_FLAGS)  # cmake -S SRC -B BUILD, then exactly the CPU flags
    assert not any("CUDA" in w for line in lines for w in line.split())
    assert f".build-{CPU_FOLDER}/build" in lines[0]


def test_print_cmake_cuda_without_archs_one_line(capsys):
    rc, lines, err = _print_cmake(capsys, "--backend", "cuda")
    assert rc == 1 and lines == []
    assert err.count("\n") == 1 and "make tools BACKEND=cuda CUDA_ARCHS=90" in err


def test_ngl_only_on_gpu_backends():
    args = ["-m", "m.gguf", "-f", "t.txt"]
    for name in (*tools.TOOLS, *tools.HELPERS):
        assert tools_backend.tool_argv(name, args, "cpu", 0) == args
    assert tools_backend.tool_argv("llama-perplexity", args, "cuda", 999) == [*args, "-ngl", "999"]
    for name in ("llama-imatrix", "llama-bench"):
        assert tools_backend.tool_argv(name, args, "cuda", 12)[-2:] == ["-ngl", "12"]
    spec = tools_backend.tool_argv("llama-speculative-simple", args, "cuda", 7)
    assert spec == [*args, "-ngl", "7", "-ngld", "7"]
    for name in ("llama-quantize", "llama-gguf-split", "llama-tokenize"):  # never compute on a GPU
        assert tools_backend.tool_argv(name, args, "cuda", 999) == args
    given = [*args, "-ngl", "3"]
    assert tools_backend.tool_argv("llama-perplexity", given, "cuda", 999) == given  # the caller's own -ngl kept


def test_selected_backend_and_ngl(monkeypatch):
    monkeypatch.delenv(tools_backend.BACKEND_ENV, raising=False)
    monkeypatch.delenv(tools_backend.NGL_ENV, raising=False)
    assert tools_backend.selected_backend() == "cpu" and tools_backend.selected_ngl("cpu") == 0
    assert tools_backend.selected_ngl("cuda") == 999
    monkeypatch.setenv(tools_backend.NGL_ENV, "20")
    assert tools_backend.selected_ngl("cuda") == 20 and tools_backend.selected_ngl("cpu") == 0
    monkeypatch.setenv(tools_backend.NGL_ENV, "all")
    with pytest.raises(PipelineError, match="GGUFPIPE_NGL"):
        tools_backend.selected_ngl("cuda")
    monkeypatch.setenv(tools_backend.BACKEND_ENV, "rocm")
    with pytest.raises(PipelineError, match="GGUFPIPE_BACKEND=rocm"):
        tools_backend.selected_backend()


def test_describe(tmp_path):
    cpu = tools.Toolchain(tmp_path, tmp_path, tmp_path / "c.py", tmp_path, 11312, "0c1e570", "pinned")
    assert cpu.describe() == {"llama_cpp_build": 11312, "llama_cpp_commit": "0c1e570", "origin": "pinned",
                              "backend": "cpu"}
    gpu = tools.Toolchain(tmp_path, tmp_path, tmp_path / "c.py", tmp_path, 11312, "0c1e570", "pinned", "cuda", 999)
    assert gpu.describe() == {**cpu.describe(), "backend": "cuda", "ngl": 999}


def test_device_description(monkeypatch, tmp_path):
    assert tools_backend.device_description("cpu") == "cpu"
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H200'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert tools_backend.device_description("cuda") == "cuda: NVIDIA H200"
    fake.unlink()
    assert tools_backend.device_description("cuda") == "cuda: unknown"


def test_find_toolchain_cuda_missing_says_how(monkeypatch):
    monkeypatch.setenv(tools_backend.BACKEND_ENV, "cuda")
    with pytest.raises(PipelineError) as exc:
        tools.find_toolchain()
    assert "make tools BACKEND=cuda CUDA_ARCHS=" in str(exc.value) and "\n" not in str(exc.value)


def _install(parent, name: str, archs: str) -> None:
    (parent / name).mkdir(parents=True)
    (parent / name / "toolchain.json").write_text(json.dumps({"backend": "cuda", "cuda_archs": archs}))


def test_installed_dir(tmp_path, monkeypatch):
    monkeypatch.delenv(tools_backend.ARCHS_ENV, raising=False)

    def name_for(archs: str) -> str:
        return f"b1-c-cuda-key{archs.replace(';', '_')}"

    assert tools_backend.installed_dir(tmp_path, "cuda", name_for) is None
    _install(tmp_path, "b1-c-cuda-stale", "90")  # an older key of the same archs: not this code's folder
    assert tools_backend.installed_dir(tmp_path, "cuda", name_for) is None
    _install(tmp_path, name_for("90"), "90")
    assert tools_backend.installed_dir(tmp_path, "cuda", name_for) == tmp_path / name_for("90")
    _install(tmp_path, name_for("86;90"), "86;90")
    with pytest.raises(PipelineError, match="GGUFPIPE_CUDA_ARCHS"):
        tools_backend.installed_dir(tmp_path, "cuda", name_for)
    monkeypatch.setenv(tools_backend.ARCHS_ENV, "86,90")
    assert tools_backend.installed_dir(tmp_path, "cuda", name_for) == tmp_path / name_for("86;90")


def _manifest(backend: str | None) -> dict:
    tools_section = {"llama_cpp_build": 11312, "llama_cpp_commit": "0c1e570", "origin": "pinned"}
    if backend:
        tools_section["backend"] = backend
    return {"tools": tools_section,
            "artifacts": [{"file": "m-F16.gguf"}, {"file": "m-Q4_K_M.gguf", "calibration": {}},
                          {"file": "m-Q4_K_M_IMAT.gguf", "calibration": {"imatrix": {"entries": 1}}}],
            "rejected": [{"file": "m-Q2_K_AWQ.gguf", "calibration": {"awq": {"device": "cuda"}}},
                         {"file": "m-Q3_K_M_MIX.gguf", "mix": {"map": "m.map"}}]}


def test_byte_identical_rule():
    m = _manifest("cpu")
    assert [rebuild.byte_identical_across_backends(e) for e in m["artifacts"] + m["rejected"]] == \
        [True, True, False, False, False]


def test_rebuild_check_refuses_another_backend():
    assert rebuild.CROSS_BACKEND_TOLERANCES is None  # unmeasured: bench/gpu/run.sh has not run on a GPU
    assert rebuild.backend_refusal(_manifest(None), "cpu") is None  # older manifests: cpu
    assert rebuild.backend_refusal(_manifest("cuda"), "cuda") is None
    line = rebuild.backend_refusal(_manifest(None), "cuda")
    assert line is not None and "\n" not in line
    assert "cuda backend here, the manifest records cpu" in line
    assert "3 file(s) made with an imatrix, AWQ or a measured mix" in line and "the 2 made without" in line
    assert "bench/RESULTS.md" in line and "GGUFPIPE_BACKEND=cpu" in line
    assert "manifest records cuda" in rebuild.backend_refusal(_manifest("cuda"), "cpu")


def test_rebuild_check_allows_other_backend_once_measured(monkeypatch):
    monkeypatch.setattr(rebuild, "CROSS_BACKEND_TOLERANCES", {"ppl_rel": 1e-3})
    assert rebuild.backend_refusal(_manifest("cuda"), "cpu") is None


def _workflow(backend: str, ngl: int, recipe):
    from types import SimpleNamespace

    from pipeline.workflow import Workflow

    w = Workflow.__new__(Workflow)  # the triggers read only these attributes
    w.toolchain = SimpleNamespace(backend=backend, ngl=ngl, build_number=11312, commit="0c1e570")
    w.recipes, w.eval_threads, w.calib_threads, w.quantized_by = {recipe.name: recipe}, 2, 2, "ggufpipe"
    return w


def test_a_backend_switch_reruns_the_stages_llama_cpp_computes_and_not_the_others(tmp_path):
    import yaml

    from pipeline.recipe import load_recipe

    text = tmp_path / "t.txt"
    text.write_text("x " * 4200)  # 16 x 512 tokens fit
    (tmp_path / "c.txt").write_text("calibration " * 1400)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "m", "source": {"repo": "org/m", "revision": "a" * 40}, "quants": ["Q8_0"],
                                    "gates": [{"name": "g", "text": str(text), "ctx": 512, "chunks": 16}],
                                    "imatrix": {"calibration": str(tmp_path / "c.txt")}}))
    r = load_recipe(path)
    cpu, cuda = _workflow("cpu", 0, r), _workflow("cuda", 999, r)
    assert json.loads(cpu.trigger("eval_base", "m", es="g")) == {"text": str(text), "ctx": 512, "chunks": 16,
                                                                  "eval_threads": 2, "build": 11312, "offload": []}
    computed = {"eval_base": {"es": "g"}, "eval": {"es": "g", "quant": "Q8_0"}, "imatrix": {"base": "plain"},
                "device_slice": {}, "bench": {"bkey": "Q8_0"}}  # device slice: through the eval set's base logits
    for rule, wc in computed.items():
        assert cuda.trigger(rule, "m", **wc) != cpu.trigger(rule, "m", **wc), rule
        assert '"cuda", 999' in cuda.trigger(rule, "m", **wc), rule
    for rule, wc in {"quantize": {"quant": "Q8_0"}, "fetch": {}, "convert": {"outtype": "F16"}}.items():
        assert cuda.trigger(rule, "m", **wc) == cpu.trigger(rule, "m", **wc), rule  # llama.cpp computes no numbers


def test_the_manifest_records_the_backend_of_this_run(monkeypatch):
    from pipeline.stages.publish import offload

    monkeypatch.delenv("GGUFPIPE_BACKEND", raising=False)
    assert offload() == {"backend": "cpu"}
    monkeypatch.setenv("GGUFPIPE_BACKEND", "cuda")
    monkeypatch.setenv("GGUFPIPE_NGL", "20")
    assert offload() == {"backend": "cuda", "ngl": 20}
