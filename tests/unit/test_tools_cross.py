"""Device CPU profiles and the aarch64 tools (pipeline/tools_cross.py, issue #34): every profile's flags agree with
the features it promises, an aarch64 build without a profile is refused, the cross build's cache folder is keyed by its
profile, and the feature check names the profile and the feature. No llama.cpp tools, no compiler runs here but
``aarch64-linux-gnu-g++ --version`` (the cache key)."""

from __future__ import annotations

import re
import shutil

import pytest

from pipeline import tools, tools_cross, tools_install
from pipeline.devices.check import buffers
from pipeline.devices.collect import check_result
from pipeline.errors import PipelineError
from pipeline.memory_profiles import ARCH_FEATURES

# the march extension -> the system_info name ggml prints when it is compiled in (ggml-cpu.cpp:585-605)
EXTENSION_FEATURE = {"dotprod": "DOTPROD", "fp16": "FP16_VA", "i8mm": "MATMUL_INT8"}
needs_cross = pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None,
                                 reason=f"no aarch64 cross compiler: apt-get install {tools_cross.DEBIAN_PACKAGES}")


@pytest.mark.parametrize("name", sorted(tools_cross.PROFILES))
def test_profile_flags_promise_what_it_checks(name):
    p = tools_cross.PROFILES[name]
    extensions = set(p.march.split("+")[1:])
    assert {EXTENSION_FEATURE[e] for e in extensions} == set(p.features) - {"NEON", "ARM_FMA"}
    assert p.fit_arch in ARCH_FEATURES
    # the memory model's repack profile asks for the same features the build has
    fit = ARCH_FEATURES[p.fit_arch]
    assert ("dotprod" in fit) == ("dotprod" in extensions) and ("i8mm" in fit) == ("i8mm" in extensions)
    assert p.baseline == (not extensions)
    assert p.qemu_cpu != "max"  # max accepts what any core lacks: it would hide a wrong profile
    assert p.qemu_cpu or p.qemu_note


def test_jetson_profiles_name_their_cpu():
    assert tools_cross.JETSON["orin"].cuda_arch == "87" and tools_cross.JETSON["orin"].cpu == "cortex-a78ae"
    assert tools_cross.JETSON["xavier"].cuda_arch == "72" and tools_cross.JETSON["xavier"].cuda == "11.4"
    assert tools_cross.profile("orin") is tools_cross.PROFILES["cortex-a78ae"]


def _install(capsys, *argv):
    rc = tools_install.main(["install", *argv])
    got = capsys.readouterr()
    return rc, got.out.splitlines(), got.err


def test_aarch64_without_profile_refused_saying_why(capsys):
    rc, out, err = _install(capsys, "--arch", "aarch64", "--print-cmake")
    assert rc == 1 and out == [] and err.count("\n") == 1
    assert "needs PROFILE=" in err and "no dotprod" in err and "PROFILE=armv8-a" in err


@pytest.mark.parametrize("argv, match", [
    (["--arch", "aarch64", "--profile", "cortex-a77"], "PROFILE=cortex-a77: not a device profile"),
    (["--profile", "cortex-a76"], "add ARCH=aarch64"),
    (["--arch", "aarch64", "--profile", "orin"], "JetPack 6's CUDA 12.2-12.6 \\(sm_87\\)"),
    (["--arch", "aarch64", "--profile", "cortex-a76", "--backend", "cuda", "--cuda-archs", "87"], "CPU only"),
])
def test_bad_targets_one_line(capsys, argv, match):
    rc, out, err = _install(capsys, *argv, "--print-cmake")
    assert rc == 1 and err.count("\n") == 1
    assert re.search(match, err), err


@needs_cross
def test_cross_cmake_lines_and_folder(capsys):
    rc, lines, _ = _install(capsys, "--arch", "aarch64", "--profile", "cortex-a76", "--print-cmake", "-j", "3")
    assert rc == 0 and len(lines) == 2
    configure, build = (line.split() for line in lines)
    assert configure[5:] == [*tools.CMAKE_FLAGS, *tools_cross.cross_flags(tools_cross.PROFILES["cortex-a76"])]
    assert "-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16" in configure and "-DGGML_NATIVE=OFF" in configure
    assert build[build.index("--target") + 1:] == list(tools_cross.DEVICE_TOOLS)
    folder = tools_install.cross_dir(tools_cross.PROFILES["cortex-a76"]).name
    assert folder.startswith("b11312-0c1e570-aarch64-cortex-a76-") and f".build-{folder}/" in lines[0]


