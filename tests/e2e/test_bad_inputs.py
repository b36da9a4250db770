"""Bad inputs, one table: each case runs through a user-facing entry (`ggufpipe build`, which runs the real
Snakefile; `validate`; `verify`; `info`; `dvc-link`; `stage`) in a copy of a project that already published
a small model, and must give a non-zero exit, exactly ONE line starting with ``error:`` that names the file
and the field or reason, no traceback, no temporary file, no token, and leave every published file
byte-identical.

The published project is built once per module by the real workflow from a tiny generated Llama
(tests/helpers make_tiny_llama: 2 layers, hidden 256, SentencePiece vocab of 768), with ``HF_TOKEN`` set to a fake
token that no file may contain. Stage-level cases re-run only the stage they break (the copy keeps the
build's files, mtimes and Snakemake metadata, and recipe paths are relative), so most cases cost one
Snakemake start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from helpers import FAKE_TOKEN, ROOT

NAME = "tiny"
RECIPE = f"recipes/{NAME}.yaml"
EVAL = ROOT / "data" / "botchan.txt"
CALIB = ROOT / "data" / "botchan-calib.txt"


def ggufpipe(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", HF_TOKEN=FAKE_TOKEN)
    full.pop("LLAMA_CPP_DIR", None)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=300)


def good_recipe(hf: Path, **changes) -> dict:
    data = {"name": NAME, "source": {"path": str(hf)}, "quants": ["Q8_0"], "bench": False, "conformance": False}
    data.update(changes)
    return data


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    from helpers.hf_factory import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("bad-inputs-hf") / "hf")


@pytest.fixture(scope="module")
def published(tmp_path_factory, tiny_hf):
    """A project that built and published ``tiny`` (F16 + Q8_0, manifest, report, card, Modelfiles)."""
    root = tmp_path_factory.mktemp("bad-inputs") / "project"
    (root / "recipes").mkdir(parents=True)
    (root / RECIPE).write_text(yaml.safe_dump(good_recipe(tiny_hf, publish={"hf_repo": "org/tiny-GGUF"}),
                                              sort_keys=False))
    res = ggufpipe(["build", "--cores", "2", RECIPE], root)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (root / "artifacts" / NAME / f"{NAME}-Q8_0.gguf").is_file()
    return root


def tree_state(folder: Path) -> dict[str, str]:
    """Every entry under ``folder``: SHA256 of files, targets of links, and folders."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


# --------------------------------------------------------------------------- the cases


@dataclass
class Ctx:
    project: Path
    hf: Path  # the good source folder (shared: copy it before damaging it)
    tmp: Path
    watch: list[Path] = field(default_factory=list)  # published folders outside the project, also hashed
    env: dict = field(default_factory=dict)

    def recipe(self, data: dict | str, file: str = RECIPE) -> str:
        path = self.project / file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
        return file

    def good(self, **changes) -> str:
        return self.recipe(good_recipe(self.hf, **changes))

    def source(self, damage: Callable[[Path], None]) -> str:
        """The recipe pointing at a damaged copy of the source folder."""
        src = self.tmp / "src"
        shutil.copytree(self.hf, src)
        damage(src)
        return self.good(source={"path": str(src)})

    def published_file(self, key: str = "Q8_0") -> Path:
        return self.project / "artifacts" / NAME / f"{NAME}-{key}.gguf"

    def copy_of(self, key: str, damage: Callable[[bytearray], bytes | bytearray], name: str = "x.gguf") -> Path:
        data = bytearray(self.published_file(key).read_bytes())
        out = self.tmp / name
        out.write_bytes(bytes(damage(data)))
        return out


def not_utf8(c: Ctx) -> str:
    (c.project / RECIPE).write_bytes(b"name: tiny\n# caf\xe9 (latin-1)\n")
    return RECIPE


def build(*recipes: str) -> list[str]:
    """`ggufpipe build`: the Snakefile loads the recipes (and refuses a bad one before any job runs)."""
    return ["build", "--cores", "2", *recipes]


