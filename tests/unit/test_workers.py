"""make test's two workers (tests/helpers/workers.py) on a generated suite run by the real pytest-xdist: each shared
session build is made once and its tests run where it was made, module fixtures are made once, and each worker runs
its unit tests before anything else, the demo build's group first after them. pytest-xdist's own loadgroup does
none of this under pytest 9.2 (pytest-dev/pytest-xdist#1386), and nothing else would notice."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter

from helpers import ROOT

CONFTEST = """\
import os

import pytest

pytest_plugins = ["helpers.workers"]
LOG = os.path.join(os.path.dirname(__file__), "log.txt")


def record(line):
    with open(LOG, "a") as f:
        f.write(f"{os.environ['PYTEST_XDIST_WORKER']} {line}\\n")


def pytest_configure(config):
    config.addinivalue_line("markers", "unit: the tier the workers hand out first")


def pytest_collection_modifyitems(items):
    for item in items:
        if "unit" in item.path.name:
            item.add_marker(pytest.mark.unit)


@pytest.fixture(scope="session")
def demo_build():
    record("build demo_build")


@pytest.fixture(scope="session")
def tiny_build():
    record("build tiny_build")


@pytest.fixture(scope="session")
def failing_build():
    record("build failing_build")


@pytest.fixture(autouse=True)
def _ran(request):
    record(f"test {request.node.name}")
"""

# collected in this (alphabetical) order: the e2e files before the unit tier
FILES = {
    "test_a_e2e.py": """\
        def test_a_demo1(demo_build): pass
        def test_a_plain1(): pass
        def test_a_tiny1(tiny_build): pass
        def test_a_demo2(demo_build): pass
        def test_a_plain2(): pass
        """,
    "test_b_e2e.py": """\
        def test_b_failing(failing_build): pass
        def test_b_demo3(demo_build): pass
        def test_b_plain1(): pass
        def test_b_tiny2(tiny_build): pass
        """,
    "test_c_integration.py": """\
        import pytest

        from conftest import record

        @pytest.fixture(scope="module")
        def made():
            record("build module_c")

        def test_c_1(made): pass
        def test_c_2(made): pass
        def test_c_3(made): pass
        """,
    "test_d_unit.py": "".join(f"def test_d_unit{i}(): pass\n" for i in range(6)),
    "test_e_unit.py": "".join(f"def test_e_unit{i}(): pass\n" for i in range(6)),
}


def test_groups_and_order_on_two_workers(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name, text in FILES.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    # not this run's PYTEST_ADDOPTS (CI's --basetemp holds tmp_path) nor its xdist variables
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    res = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
                          "-q", "--rootdir", str(tmp_path), str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = [line.split(" ", 2) for line in (tmp_path / "log.txt").read_text().splitlines()]
    worker_of = {name: w for w, kind, name in lines if kind == "test"}
    assert len(worker_of) == 24 and len(set(worker_of.values())) == 2, lines  # every test ran once; both workers

    built = Counter(name for _, kind, name in lines if kind == "build")
    assert built == {"demo_build": 1, "tiny_build": 1, "failing_build": 1, "module_c": 1}, built
    where = {name: w for w, kind, name in lines if kind == "build"}
    assert {worker_of[t] for t in ("test_a_demo1", "test_a_demo2", "test_b_demo3")} == {where["demo_build"]}
    assert {worker_of[t] for t in ("test_a_tiny1", "test_b_tiny2", "test_b_failing")} == {
        where["tiny_build"], where["failing_build"]}

    for w in set(worker_of.values()):
        ran = [name for worker, kind, name in lines if worker == w and kind == "test"]
        units = [i for i, name in enumerate(ran) if "unit" in name]
        assert units == list(range(len(units))), (w, ran)  # this worker's unit tests, before anything else
    # the demo build's group is the first handed out after the unit tier: its worker starts on it
    on_demo_worker = [name for w, kind, name in lines if w == where["demo_build"] and kind == "test"]
    assert [name for name in on_demo_worker if "unit" not in name][0] == "test_a_demo1", on_demo_worker
