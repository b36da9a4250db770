"""``make test``'s two pytest-xdist workers: which tests run on the same worker, and in what order they go out.

Each test gets a group: the shared session build it uses (``SHARED_BUILDS``: built once, on the worker that runs
the group), else its file (module fixtures made once). ``--dist loadgroup`` hands out whole groups in collection
order: the unit tier first (each worker runs its unit tests before anything in its process imports torch), then
the demo build's group, the longest, so that it starts at once, then the rest.

pytest-xdist's own loadgroup carries the group as a suffix that it writes into each test's node id, which pytest
9.2 no longer lets a plugin change (pytest-dev/pytest-xdist#1386: the tests are then spread as if ungrouped and
each worker makes every shared build). Here each worker writes its table of groups to a folder the controller
named, and the controller's scheduler reads it. A plugin: tests/conftest.py loads it (``pytest_plugins``)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# session fixture -> group; failing_build and tiny_build share tiny_hub
SHARED_BUILDS = {"demo_build": "demo_build", "tiny_build": "tiny_build", "failing_build": "tiny_build"}
FIRST = "demo_build"
KEY = "ggufpipe_groups"  # in each worker's workerinput: the folder of the tables
_FOLDER = pytest.StashKey[Path]()


def group(item: pytest.Item) -> str:
    used = [SHARED_BUILDS[f] for f in item.fixturenames if f in SHARED_BUILDS]
    return used[0] if used else item.nodeid.split("::")[0]


@pytest.hookimpl(trylast=True)  # after tests/conftest.py has marked the tiers and sorted them
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Worker side: the unit tier, then the FIRST group, then the rest (stable); then write ``{node id: group}``
    for the controller."""
    if KEY not in getattr(config, "workerinput", {}):
        return
    groups = {item.nodeid: group(item) for item in items}
    items.sort(key=lambda item: (item.get_closest_marker("unit") is None, groups[item.nodeid] != FIRST))
    table = Path(config.workerinput[KEY]) / f"{config.workerinput['workerid']}.json"
    tmp = table.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, table)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    node.workerinput[KEY] = str(folder(node.config))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    return make_scheduler(config, log)


def folder(config: pytest.Config) -> Path:
    """Controller side: the folder the workers write their tables to, one per session, removed at its end."""
    if _FOLDER not in config.stash:
        config.stash[_FOLDER] = Path(tempfile.mkdtemp(prefix="ggufpipe-xdist-"))
        config.add_cleanup(lambda: shutil.rmtree(config.stash[_FOLDER], ignore_errors=True))
    return config.stash[_FOLDER]


def make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup`` with the groups from the workers' tables, handed out in collection order."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        table: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.table is None:  # every worker collected (schedule() runs then): their tables are equal
                self.table = json.loads(next(iter(sorted(folder(config).glob("*.json")))).read_text())
            return self.table[nodeid]

    config.option.loadscopereorder = False  # keep collection order: it puts the unit tier first
    return Groups(config, log)