@needs_cross
def test_cross_folders_keyed_by_profile():
    names = {tools_install.cross_dir(p).name.rsplit("-", 1)[1] for p in tools_cross.PROFILES.values()}
    assert len(names) == len(tools_cross.PROFILES)
    # the A78AE's flags equal the A76's, its folder does not: a profile names the devices a build is for
    assert tools_install.cross_dir(tools_cross.PROFILES["cortex-a78ae"]) != tools_install.cross_dir(
        tools_cross.PROFILES["cortex-a76"])


def test_baseline_by_name_says_why(capsys, monkeypatch):
    monkeypatch.setattr(tools_install, "print_cmake", lambda *a, **k: None)
    rc, out, _ = _install(capsys, "--arch", "aarch64", "--profile", "armv8-a", "--print-cmake")
    assert rc == 0 and any("asked for by name" in line and "no dotprod" in line for line in out)


def test_arm_build_box_gets_the_profile(monkeypatch):
    monkeypatch.setattr(tools_cross.platform, "machine", lambda: "aarch64")
    monkeypatch.delenv(tools_cross.PROFILE_ENV, raising=False)
    with pytest.raises(PipelineError, match="needs PROFILE="):
        tools.cache_key()
    monkeypatch.setenv(tools_cross.PROFILE_ENV, "cortex-a76")
    a76 = tools.cache_key()
    assert "-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16" in tools_install.cmake_flags()
    monkeypatch.setenv(tools_cross.PROFILE_ENV, "cortex-a710")
    assert tools.cache_key() != a76
    args = type("A", (), {"arch": None, "profile": "orin", "backend": "cpu", "cuda_archs": None})()
    assert tools_install._target(args) == ("cuda", "87", None)  # on the Jetson: CUDA at sm_87, the A78AE's -march
    assert tools_cross.host_flags() == ("-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16",)


SYSINFO = ("system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | "
           "DOTPROD = 1 | REPACK = 1 | ")


def test_feature_check():
    a76, a710 = tools_cross.PROFILES["cortex-a76"], tools_cross.PROFILES["cortex-a710"]
    assert tools_cross.check_features(a76, SYSINFO, 0, "x") == {"NEON": "1", "ARM_FMA": "1", "FP16_VA": "1",
                                                               "DOTPROD": "1", "REPACK": "1"}
    with pytest.raises(PipelineError, match="lack MATMUL_INT8 of profile cortex-a710") as e:
        tools_cross.check_features(a710, SYSINFO, 0, "device-check of m.gguf")
    assert "\n" not in str(e.value)
    with pytest.raises(PipelineError, match="lack DOTPROD of profile cortex-a76"):
        tools_cross.check_features(a76, SYSINFO.replace("DOTPROD = 1 | ", ""), 0, "x")
    for rc in (-4, 132):
        with pytest.raises(PipelineError, match="SIGILL on profile cortex-a76 \\(core cortex-a76\\)"):
            tools_cross.check_features(a76, "", rc, "x")
    with pytest.raises(PipelineError, match="no system_info"):
        tools_cross.check_features(a76, "nothing", 0, "x")


def test_buffers_as_llama_cpp_prints_them():
    out = ("0.00.239.767 I load_tensors:   CPU_REPACK model buffer size =    52.59 MiB\n"
           "load_tensors:   CPU_Mapped model buffer size =   100.00 MiB\n"
           "llama_context:        CPU  output buffer size =     0.19 MiB\n"
           "llama_kv_cache:        CPU KV buffer size =    12.00 MiB\n")
    assert buffers(out) == {"CPU_REPACK model": 52.59, "CPU_Mapped model": 100.0, "CPU output": 0.19, "CPU KV": 12.0}


def test_collect_refuses_an_emulated_result(tmp_path):
    r = {"kind": "ggufpipe-device-check", "version": 1, "emulated": {"profile": "cortex-a76"}}
    with pytest.raises(PipelineError, match="emulated \\(cortex-a76 under qemu\\)"):
        check_result(tmp_path / "r.json", r, {"name": "x"})


def test_a_failed_cmake_prints_its_line_then_one_line(tmp_path, capsys):
    cmd = ["cmake", "-S", str(tmp_path / "no-tree"), "-B", str(tmp_path / "b"), "-DGGML_CPU_ARM_ARCH=armv8.2-a+bogus"]
    with pytest.raises(PipelineError) as e:
        tools_install._check_call(cmd, tmp_path / "cmake.log")
    assert "\n" not in str(e.value) and str(e.value).startswith("`cmake -S ") and "[log: " in str(e.value)
    assert capsys.readouterr().err.strip().endswith("-DGGML_CPU_ARM_ARCH=armv8.2-a+bogus")
