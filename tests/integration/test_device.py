"""Devices: `pip install '.[device]'` (DVC; no torch, transformers, numpy or gguf) pulls one GGUF with DVC
and `ggufpipe verify` checks it; the standard-library GGUF reader (pipeline/gguf/reader.py, type table pipeline/gguf/types.py) against
gguf-py and the pinned llama.cpp's type tables."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest
from helpers import ROOT, norm, read_pins

from pipeline.distribution.verify import verify
from pipeline.errors import ArtifactError, PipelineError
from pipeline.gguf import GGUFFacts, read_facts, read_header
from pipeline.gguf import types as gguf_types

SIZE_LIMIT = 200 * 10**6  # bytes a device install may add (README, "Devices")
QUANTS = ("Q4_K_M", "Q6_K", "IQ4_NL", "TQ2_0", "Q2_0", "Q1_0")  # Q1_0/Q2_0: unknown to PyPI's gguf 0.19.0
NAME = "tiny"


@pytest.fixture(scope="module")
def tiny_quants(tmp_path_factory, toolchain) -> dict[str, Path]:
    """A tiny F16 llama (the first 1024 tokens of llama.cpp's llama-spm test vocab, which keeps gguf-py's
    GGUFReader quick) and its quants made by the pinned llama-quantize."""
    from helpers.gguf_factory import tiny_llama

    folder = tmp_path_factory.mktemp("device-quants")
    f16 = tiny_llama(folder / f"{NAME}-F16.gguf", toolchain.root / "vocab" / "ggml-vocab-llama-spm.gguf",
                     edit=lambda tok: tok.truncate(1024), dtype="F16", n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                     tie_embeddings=True)
    out = {"F16": f16}
    for q in QUANTS:
        dest = folder / f"{NAME}-{q}.gguf"
        res = subprocess.run([str(toolchain.tool("llama-quantize")), str(f16), str(dest), q, "2"],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        out[q] = dest
    return out


def write_manifest(folder: Path, files: list[Path]) -> Path:
    """A manifest as the publish stage writes it (its artifact entries), facts read by gguf-py."""
    arts = [{**read_facts(f).as_dict(), "role": "quant"} for f in files]
    path = folder / "manifest.json"
    path.write_text(json.dumps({"name": NAME, "build_id": f"{NAME}-0123456789ab", "artifacts": arts}, indent=2))
    return path


# ------------------------------------------------------------------ the header reader on the build box


def test_type_tables_equal_pinned_gguf_py(toolchain):
    """pipeline/gguf/types.py's llama_ftype and ggml_type tables are the pinned tree's gguf-py constants (no drift)."""
    code = ("import json; from gguf import constants as c; print(json.dumps({"
            "'ftype': {int(m): m.name for m in c.LlamaFileType}, "
            "'ggml': {int(t): [t.name, *c.GGML_QUANT_SIZES[t]] for t in c.GGMLQuantizationType}}))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=toolchain.gguf_py,
                         env={**env, "PYTHONPATH": str(toolchain.gguf_py)})
    assert res.returncode == 0, res.stderr[-2000:]
    ref = json.loads(res.stdout)
    names = {int(v): ({"ALL_F32": "F32"}.get(n) or n.removeprefix("MOSTLY_")) for v, n in ref["ftype"].items()}
    ggml = {int(v): tuple(t) for v, t in ref["ggml"].items()}
    if toolchain.origin == "pinned":
        assert gguf_types.FILE_TYPES == names
        assert gguf_types.GGML_TYPES == ggml
    else:  # a newer user build may add types; the ones known here must not have changed
        assert {k: names.get(k) for k in gguf_types.FILE_TYPES} == gguf_types.FILE_TYPES
        assert {k: ggml.get(k) for k in gguf_types.GGML_TYPES} == gguf_types.GGML_TYPES


def gguf_py_file_type(value) -> str:
    """``general.file_type`` named by the pinned gguf-py's LlamaFileType (independently of pipeline/gguf/types.py)."""
    import gguf

    if value is None:
        return "UNKNOWN"
    try:
        name = gguf.LlamaFileType(int(value)).name
    except ValueError:
        return f"UNKNOWN({int(value)})"
    return {"ALL_F32": "F32"}.get(name) or name.removeprefix("MOSTLY_")