def validate(*recipes: str) -> list[str]:
    """`ggufpipe validate`: the same checks without Snakemake (cheaper: for the pure schema cases)."""
    return ["validate", *recipes]


def edit_config(**changes):
    def damage(src: Path) -> None:
        cfg = json.loads((src / "config.json").read_text())
        cfg.update(changes)
        (src / "config.json").write_text(json.dumps(cfg))
    return damage


def remove(*names: str):
    def damage(src: Path) -> None:
        for n in names:
            (src / n).unlink()
    return damage


def truncate_safetensors(src: Path) -> None:
    with open(src / "model.safetensors", "r+b") as fh:
        fh.truncate(1_000_000)


def clobber_safetensors_header(src: Path) -> None:
    with open(src / "model.safetensors", "r+b") as fh:
        fh.write(b"\xff" * 8)


def pickled_weights(src: Path) -> None:
    (src / "model.safetensors").unlink()
    (src / "pytorch_model.bin").write_bytes(b"\x80\x04 a pickle would run code here")


def remote_code(src: Path) -> None:
    edit_config(auto_map={"AutoModelForCausalLM": "modeling_x.XForCausalLM"})(src)
    (src / "modeling_x.py").write_text("raise SystemExit('remote code ran')\n")


def gates(text: Path | str, **kw) -> list[dict]:
    return [{"name": "botchan", "text": str(text), "ctx": 512, "chunks": 16, **kw}]


def text_file(c: Ctx, name: str, content: str | bytes) -> Path:
    p = c.tmp / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


def user_llama_cpp(c: Ctx, drop: str | None = None, version: str | None = None) -> dict:
    """``LLAMA_CPP_DIR``: a user's llama.cpp tree (build/bin + converter) linking the pinned tools; ``drop``
    leaves a tool out; ``version`` replaces llama-perplexity by the version banner of an older build (the
    only thing the toolchain check reads from it)."""
    from pipeline.tools import find_toolchain

    tc = find_toolchain()
    root = c.tmp / "llama.cpp"
    (root / "build" / "bin").mkdir(parents=True)
    for exe in tc.bin_dir.iterdir():
        if exe.name != drop:
            (root / "build" / "bin" / exe.name).symlink_to(exe)
    if version:
        perp = root / "build" / "bin" / "llama-perplexity"
        perp.unlink()
        perp.write_text(f"#!/bin/sh\necho 'version: {version}'\necho 'built with cc for x86_64-linux-gnu'\n")
        perp.chmod(0o755)
    (root / "convert_hf_to_gguf.py").symlink_to(tc.convert_script)
    (root / "gguf-py").symlink_to(tc.gguf_py)
    return {"LLAMA_CPP_DIR": str(root)}


def symlinked_art_dir(c: Ctx) -> list[str]:
    """artifacts/tiny is a link to a folder outside artifacts/ (holding a published build)."""
    outside = c.tmp / "outside"
    outside.mkdir()
    art = c.project / "artifacts" / NAME
    shutil.move(str(art), outside / NAME)
    art.symlink_to(outside / NAME)
    c.watch.append(outside)
    with open(c.project / RECIPE, "a") as fh:  # a recipe edit: the publish stage would re-run
        fh.write("# edited\n")
    return build(RECIPE)


def symlinked_shard_folder(c: Ctx) -> list[str]:
    """artifacts/tiny/tiny-Q8_0 (where a split Q8_0's shards go) is a link to a folder outside."""
    outside = c.tmp / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("not the pipeline's\n")
    (c.project / "artifacts" / NAME / f"{NAME}-Q8_0").symlink_to(outside)
    c.watch.append(outside)
    return build(c.good(split={"max_size": "1M"}))


def publish_stage_through_link(c: Ctx) -> list[str]:
    symlinked_art_dir(c)
    return ["stage", "publish", "--recipe", RECIPE, "--name", NAME]


def pulled(c: Ctx) -> Path:
    """A device's copy of the published folder."""
    dest = c.tmp / "pulled"
    shutil.copytree(c.project / "artifacts" / NAME, dest)
    return dest


