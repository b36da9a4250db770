"""The environments by concern (pipeline/envs.py): locks without CUDA wheels, refused at make when they have one, the
converter pins and their deviations, and the one line a missing environment gives."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT

from pipeline.devices.plan_jobs import missing_envs
from pipeline.envs import CONVERTER_PINS, ENVS, EnvError, converter_deviations, cuda_wheels, env_python, lock_pins
from pipeline.stages import registry


@pytest.mark.parametrize("name", sorted(ENVS))
def test_every_lock_is_cpu_only_and_holds_its_pins(name):
    lock = ENVS[name].lock
    assert cuda_wheels(lock) == [], lock
    pins = lock_pins(lock)
    assert pins["torch"] == "2.13.0+cpu" and "triton" not in pins, pins
    if name == "converter":  # every converter pin met but torch's (pipeline/envs.py)
        assert converter_deviations(pins) == {"torch": {"required": "==2.11.0", "installed": "2.13.0+cpu"}}
    else:
        assert (pins["autoawq"], pins["transformers"]) == ("0.2.9", "4.56.2"), pins


def test_a_lock_with_cuda_wheels_is_refused_in_one_line(tmp_path):
    lock = tmp_path / "bad.lock"
    lock.write_text((ENVS["converter"].lock.read_text()).replace(
        "torch==2.13.0+cpu", "nvidia-cublas-cu12==12.8.4.1 \\\n    --hash=sha256:00\ntorch==2.13.0"))
    assert cuda_wheels(lock) == ["nvidia-cublas-cu12"]
    res = subprocess.run([sys.executable, "-m", "pipeline.envs", "check-lock", str(lock)], capture_output=True,
                         text=True, cwd=ROOT)
    assert res.returncode == 1 and res.stdout == "", res
    assert res.stderr.splitlines() == [f"error: {lock}: resolves CUDA wheels (nvidia-cublas-cu12); this build box "
                                       "installs the CPU torch: pin it in the lock's .in file and run `make locks`"]


@pytest.mark.parametrize(("installed", "unmet"), [
    ({"torch": "2.11.0", "numpy": "2.2.6", "sentencepiece": "0.2.3", "transformers": "4.57.6", "protobuf": "4.25.9"},
     []),
    ({"torch": "2.11.0+cpu", "numpy": "2.2.9", "sentencepiece": "0.1.98", "transformers": "4.57.6",
      "protobuf": "4.21.0"}, []),
    ({"torch": "2.13.0", "numpy": "2.3.0", "sentencepiece": "0.3.0", "transformers": "4.56.2", "protobuf": "5.29.1"},
     ["torch", "numpy", "sentencepiece", "transformers", "protobuf"]),
    ({"torch": "2.11.0", "numpy": "2.2.5", "transformers": "4.57.6", "protobuf": "4.25.9"},
     ["numpy", "sentencepiece"]),  # below ~=2.2.6, and not installed
])
def test_converter_deviations(installed, unmet):
    got = converter_deviations(installed)
    assert list(got) == unmet
    assert all(got[p] == {"required": CONVERTER_PINS[p], "installed": installed.get(p)} for p in unmet)


def test_a_missing_environment_names_itself_and_its_command(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUFPIPE_ENVS", str(tmp_path))
    with pytest.raises(EnvError) as exc:
        env_python("autoawq")
    assert (exc.value.env, exc.value.path, exc.value.command) == ("autoawq", tmp_path / "autoawq", "make env-autoawq")
    assert str(exc.value) == (f"the autoawq environment (AutoAWQ 0.2.9 calibration) is not installed at "
                              f"{tmp_path / 'autoawq'}: run `make env-autoawq`")
    # a folder half made (no .installed: make stopped inside) is not an environment either
    (tmp_path / "converter" / "bin").mkdir(parents=True)
    (tmp_path / "converter" / "bin" / "python").symlink_to(sys.executable)
    with pytest.raises(EnvError, match="converter"):
        env_python("converter")
    (tmp_path / "converter" / ".installed").touch()
    assert env_python("converter") == tmp_path / "converter" / "bin" / "python"
    # the build refuses before any job, naming the environment, its command and the rules that need it
    assert missing_envs(["quantize", "convert", "convert_awq", "awq"]) == (
        f"the autoawq environment (AutoAWQ 0.2.9 calibration) is not installed at {tmp_path / 'autoawq'}: run "
        "`make env-autoawq` (needed by awq)")
    assert missing_envs(["quantize", "convert", "eval"]) is None


def test_stages_declare_the_environments_they_run():
    declared = {rule: st.envs for rule, st in registry().items() if st.envs}
    assert declared == {"convert": ("converter",), "convert_mtp": ("converter",), "convert_awq": ("converter",),
                        "awq": ("autoawq",)}
    assert all(set(envs) <= set(ENVS) for envs in declared.values())