def reader_facts(path: Path, r) -> GGUFFacts:
    """The facts a manifest records, derived independently by the pinned gguf-py's GGUFReader ``r`` of ``path``."""

    def field(r, key, default=None):
        f = r.fields.get(key)
        return f.contents() if f is not None else default

    n_params = sum(int(t.n_elements) for t in r.tensors)
    n_bytes = sum(int(t.n_bytes) for t in r.tensors)
    return GGUFFacts(file=path.name, quant_type=gguf_py_file_type(field(r, "general.file_type")), sha256="",
                     size_bytes=path.stat().st_size, bits_per_weight=round(n_bytes * 8 / n_params, 4) if n_params else 0.0,
                     gguf_version=int(field(r, "GGUF.version")), tensor_count=len(r.tensors), parameter_count=n_params,
                     architecture=str(field(r, "general.architecture", "")))


def test_header_facts_equal_gguf_reader(tiny_quants, toolchain, source_gguf):
    """The stdlib reader's facts (read_facts: what manifests hold) are gguf-py GGUFReader's, on quants of
    every block layout, the demo's Q4_1 source model and vocab-only GGUFs."""
    files = [*tiny_quants.values(), source_gguf,
             *(toolchain.root / "vocab" / f"ggml-vocab-{v}.gguf" for v in ("llama-spm", "bert-bge"))]
    from gguf import GGUFReader

    for f in files:
        reader = GGUFReader(f)  # once per file: seconds on a full vocabulary
        assert read_facts(f, with_sha256=False) == reader_facts(f, reader), f.name
        # per tensor: name, shape, ggml type, absolute offset, elements, bytes
        ours = [(t.name, t.shape, t.ggml_type, t.offset, t.n_elements, t.n_bytes) for t in read_header(f).tensors]
        theirs = [(t.name, tuple(int(n) for n in t.shape), int(t.tensor_type), int(t.data_offset), int(t.n_elements),
                   int(t.n_bytes)) for t in reader.tensors]
        assert ours == theirs, f.name
    assert {q: read_header(tiny_quants[q]).file_type for q in QUANTS} == {q: q for q in QUANTS}


def test_header_refuses_damaged_files(tiny_quants, tmp_path):
    src = tiny_quants["Q2_0"].read_bytes()
    hdr = read_header(tiny_quants["Q2_0"])
    cases = {
        "cut-data": (src[: hdr.data_end - 1], r"truncated GGUF: tensor data ends at byte \d+, file has \d+"),
        "cut-header": (src[:2000], r"truncated GGUF: the header ends past the end of the file"),
        "magic": (b"GGML" + src[4:], r"not a GGUF file \(magic b'GGML'"),
        "version": (src[:4] + (7).to_bytes(4, "little") + src[8:], r"unsupported GGUF version 7"),
        "empty": (b"", r"not a GGUF file \(magic b''"),
    }
    for name, (data, pattern) in cases.items():
        bad = tmp_path / f"{name}.gguf"
        bad.write_bytes(data)
        with pytest.raises(PipelineError, match=pattern):
            read_header(bad)


def test_verify_names_each_mismatch(tiny_quants, tmp_path):
    """verify: OK line; then the size, SHA256, quant type and header-fact mismatches, each one line."""
    good = tmp_path / tiny_quants["Q2_0"].name
    shutil.copyfile(tiny_quants["Q2_0"], good)
    mpath = write_manifest(tmp_path, [good])
    assert verify(good).startswith(f"OK  {good} (Q2_0, ")
    manifest = json.loads(mpath.read_text())

    def expect(edit: dict, pattern: str) -> None:
        m = json.loads(json.dumps(manifest))
        m["artifacts"][0].update(edit)
        mpath.write_text(json.dumps(m))
        with pytest.raises(ArtifactError, match=pattern) as exc:
            verify(good)
        assert exc.value.path == good and "\n" not in str(exc.value)

    expect({"quant_type": "Q4_K_M"}, "GGUF says Q2_0, manifest says Q4_K_M")
    expect({"tensor_count": 99}, r"GGUF header says tensor_count \d+, manifest says 99")
    expect({"size_bytes": 1}, "truncated or wrong file")
    expect({"sha256": "0" * 64}, "does not match the manifest's 0000")
    mpath.write_text(json.dumps(manifest))
    assert verify(good).startswith("OK")


# ------------------------------------------------------------------ the device install


