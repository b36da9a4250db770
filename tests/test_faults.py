"""Kill -9 at fixed points of every long stage, then re-run: the build finishes with the clean build's bytes.

A tiny Llama generated here (tests/test_awq.py) is placed in a local hub cache, so the fetch stage goes
through the real ``snapshot_download`` (``HF_HUB_OFFLINE=1``), and built once cleanly (the reference).
In a second folder the same build is run again and again, each run killed at one point by the test-only
hook of pipeline/fsutil.py (``PIPELINE_TEST_KILL``): fetch before its rename, convert after its rename,
llama-quantize itself mid-write (a partial temporary file stays), eval after llama-perplexity exited,
publish between linking the GGUFs and renaming the manifest, and Snakemake itself with all its jobs (a
power cut) after publish renamed the manifest. After each kill: Snakemake failed; every file under its
final name is one the reference build has, every GGUF among them is complete (header and data) and
byte-equal to the reference's; a manifest present lists only files that verify; temporary files are the
only leftovers, and the next run removes them. The last run finishes and every GGUF SHA256, the manifest
(less its volatile ``build`` section) and the metrics equal the reference's.

Also here: the bounded re-run of llama-perplexity when b11312 loses its last output lines at exit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import ROOT, snakemake

from pipeline.errors import PipelineError
from pipeline.fsutil import MID_WRITE_BYTES, sha256_file
from pipeline.ggufheader import read_header
from pipeline.manifest import strip_volatile

NAME = "tiny-faults"
REPO = "ggufpipe-test/tiny-faults"
COMMIT = "fa17ed0000000000000000000000000000c0ffee"
DATA = Path(__file__).parent / "data" / "perplexity"
TMP_RE = re.compile(r"^\..+\.tmp-\d+$")
BYTE_EQUAL = (".gguf", ".safetensors", ".logits", ".model")  # deterministic outputs and fetched files


@pytest.fixture(scope="module")
def hub_recipe(tmp_path_factory):
    """The tiny model in a local hub cache under a pinned commit, and a recipe fetching it from there."""
    from test_awq import make_tiny_llama

    from pipeline.demo import place_in_hub_cache

    base = tmp_path_factory.mktemp("faults")
    hub = base / "hub"
    place_in_hub_cache(make_tiny_llama(base / "hf"), hub, REPO, COMMIT)
    recipe = base / "recipes" / f"{NAME}.yaml"
    recipe.parent.mkdir()
    recipe.write_text(f"""\
name: {NAME}
source: {{repo: {REPO}, revision: "{COMMIT}"}}
bench: false
quants: [Q8_0, Q4_0]
gates:   # a random model: thresholds it passes; the point is that every stage runs
  - {{name: botchan, text: {ROOT / 'data' / 'botchan.txt'}, ctx: 256, chunks: 17, max_ppl_ratio: 100,
     max_kld_mean: 100, max_kld_p99: 100, min_same_top_p: 0}}
