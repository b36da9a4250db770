"""The publish stage's part of the on-device check (docs/device-check.md).

* :func:`device_check_section`: the manifest's ``device_check`` (the slice ``device-slice.logits``: SHA256, size, eval
  set, chunks, the tolerance a device is judged by) and each base and quant entry's ``slice`` values, as the build
  box measured them (pipeline/stages/device_slice.py).
* :func:`device_results`: what ``ggufpipe collect`` gathered in ``artifacts/<name>/devices.json`` (an input of publish:
  the report and the card show it), kept only for files the manifest publishes, each checked and judged again as
  ``collect`` does. Not part of the manifest: a rebuild-check rebuilds without the devices, and the results must not
  change what a build is.
"""

from __future__ import annotations

from pipeline.errors import ArtifactError, PipelineError
from pipeline.fsutil import sha256_file
from pipeline.layout import Layout
from pipeline.records import DeviceSliceRecord
from pipeline.stages.device_results import published, stored_results
from pipeline.stages.device_verdict import same_top_p_limit as same_top_p_limit  # the tolerance's rule, re-exported

SLICE_FILE = "device-slice.logits"
# |Δ mean KLD| <= max(kld_mean_abs, kld_mean_rel x the build box's), as issue #20 sets it. |Δ same top p| <= the larger
# of the same_top_p_points and same_top_p_sigmas standard deviations of the net change that near-tied tokens
# flipping at same_top_p_flip_rate give on the slice's scored tokens: 100 * sqrt(rate / n) points. Widened after
# measuring (docs/device-check.md): an AVX-512 build of the same llama.cpp changed the top token on 2.9-5.5 % of the
# demo slice's 510 tokens, Q5_K_M's same top p by 1.8 points, while its mean KLD stayed at 11 % of its limit.
TOLERANCE = {"kld_mean_abs": 0.002, "kld_mean_rel": 0.10, "same_top_p_points": 1.0, "same_top_p_flip_rate": 0.08,
             "same_top_p_sigmas": 3}
SLICE_METRICS = ("kld_mean", "same_top_p", "ppl_q")


def device_check_section(recipe, layout: Layout, entries: dict[str, dict], chunk_rows: dict[str, list]) -> dict | None:
    """The manifest's ``device_check`` section, and each entry of ``entries`` (by key: the base and the quants) given
    its ``slice`` values: the base's from the device_slice record, a quant's from its ``chunk_rows`` on the first eval
    set (read by the publish stage with the rest of its eval record); None (and no ``slice``) when the recipe publishes
    no slice (``device_slice: 0``)."""
    n = recipe.device_slice
    if not n:
        return None
    name, es = recipe.name, recipe.first_eval_set
    path = layout.device_slice_record(name)
    rec = DeviceSliceRecord.read(path)
    if (rec.eval_set, rec.chunks, rec.ctx) != (es.name, n, es.ctx):
        raise PipelineError(f"{path}: a slice of {rec.chunks} chunk(s) of eval set {rec.eval_set} at ctx "
                            f"{rec.ctx}, the recipe asks for {n} of {es.name} at ctx {es.ctx}: re-run device_slice")
    slice_path = layout.device_slice(name)
    if not slice_path.is_file() or slice_path.stat().st_size != rec.size_bytes:
        raise ArtifactError(slice_path, f"{slice_path}: missing or not the {rec['size_bytes']} bytes {path} records: "
                                        "re-run device_slice")
    base_key = recipe.base_key
    for key, entry in entries.items():
        if key == base_key:
            values = rec.base_metrics
        else:
            rows = chunk_rows[key]
            if len(rows) < n:
                raise PipelineError(f"{layout.eval_record(name, es.name, key)}: {len(rows)} chunk rows, the device "
                                    f"slice needs {n}: re-run the eval stage (`snakemake --forcerun eval`)")
            values = rows[n - 1]
        entry["slice"] = {k: values[k] + 0.0 for k in SLICE_METRICS}  # + 0.0: no "-0.0"
    return {"file": SLICE_FILE, "sha256": rec.sha256, "size_bytes": rec.size_bytes, "eval_set": es.name,
            "text_sha256": rec.text_sha256, "ctx": es.ctx, "chunks": n, "scored_tokens": rec.scored_tokens,
            "n_vocab": rec.n_vocab, "tolerance": dict(TOLERANCE)}


def publish_slice(layout: Layout, name: str, manifest: dict, link) -> set[str]:
    """Link the slice into ``artifacts/<name>/`` (checked against the manifest's SHA256); remove one no longer
    published. Returns the file names kept."""
    dest = layout.art_dir(name) / SLICE_FILE
    dc = manifest.get("device_check")
    if not dc:
        dest.unlink(missing_ok=True)
        return set()
    src = layout.device_slice(name)
    if sha256_file(src) != dc["sha256"]:
        raise ArtifactError(src, f"{src}: not the slice the manifest records (SHA256 {dc['sha256'][:16]}…): re-run "
                                 "device_slice")
    link(src, dest)
    return {SLICE_FILE}


def device_results(layout: Layout, name: str, manifest: dict) -> list[dict]:
    """The results in ``artifacts/<name>/devices.json`` (``ggufpipe collect``) whose file is published by ``manifest``
    with the same SHA256, in file then device order; [] without the file or without a slice to judge them by.

    A devices.json can be edited by hand or in a pull request, so every result is checked and judged again by the
    function ``collect`` uses (pipeline/stages/device_results.py ``stored_results``): a verdict that its numbers
    contradict is shown as they judge it (a note says so), and a result that cannot be checked stops the publish in
    one line naming the file and field (shown as it is it would be unchecked; dropped, a FAIL could vanish)."""
    path = layout.device_results(name)
    if not manifest.get("device_check"):
        return []
    merged, notes = stored_results(path, published(layout.manifest(name), manifest))
    for note in notes:
        print(f"publish: {path}: {note}", flush=True)
    order = [e["file"] for e in manifest["artifacts"]]
    return [merged[k][1] for k in sorted(merged, key=lambda k: (order.index(k[1]), k[0]))]
