"""The light paths: manifests, `verify` and `info` work on a demo build without the heavy packages, numpy and
gguf included (what a device has; tests/integration/test_device.py installs one)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_light_paths_need_no_heavy_packages(demo_build):
    """pipeline.gguf / manifest / verify / cli import, verify a file and print its facts with torch,
    transformers, awq, snakemake, huggingface_hub, tokenizers, matplotlib, numpy and gguf made unimportable."""
    target = demo_build / "artifacts" / "smollm2-135m" / "smollm2-135m-Q4_K_M.gguf"
    code = textwrap.dedent(f"""
        import sys
        class Block:
            HEAVY = ("torch", "transformers", "awq", "snakemake", "huggingface_hub", "tokenizers", "matplotlib",
                     "numpy", "gguf")
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in self.HEAVY:
                    raise ImportError(f"blocked heavy import: {{name}}")
        sys.meta_path.insert(0, Block())
        import pipeline.gguf, pipeline.stages.publish, pipeline.distribution.verify, pipeline.recipe
        from pipeline.cli import main
        rc = main(["verify", {str(target)!r}]) or main(["info", {str(target)!r}])
        heavy = [m for m in sys.modules if m.split(".")[0] in Block.HEAVY]
        print("rc", rc, "heavy", heavy)
        sys.exit(rc)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "rc 0 heavy []" in res.stdout