def _clean_env(**extra: str) -> dict:
    """The environment without this venv or PYTHONPATH (the device venv must see only what it installed)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if Path(p).resolve() != Path(sys.executable).parent.resolve())
    env.update(PYTHONNOUSERSITE="1", DVC_NO_ANALYTICS="1", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@e", **extra)
    return env


def run(cmd: list, cwd: Path, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res


def build_project_wheel(dest: Path) -> Path:
    """This checkout as a wheel (built from a copy: nothing is written into the clone)."""
    src = dest / "src"
    src.mkdir(parents=True)
    for f in ("pyproject.toml", "README.md"):
        shutil.copyfile(ROOT / f, src / f)
    shutil.copytree(ROOT / "pipeline", src / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dest, src], dest,
        _clean_env())
    (wheel,) = dest.glob("ggufpipe-*.whl")
    return wheel


def device_requirements(wheel: Path) -> list[str]:
    """Requires-Dist of the wheel that a `[device]` install takes (core + the device extra)."""
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    reqs = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]
    return sorted(r for r in reqs if "extra ==" not in r or "'device'" in r or '"device"' in r)


def wheelhouse(wheel: Path) -> Path:
    """Wheels of everything `[device]` installs, built once into the cache and keyed by the constraints file,
    the device requirements, the interpreter and the platform (like the llama.cpp tools' cache)."""
    from pipeline.tools import _lock, cache_root

    constraints = ROOT / "requirements" / "constraints.txt"
    key = hashlib.sha256(constraints.read_bytes() + "\n".join(device_requirements(wheel)).encode()).hexdigest()[:16]
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}-{sysconfig.get_platform()}"
    house = cache_root() / "wheels" / f"device-{key}-{tag}"
    with _lock(house.with_name(house.name + ".lock")):
        if not (house / ".complete").is_file():
            tmp = house.with_name(house.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            res = run([sys.executable, "-m", "pip", "wheel", "-q", "-c", constraints, "-w", tmp, f"{wheel}[device]"],
                      wheel.parent, _clean_env(), check=False)
            assert res.returncode == 0, f"building the device wheelhouse failed (needs PyPI once):\n{res.stderr[-3000:]}"
            for own in tmp.glob("ggufpipe-*.whl"):
                own.unlink()
            (tmp / ".complete").write_text("")
            shutil.rmtree(house, ignore_errors=True)
            os.replace(tmp, house)
    return house


@contextlib.contextmanager
def serve(folder: Path):
    """A local read-only web server for ``folder`` (a DVC HTTP remote); yields its URL."""
    from functools import partial
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def tree_bytes(folder: Path) -> int:
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def test_device_install_pulls_and_verifies_without_torch(tiny_quants, tmp_path):
    """A fresh venv with only `ggufpipe[device]` (from the cached wheelhouse, no index): torch, transformers,
    numpy and gguf are not importable, the install is under 200 MB, `dvc pull` fetches one GGUF from a
    local-folder remote and from the same remote over HTTP, `ggufpipe verify` passes it (a Q2_0 file, which
    PyPI's gguf 0.19.0 cannot read), and a tampered or truncated copy fails with one line and exit status 1."""
    t0 = time.monotonic()
    wheel = build_project_wheel(tmp_path / "dist")
    house = wheelhouse(wheel)
    t_house = time.monotonic() - t0

    venv = tmp_path / "device-venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, _clean_env())
    py, bin_dir = venv / "bin" / "python", venv / "bin"
    empty = tree_bytes(venv)
    run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-index", "--find-links", house,
         "-c", ROOT / "requirements" / "constraints.txt", f"{wheel}[device]"], tmp_path, _clean_env())
    installed = tree_bytes(venv) - empty
    t_install = time.monotonic() - t0 - t_house

    env = _clean_env(PATH=f"{bin_dir}{os.pathsep}{_clean_env()['PATH']}")
    probe = ("import importlib.util as u; "
             "print(sorted(m for m in ('torch', 'transformers', 'numpy', 'gguf', 'awq', 'snakemake') if u.find_spec(m)))")
    assert run([py, "-c", probe], tmp_path, env).stdout.strip() == "[]"
    assert run([py, "-c", "import torch"], tmp_path, env, check=False).returncode != 0
    assert installed <= SIZE_LIMIT, f"device install is {installed / 1e6:.1f} MB"
    dists = json.loads(run([py, "-c", "import importlib.metadata as m, json; "
                                      "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"],
                           tmp_path, env).stdout)
    pins = read_pins(ROOT / "requirements" / "constraints.txt")
    unpinned = {n: v for n, v in dists.items() if pins.get(norm(n)) != v and norm(n) not in ("ggufpipe", "setuptools")}
    assert unpinned == {}, "installed but not pinned so in requirements/constraints.txt"

    # the build box: a git repo whose manifest is git-tracked and whose GGUFs DVC tracks, pushed to a folder remote
    box, remote, device = tmp_path / "box", tmp_path / "remote", tmp_path / "device"
    folder = box / "artifacts" / NAME
    folder.mkdir(parents=True)
    files = [folder / tiny_quants[q].name for q in ("Q2_0", "Q4_K_M")]
    for f in files:
        shutil.copyfile(tiny_quants[f.name.removeprefix(f"{NAME}-").removesuffix(".gguf")], f)
    mpath = write_manifest(folder, files)
    slice_file = folder / "device-slice.logits"  # any bytes: without llama.cpp tools device-check only verifies it
    slice_file.write_bytes(b"_logits_" + bytes(range(256)) * 4)
    m = json.loads(mpath.read_text())
    m["device_check"] = {"file": slice_file.name, "sha256": hashlib.sha256(slice_file.read_bytes()).hexdigest(),
                         "size_bytes": slice_file.stat().st_size, "eval_set": "g", "ctx": 256, "chunks": 2,
                         "scored_tokens": 254}
    for e in m["artifacts"]:
        e["slice"] = {"kld_mean": 0.01, "same_top_p": 0.9, "ppl_q": 10.0}
    mpath.write_text(json.dumps(m, indent=2))
    dvc = [bin_dir / "dvc"]
    run(["git", "init", "-q", "-b", "main"], box, env)
    run([*dvc, "init", "-q"], box, env)
    run([*dvc, "remote", "add", "-d", "local", remote], box, env)
    run([*dvc, "add", "-q", *files, slice_file], box, env)
    run(["git", "add", "-A"], box, env)
    run(["git", "commit", "-qm", "v1"], box, env)
    run([*dvc, "push", "-q"], box, env)

    # the device: fresh clone, pull ONE file, verify it
    run(["git", "clone", "-q", box, device], tmp_path, env)
    target = Path("artifacts") / NAME / files[0].name
    run([*dvc, "pull", "-q", target], device, env)
    assert sorted(p.name for p in (device / "artifacts" / NAME).glob("*.gguf")) == [target.name]
    ok = run([bin_dir / "ggufpipe", "verify", target], device, env)
    assert ok.stdout.startswith(f"OK  {target} (Q2_0, ") and ok.stderr == ""
    # device-check on a device without llama.cpp tools (no LLAMA_CPP_DIR, none on PATH, no pinned cache): the file and
    # its slice verified, the numbers not re-measured
    no_tools = {**env, "GGUFPIPE_CACHE": str(tmp_path / "no-cache")}
    bad = run([bin_dir / "ggufpipe", "device-check", target], device, no_tools, check=False)
    assert bad.returncode == 1 and "device-slice.logits: missing: pull it with `dvc pull" in bad.stderr, bad.stderr
    run([*dvc, "pull", "-q", target.parent / slice_file.name], device, env)
    checked = run([bin_dir / "ggufpipe", "device-check", target], device, no_tools)
    assert checked.stdout.startswith(f"VERIFIED  {target.name}: no llama.cpp tools"), checked.stdout + checked.stderr

    # the same file again over HTTP (dvc-http comes with dvc): the remote folder served by a local web server
    with serve(remote) as url:
        (device / target).unlink()
        shutil.rmtree(device / ".dvc" / "cache")
        run([*dvc, "remote", "add", "--local", "web", url], device, env)
        run([*dvc, "pull", "-q", "-r", "web", target], device, env)
    assert run([bin_dir / "ggufpipe", "verify", target], device, env).stdout.startswith("OK")

    # tampered (one flipped byte), then truncated: one `error:` line, exit status 1
    path = device / target
    data = bytearray(path.read_bytes())
    path.unlink()  # may be a link into the DVC cache: write a new file
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    bad = run([bin_dir / "ggufpipe", "verify", target], device, env, check=False)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1, bad.stderr
    assert "does not match the manifest" in bad.stderr
    path.write_bytes(bytes(data[: len(data) // 2]))
    bad = run([bin_dir / "ggufpipe", "verify", target], device, env, check=False)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "truncated or wrong file" in bad.stderr, bad.stderr
    info = run([bin_dir / "ggufpipe", "info", target], device, env, check=False)  # no manifest involved
    assert info.returncode == 1 and "truncated GGUF: tensor data ends at byte" in info.stderr, info.stderr
    print(f"device install: {installed / 1e6:.1f} MB; wheelhouse {t_house:.1f} s, install {t_install:.1f} s, "
          f"total {time.monotonic() - t0:.1f} s")
    shutil.rmtree(venv)  # ~10k files: not left for pytest's tmp_path rotation to delete in a later run