""")
    return hub, recipe


@pytest.fixture(scope="module")
def reference(tmp_path_factory, hub_recipe):
    hub, recipe = hub_recipe
    folder = tmp_path_factory.mktemp("faults-ref")
    res = snakemake(folder, recipe, hub=hub)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return folder


def outputs(folder: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """(files and folders under their final names, temporaries) under work/ and artifacts/, by relative path."""
    final, temps = {}, {}
    for top in ("work", "artifacts"):
        for p in sorted((folder / top).rglob("*")):
            rel = str(p.relative_to(folder))
            parts = p.relative_to(folder).parts
            if any(TMP_RE.match(x) for x in parts[:-1]):
                continue  # inside a temporary folder
            (temps if TMP_RE.match(p.name) else final)[rel] = p
    return final, temps


def check_after_kill(folder: Path, ref: Path, res, temps_expected: list[str]) -> dict[str, Path]:
    """What a killed run may leave: complete files the reference has, and temporaries; returns the temporaries."""
    assert res.returncode != 0, res.stdout[-2000:] + res.stderr[-2000:]
    final, temps = outputs(folder)
    for rel, p in final.items():
        assert (ref / rel).exists(), f"{rel}: left by the killed run, not in the reference build"
        if p.is_file() and p.suffix == ".gguf":
            read_header(p)  # a complete header and all tensor data (PipelineError otherwise)
        if p.is_file() and p.suffix in BYTE_EQUAL:
            assert sha256_file(p) == sha256_file(ref / rel), f"{rel}: differs from the reference build"
        if p.suffix == ".json":
            json.loads(p.read_text())
    manifest = folder / "artifacts" / NAME / "manifest.json"
    if manifest.exists():
        from pipeline.verify import verify

        for e in json.loads(manifest.read_text())["artifacts"]:
            verify(manifest.parent / e["file"])
    assert sorted(re.sub(r"\d+$", "N", t) for t in temps) == sorted(temps_expected), (sorted(temps), res.stderr[-2000:])
    return temps


KILLS = [
    # (PIPELINE_TEST_KILL, temporaries the killed run leaves (pid as N), the rule that failed)
    ("before-rename:/hf", [f"work/{NAME}/.hf.tmp-N"], "fetch"),
    ("after-rename:-F16.gguf", [], "convert"),  # the F16 was in place, its record not: Snakemake removes it
    ("mid-write:-Q8_0.gguf", [f"work/{NAME}/quants/.{NAME}-Q8_0.gguf.tmp-N"], "quantize"),
    ("after-tool:llama-perplexity", [], "eval"),  # the only llama-perplexity run left: eval of Q8_0
    ("before-rename:/manifest.json", [f"artifacts/{NAME}/.manifest.json.tmp-N"], "publish"),
]


def test_killed_builds_resume_to_the_reference_bytes(hub_recipe, reference, tmp_path):
    hub, recipe = hub_recipe
    folder = tmp_path / "k"
    previous: dict[str, Path] = {}
    for spec, temps_expected, rule in KILLS:
        res = snakemake(folder, recipe, hub=hub, extra=["--keep-going"], env={"PIPELINE_TEST_KILL": spec},
                        new_session=True)
        assert f"Error in rule {rule}:" in res.stdout + res.stderr, (spec, res.stderr[-2000:])
        temps = check_after_kill(folder, reference, res, temps_expected)
        assert not (set(previous) & set(temps)), f"{spec}: the re-run left the killed run's temporaries"
        previous = temps
        if spec.startswith("mid-write"):
            (tmp,) = temps.values()  # llama-quantize was stopped mid-write: a partial file, never renamed
            assert tmp.stat().st_size == MID_WRITE_BYTES
            with pytest.raises(PipelineError, match="not a GGUF file"):  # its header is written last
                read_header(tmp)
        if spec.startswith("before-rename:/manifest"):  # GGUFs published, no manifest (none lists them yet)
            art = folder / "artifacts" / NAME
            assert sorted(p.name for p in art.glob("*.gguf")) == sorted(p.name for p in
                                                                       (reference / "artifacts" / NAME).glob("*.gguf"))
            assert not (art / "manifest.json").exists()

    # a power cut: Snakemake and its jobs killed together, once publish renamed the manifest into place
    res = snakemake(folder, recipe, hub=hub, env={"PIPELINE_TEST_KILL": "after-rename:/manifest.json:group"},
                    new_session=True)
    assert res.returncode == -9
    check_after_kill(folder, reference, res, [])
    assert any((folder / ".snakemake" / "incomplete").iterdir())  # what plain Snakemake refuses to go past
    res = snakemake(folder, recipe, hub=hub)
    assert res.returncode != 0 and "--unlock" in res.stdout + res.stderr  # its lock stays: Snakemake's own one-line hint
    res = snakemake(folder, recipe, hub=hub, extra=["--unlock"])
    assert res.returncode == 0, res.stderr[-2000:]

    # a plain run finishes (profiles/default: --rerun-incomplete) with the reference's bytes
    res = snakemake(folder, recipe, hub=hub)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    final, temps = outputs(folder)
    assert not temps
    ggufs = sorted(rel for rel in final if rel.endswith(".gguf"))
    assert ggufs == sorted(rel for rel in outputs(reference)[0] if rel.endswith(".gguf")) and len(ggufs) == 6
    for rel in ggufs:
        assert sha256_file(folder / rel) == sha256_file(reference / rel), rel
    art, ref_art = folder / "artifacts" / NAME, reference / "artifacts" / NAME
    assert strip_volatile(json.loads((art / "manifest.json").read_text())) == strip_volatile(
        json.loads((ref_art / "manifest.json").read_text()))
    assert (art / "metrics.json").read_bytes() == (ref_art / "metrics.json").read_bytes()
    res = snakemake(folder, recipe, hub=hub, extra=["--dry-run"])
    assert res.returncode == 0 and "Nothing to be done" in res.stdout + res.stderr


# ------------------------------------------------------------------ llama-perplexity losing its last lines


def _runner(outputs_: list[tuple[int, str]], calls: list):
    from pipeline.tools import ToolResult

    def run_tool(tc, name, args, log, check=True, cwd=None):
        calls.append(name)
        rc, out = outputs_[min(len(calls), len(outputs_)) - 1]
        return ToolResult(rc, out, 0.1)
    return run_tool


KLD = (DATA / "kld-q4_k_m.txt").read_text()
KLD_CUT = KLD[:KLD.index("Median  KLD")]  # lost from the middle of the statistics


def _base_record(tmp_path: Path) -> tuple[Path, Path]:
    rec = tmp_path / "base.json"
    rec.write_text(json.dumps({"text": "botchan.txt", "text_sha256": "0" * 64, "scored_tokens": 4080}))
    logits = tmp_path / "base.logits"
    logits.write_bytes(b"x")
    return rec, logits


@pytest.mark.parametrize("runs,calls_expected,error", [
    ([(0, KLD_CUT), (0, KLD)], 2, None),  # lost once: re-run, logged
    ([(0, KLD_CUT), (0, KLD_CUT), (0, KLD)], 3, None),
    ([(0, KLD_CUT)], 3, "printed no KL divergence statistics|lacks"),  # bounded: 1 + 2 re-runs, then the error
    ([(1, KLD_CUT)], 1, "exited 1"),  # not the symptom: no re-run
    ([(0, KLD_CUT + "0.99.000.000 E kl_divergence: failed reading log-probs\n")], 1, "failed reading log-probs"),
    ([(0, KLD.replace("Maximum KLD", "Max KLD"))], 1, "lacks kld_max"),  # complete but changed: no re-run
])
def test_eval_reruns_only_when_the_final_lines_are_lost(tmp_path, monkeypatch, runs, calls_expected, error):
    from pipeline.evaluate import eval_quant
    from pipeline.recipe import EvalSet

    calls: list = []
    monkeypatch.setattr("pipeline.evaluate.run_tool", _runner(runs, calls))
    rec, logits = _base_record(tmp_path)
    es = EvalSet(name="botchan", text=ROOT / "data" / "botchan.txt", ctx=512, chunks=16)
    log = tmp_path / "eval.log"
    if error:
        with pytest.raises(PipelineError, match=error):
            eval_quant("r", "Q4_K_M", es, tmp_path / "q.gguf", logits, rec, tmp_path / "out.json", log=log, tc=object())
    else:
        out = eval_quant("r", "Q4_K_M", es, tmp_path / "q.gguf", logits, rec, tmp_path / "out.json", log=log, tc=object())
        assert out["metrics"]["kld_mean"] == 0.045521
    assert len(calls) == calls_expected
    notes = log.read_text().count("lost its final lines") if log.exists() else 0
    assert notes == min(calls_expected - 1, 2)


def test_base_eval_reruns_on_a_real_lost_tail(tmp_path, monkeypatch, capsys):
    """A real capture: llama-perplexity b11312 exited 0 after printing chunk 13 of 17 (tiny model, 2 cores)."""
    from pipeline.evaluate import has_final_estimate, run_perplexity

    lost = (DATA / "lost-tail-base.txt").read_text()
    assert "Final estimate" not in lost and "calculating perplexity over 17 chunks" in lost
    calls: list = []
    monkeypatch.setattr("pipeline.evaluate.run_tool", _runner([(0, lost), (0, (DATA / "base.txt").read_text())], calls))
    res = run_perplexity(object(), [], tmp_path / "base.log", has_final_estimate, "r: eval set botchan: base")
    assert has_final_estimate(res.output) and calls == ["llama-perplexity"] * 2
    assert "warning: r: eval set botchan: base: llama-perplexity exited 0 but its output lost its final lines" \
        in capsys.readouterr().err