def verify_truncated(c: Ctx) -> list[str]:
    folder = pulled(c)
    f = folder / f"{NAME}-Q8_0.gguf"
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size // 2)
    return ["verify", str(f)]


def tmpfs_in_place(c: Ctx, folder: Path, size: int | None = None) -> None:
    """Replace ``folder`` by a tmpfs (``size`` bytes; default: its files + 128 KiB) holding copies of its files with
    their mtimes, so that only new outputs are to be made. Skipped only when not root: as root, a mount failure fails."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    keep = c.tmp / folder.name
    shutil.move(str(folder), keep)
    folder.mkdir()
    files = sorted(p for p in keep.iterdir() if p.is_file())
    size = size or sum(f.stat().st_size for f in files) + (128 << 10)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    c.env["_mounted"] = str(folder)
    for f in files:
        shutil.copy2(f, folder / f.name)


def disk_full(c: Ctx) -> list[str]:
    """A Q4_0 added to the recipe, and work/tiny/quants (F16 and Q8_0 kept, so only the new quant is to be made)
    on a tmpfs with 128 KiB to spare: the Q4_0 needs about 0.8 MB."""
    tmpfs_in_place(c, c.project / "work" / NAME / "quants")
    return build(c.good(quants=["Q8_0", "Q4_0"]))


def read_only_records(c: Ctx) -> list[str]:
    """A Q4_0 added to the recipe, and work/tiny/records on a read-only tmpfs: the quant is made, its record
    cannot be written (an OSError from the machine: one line, not a traceback). Through `ggufpipe stage`:
    Snakemake itself stops with a traceback of its own when an output folder is read-only."""
    records = c.project / "work" / NAME / "records"
    tmpfs_in_place(c, records, 1 << 20)
    subprocess.run(["mount", "-o", "remount,ro", str(records)], check=True)
    return ["stage", "quantize", "--recipe", c.good(quants=["Q8_0", "Q4_0"]), "--quant", "Q4_0"]


# (id, setup(ctx) -> CLI arguments, expected substrings of the one error line)
CASES: list[tuple[str, Callable[[Ctx], list[str]], tuple[str, ...]]] = [
    # --- recipe schema (the Snakefile refuses to load it: nothing runs)
    ("malformed-yaml", lambda c: build(c.recipe("name: tiny\nquants: [Q8_0\nbench: false\n")),
     (f"{RECIPE}: line", "malformed YAML")),
    ("not-utf8", lambda c: validate(not_utf8(c)), (f"{RECIPE}: not UTF-8 text",)),
    ("unknown-top-key", lambda c: validate(c.good(colour="red")), (f"{RECIPE}: colour: unknown key",)),
    ("unknown-source-key", lambda c: validate(c.good(source={"path": str(c.hf), "revison": "x"})),
     (f"{RECIPE}: source.revison: unknown key",)),
    ("unknown-quant-key", lambda c: validate(c.good(quants=[{"type": "Q8_0", "colour": "red"}])),
     (f"{RECIPE}: quants[0].colour: unknown key",)),
    ("bad-type-quants", lambda c: validate(c.good(quants="Q8_0")), (f"{RECIPE}: quants: must be a non-empty list",)),
    ("bad-type-bench", lambda c: validate(c.good(bench="yes")), (f"{RECIPE}: bench: must be true or false, got 'yes'",)),
    ("bad-type-ctx", lambda c: validate(c.good(gates=[{"name": "b", "text": str(EVAL), "ctx": "512", "chunks": 16}])),
     (f"{RECIPE}: gates[0].ctx: must be an integer >= 16 or long, got '512'",)),
    ("bad-split-size", lambda c: validate(c.good(split={"max_size": "1.5G"})),
     (f"{RECIPE}: split.max_size: '1.5G' is not a size",)),
    ("unknown-quant-type", lambda c: build(c.good(quants=["Q8_0", "Q4_Z"])),
     (f"{RECIPE}: quants[1]: unknown quant type 'Q4_Z' (llama-quantize b11312 accepts:",)),
    ("name-traversal", lambda c: build(c.good(name="../tiny")), (f"{RECIPE}: name: '../tiny' is not a valid name",)),
    ("name-absolute", lambda c: validate(c.good(name="/tmp/tiny")), (f"{RECIPE}: name: '/tmp/tiny' is not a valid name",)),
    ("name-uppercase", lambda c: validate(c.good(name="Tiny")), (f"{RECIPE}: name: 'Tiny' is not a valid name",)),
    ("name-space", lambda c: validate(c.good(name="tiny model")), (f"{RECIPE}: name: 'tiny model' is not a valid name",)),
    ("variant-traversal", lambda c: validate(c.good(quants=[{"type": "Q8_0", "variant": "../../x"}])),
     (f"{RECIPE}: quants[0].variant: '../../x' is not a variant",)),
    ("eval-set-traversal", lambda c: validate(c.good(gates=gates(EVAL, name="../x"))),
     (f"{RECIPE}: gates[0].name: '../x' is not an eval set name",)),
    ("path-in-repo-traversal", lambda c: validate(c.good(publish={"hf_repo": "org/x", "path_in_repo": "a/../../up"})),
     (f"{RECIPE}: publish.path_in_repo: 'a/../../up' is not a folder path",)),
    ("duplicate-names", lambda c: (c.recipe(good_recipe(c.hf), "dup/a.yaml"), c.recipe(good_recipe(c.hf), "dup/b.yaml"),
                                   ["validate", "dup"])[-1],
     ("dup/b.yaml: name: 'tiny' is already used by dup/a.yaml",)),
    ("duplicate-draft-name", lambda c: build(
        c.good(draft={"source": {"path": str(c.hf)}, "quants": ["Q8_0"], "eval_text": str(EVAL)}),
        c.recipe(good_recipe(c.hf, name="tiny-draft"), "recipes/other.yaml")),
     ("recipes/other.yaml: name: 'tiny-draft' is already used by recipes/tiny.yaml",)),
    ("unpinned-revision", lambda c: build(c.good(source={"repo": "org/model"})),
     (f"{RECIPE}: source.revision: missing: pin the repo",)),
    ("unpinned-draft-revision", lambda c: validate(c.good(draft={"source": {"repo": "org/small"}, "quants": ["Q8_0"],
                                                              "eval_text": str(EVAL)})),
     (f"{RECIPE}: draft.source.revision: missing: pin the repo",)),
    ("pickle-flag-type", lambda c: validate(c.good(source={"path": str(c.hf), "allow_pickle": "yes"})),
     (f"{RECIPE}: source.allow_pickle: must be true or false",)),
    # --- texts
    ("eval-text-empty", lambda c: build(c.good(gates=gates(text_file(c, "empty.txt", "\n\n")))),
     (f"{RECIPE}: gates[0].text: eval text ", "empty.txt is empty")),
    ("eval-text-missing", lambda c: build(c.good(gates=gates(c.tmp / "nope.txt"))),
     (f"{RECIPE}: gates[0].text: eval text ", "nope.txt does not exist")),
    # too short for llama-perplexity (under 2 x ctx tokens: it fails), and long enough for it to run (it evaluates
    # the chunks it has) but too short for the eval set: both refused with the token count. Each text has the bytes
    # the recipe's own bound asks for (ctx x chunks, a token being at least a byte), so the stage is what refuses.
    ("eval-text-too-short", lambda c: build(c.good(gates=gates(text_file(c, "short.txt", "A short text. " * 300),
                                                               ctx=2050, chunks=2))),
     ("tiny: eval set botchan: base: eval text ", "short.txt is too short: ", "ctx 2050 x 2 chunks needs 4100")),
    ("eval-text-fewer-chunks", lambda c: build(c.good(gates=gates(text_file(c, "some.txt", "A short text. " * 600)))),
     ("tiny: eval set botchan: base: eval text ", "some.txt is too short: ", "ctx 512 x 16 chunks needs 8192")),
    ("calibration-missing", lambda c: build(c.good(imatrix={"calibration": str(c.tmp / "nope.txt")})),
     (f"{RECIPE}: imatrix.calibration: calibration text ", "nope.txt does not exist")),
    ("calibration-is-eval-text", lambda c: build(c.good(
        gates=gates(EVAL), imatrix={"calibration": str(text_file(c, "calib.txt", EVAL.read_bytes()))})),
     (f"{RECIPE}: imatrix.calibration: calib.txt is the eval text of gates 'botchan'",)),
    # --- GGUF files
    ("draft-not-gguf", lambda c: build(c.good(draft={"gguf": str(text_file(c, "draft.gguf", "hello")),
                                                     "eval_text": str(EVAL)})),
     (f"{RECIPE}: draft.gguf: ", "draft.gguf: not a GGUF file (magic b'hell'")),
    ("draft-wrong-magic", lambda c: build(c.good(draft={"gguf": str(c.copy_of("Q8_0", lambda b: b"GGML" + b[4:])),
                                                        "eval_text": str(EVAL)})),
     (f"{RECIPE}: draft.gguf: ", "x.gguf: not a GGUF file (magic b'GGML', expected b'GGUF')")),
    ("draft-truncated-gguf", lambda c: build(c.good(draft={"gguf": str(c.copy_of("Q8_0", lambda b: b[:len(b) // 2])),
                                                           "eval_text": str(EVAL)})),
     (f"{RECIPE}: draft.gguf: ", "x.gguf: truncated GGUF: tensor data ends at byte")),
    ("verify-truncated-gguf", verify_truncated, ("pulled/tiny-Q8_0.gguf: size ", "truncated or wrong file")),
    ("info-wrong-magic", lambda c: ["info", str(c.copy_of("F16", lambda b: b"GGJT" + b[4:]))],
     ("x.gguf: not a GGUF file (magic b'GGJT', expected b'GGUF')",)),
    # --- source folders (the fetch stage refuses them; convert for the architecture)
    ("source-folder-missing", lambda c: build(c.good(source={"path": str(c.tmp / "nowhere")})),
     (f"{RECIPE}: source.path: ", "nowhere is not a folder")),
    ("config-missing", lambda c: build(c.source(remove("config.json"))),
     (f"{RECIPE}: source: ", "has no config.json: not a Hugging Face model folder")),
    ("safetensors-truncated", lambda c: build(c.source(truncate_safetensors)),
     (f"{RECIPE}: source: model.safetensors is truncated: its header needs",)),
    ("safetensors-bad-header", lambda c: build(c.source(clobber_safetensors_header)),
     (f"{RECIPE}: source: model.safetensors is not a valid safetensors file (bad header length)",)),
    ("no-weights", lambda c: build(c.source(remove("model.safetensors"))),
     (f"{RECIPE}: source: no *.safetensors weights found",)),
    ("tokenizer-missing", lambda c: build(c.source(remove("tokenizer.model", "tokenizer_config.json"))),
     (f"{RECIPE}: source: no tokenizer files",)),
    ("pickle-refused", lambda c: build(c.source(pickled_weights)),
     (f"{RECIPE}: source: pytorch_model.bin holds pickled weights", "set source.allow_pickle: true")),
    ("remote-code-refused", lambda c: build(c.source(remote_code)),
     (f"{RECIPE}: source: config.json needs custom code (auto_map); set source.trust_remote_code: true",)),
    ("unsupported-architecture", lambda c: build(c.source(edit_config(architectures=["FrobnicatorForCausalLM"]))),
     (f"{RECIPE}: convert: architecture FrobnicatorForCausalLM is not supported by llama.cpp b11312",
      "LLAMA_CPP_DIR")),
    # --- the machine and the tools
    ("disk-full-quantize", disk_full,
     (f"{RECIPE}: quantize Q4_0: llama-quantize failed: no space left on device writing work/tiny/quants/tiny-Q4_0.gguf",)),
    ("read-only-work-folder", read_only_records,
     ("work/tiny/records/.quant-Q4_0.json.tmp-", ": Read-only file system")),
    ("llama-cpp-tool-missing", lambda c: (c.env.update(user_llama_cpp(c, drop="llama-imatrix")), build(RECIPE))[-1],
     ("llama.cpp tool llama-imatrix is missing from ", "llama.cpp/build/bin")),
    ("llama-cpp-too-old", lambda c: (c.env.update(user_llama_cpp(c, version="4589 (1d1e6a9)")), build(RECIPE))[-1],
     ("llama.cpp build b4589 in LLAMA_CPP_DIR=", "is older than the minimum b11312")),
    # --- artifact paths never leave artifacts/
    ("artifact-folder-symlink", symlinked_art_dir, ("artifacts/tiny: is a symlink to ", "outside/tiny")),
    ("shard-folder-symlink", symlinked_shard_folder, ("artifacts/tiny/tiny-Q8_0: is a symlink to the folder ",)),
    ("publish-stage-through-symlink", publish_stage_through_link, ("artifacts/tiny: is a symlink to ",)),
    ("dvc-link-name-traversal", lambda c: ["dvc-link", "--name", "../../etc", "--file", "passwd", "--stage", "x"],
     ("'../../etc' is not a recipe name: artifact paths never leave artifacts/",)),
]


@pytest.mark.parametrize("case_id,setup,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_one_line_and_published_untouched(published, tiny_hf, tmp_path, case_id, setup, expected):
    project = tmp_path / "project"
    shutil.copytree(published, project, symlinks=True)
    c = Ctx(project, tiny_hf, tmp_path)
    before = tree_state(project / "artifacts")
    try:
        args = setup(c)
        watched = {str(w): tree_state(w) for w in c.watch}
        res = ggufpipe(args, project, {k: v for k, v in c.env.items() if not k.startswith("_")})
        out = res.stdout + res.stderr
        errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
        assert res.returncode != 0, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        assert len(errors) == 1, out[-3000:]
        print(f"[{case_id}] {errors[0]}")
        for want in expected:
            assert want in errors[0], errors[0]
        if case_id == "disk-full-quantize":  # no partial GGUF under its final name (nor a temporary one)
            assert sorted(p.name for p in Path(c.env["_mounted"]).iterdir()) == [f"{NAME}-F16.gguf",
                                                                                  f"{NAME}-Q8_0.gguf"]
    finally:
        if "_mounted" in c.env:
            subprocess.run(["umount", c.env["_mounted"]], check=True)
    for w, state in watched.items():  # what a link led to, outside artifacts/
        assert tree_state(Path(w)) == state, w
    art = project / "artifacts" / NAME
    if art.is_symlink():  # put the folder back where it was published
        art.unlink()
        shutil.move(str(tmp_path / "outside" / NAME), art)
    with contextlib.suppress(FileNotFoundError):
        (art / f"{NAME}-Q8_0").unlink()  # a link the case made (the real published name is a .gguf file)
    assert tree_state(project / "artifacts") == before
    for p in project.rglob("*"):
        assert ".tmp-" not in p.name, p
        if p.is_file() and not p.is_symlink():
            assert FAKE_TOKEN.encode() not in p.read_bytes(), p


# --------------------------------------------------------------------------- security


def test_fake_token_is_in_no_file_of_a_build(published):
    """The module's build ran with HF_TOKEN set: no log (stage logs, Snakemake's own), record, manifest,
    report, card, metrics or Modelfile holds it."""
    files = [p for p in published.rglob("*") if p.is_file()]
    kinds = {p.name for p in files}
    assert {"manifest.json", "metrics.json", "report.md", "README.md", "Modelfile.Q8_0", "fetch.json",
            "convert-F16.log", "quantize-Q8_0.log"} <= kinds
    assert any(".snakemake" in p.parts and p.suffix == ".log" for p in files)
    for p in files:
        assert FAKE_TOKEN.encode() not in p.read_bytes(), p
