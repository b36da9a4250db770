"""A measured mix with an importance matrix (docs/mixes.md), with the real tools on a generated 2-layer Llama of
256-divisible widths: llama-imatrix, then the `plain-imatrix` sensitivity of IQ4_XS and Q5_K (IQ candidates need the
matrix), the solve and the quantize, each passing the matrix to llama-quantize; the file is written as solved, to
the byte, and records the matrix it was made with. The quantize gets its paths relative to the build folder, as a
Snakemake build gives them."""

from __future__ import annotations

from helpers import BOTCHAN, CALIB

from pipeline.gguf.reader import read_header
from pipeline.recipe import load_recipe
from pipeline.recipe.tensor_map import read_map

KEY = "Q4_K_M_IMIX"


def test_imatrix_mix_round_trip(tmp_path, toolchain, quantize_exe, monkeypatch):
    from helpers.gguf_factory import tiny_llama

    from pipeline.stages.imatrix import imatrix
    from pipeline.stages.mix.sensitivity import sensitivity
    from pipeline.stages.mix.solve import solve
    from pipeline.stages.quantize import quantize

    base = tiny_llama(tmp_path / "tiny-F16.gguf", toolchain.root / "vocab" / "ggml-vocab-llama-spm.gguf", n_layer=2,
                      n_embd=256, n_head=4, n_head_kv=2, n_ff=512, dtype="F16")
    recipe_path = tmp_path / "r.yaml"
    recipe_path.write_text(f"""\
name: r
source: {{path: {tmp_path}}}
quants:
  - {{type: mix, label: {KEY}, imatrix: true, budget: {{size_of: Q4_K_M}}, candidates: [IQ4_XS, Q5_K]}}
imatrix: {{calibration: {CALIB}, ctx: 128, chunks: 2}}
sensitivity: {{text: {CALIB}, ctx: 128, chunks: 2, bands: 1}}
gates: [{{name: botchan, text: {BOTCHAN}, ctx: 256, chunks: 17}}]
""")
    r = load_recipe(recipe_path, quantize_exe)
    q = r.quant(KEY)
    assert q.imatrix and q.flavour == "plain-imatrix" and r.mix_flavours == ["plain-imatrix"]
    im = tmp_path / "imatrix" / "imatrix-plain.gguf"
    im.parent.mkdir()
    imatrix(r, "plain", base, im, tmp_path / "imatrix.json", log=tmp_path / "log", threads=2, tc=toolchain)
    sens = tmp_path / "sens.json"
    data = sensitivity(r, "plain-imatrix", base, base, sens, tmp_path / "rec.json", tmp_path / "scratch",
                       imatrix=im, threads=2, log=tmp_path / "log", tc=toolchain)
    assert data["imatrix_sha256"] and data["candidates"] == ["IQ4_XS", "Q5_K"]
    mp, lay = tmp_path / "mix" / f"r-{KEY}.tensor-types.txt", tmp_path / "mix" / "layout.json"  # not beside im
    mp.parent.mkdir()
    layout = solve(r, KEY, sens, base, mp, lay, imatrix=im, log=tmp_path / "log", tc=toolchain)
    out = tmp_path / "mix.gguf"
    # paths relative to the build folder, as Snakemake hands them (llama-quantize runs beside the matrix)
    monkeypatch.chdir(tmp_path)
    rec = quantize(r, KEY, base, out, tmp_path / "q.json", log=tmp_path / "log", threads=2, tc=toolchain,
                   imatrix=im.relative_to(tmp_path), mix=(mp.relative_to(tmp_path), lay.relative_to(tmp_path)))
    header = read_header(out)
    written = {t.name: t.type_name for t in header.tensors}
    for pattern, qtype, _ in read_map(mp):
        assert written[pattern[1:-1].replace("\\.", ".")] == qtype
    assert layout["histogram"].get("IQ4_XS", 0) >= 1  # an IQ candidate written with the matrix
    assert out.stat().st_size == layout["predicted"]["bytes"] == rec["tensor_types"]["bytes"]["written"]
    assert header.get("quantize.imatrix.file") == im.name and rec["imatrix_sha256"]
