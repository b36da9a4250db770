"""The screened search of the sensitivity stage (issue #32, docs/mixes.md#the-screened-search): a few whole-model
evaluations calibrate a measurement-free error, which predicts the rest.

The exhaustive search measures every group at every candidate (one quantize and one evaluation each). The screened
one measures instead:

1. a **screen** per tensor and type, no evaluation: the tensor as llama-quantize writes it at that type (one whole-model
   quantize per distinct type), dequantized (gguf-py), against the base file's tensor, as a relative
   activation-weighted squared error ``sum_ij (W'_ij - W_ij)^2 a_j / sum_ij W_ij^2 a_j``, with ``a_j`` the mean
   squared input of column ``j`` on the sensitivity text (llama-imatrix's ``in_sum2 / counts``: one pass of the model
   over the text): about the share of the tensor's output the quantization changes. Relative, because absolute
   errors grow with the activations along the depth while the KLD they cause does not (measured:
   docs/mixes.md#the-screened-search). A tensor llama-imatrix does not see (``token_embd``, a lookup) weighs its
   columns alike;
2. **segments**: each role's groups as one run of bands to start with, each tensor outside the blocks alone.
   One evaluation per segment, at its anchor, gives its scale: the mean KLD it added over the floor's, per unit of
   screened error added. The anchor is the candidate with the second-largest screened error over the segment (the
   largest when it has one form): a whole role at the largest measured up to 11 % more than its groups alone
   (docs/mixes.md#the-screened-search), and every cut below inherits that excess;
3. **type probes**, for the roles of one group only (``output``, ``token_embd``, which no cut can resolve): each
   measured at its other written forms, the least screened error first, the role with the most bytes per probe
   first. The probe gives that type's ratio: its KLD per unit of screened error over the anchor's. Measured ratios
   are neither 1 nor monotonic in the type, so a type without a probe keeps the anchor's ratio, never an
   interpolated one;
4. **cuts**: while evaluations remain (at most :data:`EVAL_SHARE`-th of the exhaustive search's, the llama-imatrix
   pass counted as one), the segment of several groups with the most KLD measured (at stake) is cut in two: its
   first half is measured and the second takes what the segment measured beyond it (additive; measured too when
   that leaves it under :data:`IMPLAUSIBLE` x the segment's scale);
5. every group and candidate is then predicted as the floor's mean KLD plus its segment's scale x its role's ratio at
   that type x the screened error that candidate adds over the floor's: what the solver reads, as it reads a
   measurement. A role the cuts left whole whose sibling (:data:`SIBLINGS`, the roles reading one input) was cut
   takes the sibling's scale band by band instead, rescaled to what the role measured (:func:`band_scales`).

A candidate written exactly as another (or as the floor) has the same screen, so the same prediction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.stages.mix.groups import group_tensors

# What the screened error is; part of its cache key.
SCREEN_VERSION = 2
# The screened search's rules (2: type probes; 3: second anchor, probes for roles of one group, cuts by stake); a
# rerun trigger of a screened sensitivity.
SEARCH_VERSION = 3
# A split measures one half and takes the other's KLD as the parent's less it (the additive model); when that leaves
# the other half less than this share of the parent's scale, the halves interact and it is measured too.
IMPLAUSIBLE = 0.1
# Roles that read one input (the attention or FFN norm's output). A role the cuts left whole takes its scale per band
# from a sibling that was cut: measured on the rotated demo, attn_q, attn_k and attn_v peak and dip in the same bands
# (bench/RESULTS.md#third-cut-the-second-anchor-and-cuts-by-stake-2026-12-05).
SIBLINGS = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"), ("ffn_gate_exps", "ffn_up_exps"),
            ("ffn_gate_shexp", "ffn_up_shexp"))
# The screened search spends at most 1/EVAL_SHARE of the exhaustive search's evaluations (issue #32's target).
EVAL_SHARE = 5
# Evaluations the Fisher pass (pipeline/stages/mix/fisher.py) counts as against the cap, in place of the screened
# search's llama-imatrix pass (one): a forward, a backward and the Fisher products over the text an evaluation reads,
# about three forwards' work (its seconds: bench/RESULTS.md#the-fisher-weighted-search-in-the-stage-2026-12-05).
FISHER_CHARGE = 3


def column_importance(imatrix: str | Path) -> dict[str, object]:
    """tensor name -> the mean squared input of each of its columns (numpy), from a llama-imatrix GGUF:
    ``<name>.in_sum2`` over ``<name>.counts`` (tools/imatrix/imatrix.cpp:614-629 of b11312). Experts' matrices
    (``[ne0, n_expert]``) are summed over experts."""
    import numpy as np
    from gguf import GGUFReader

    sums, counts = {}, {}
    for t in GGUFReader(str(imatrix)).tensors:
        if t.name.endswith(".in_sum2"):
            sums[t.name.removesuffix(".in_sum2")] = np.asarray(t.data, dtype=np.float64).reshape(-1, int(t.shape[0]))
        elif t.name.endswith(".counts"):
            counts[t.name.removesuffix(".counts")] = np.asarray(t.data, dtype=np.float64).reshape(-1)
    out = {}
    for name, s in sums.items():
        c = counts.get(name)
        if c is None or c.sum() <= 0:
            continue
        out[name] = s.sum(axis=0) / c.sum()
    return out


def tensor_reader(path: str | Path):
    """``read(name)``: tensor ``name`` of the GGUF at ``path`` dequantized by gguf-py, float32, one row per GGML row
    (``[ne1 * ne2..., ne0]``); PipelineError naming file and tensor if it has none. The header is read by
    pipeline/gguf/reader.py and the data mapped: gguf-py's own reader decodes every metadata array first (seconds
    per file for a 49k-token vocabulary)."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from pipeline.gguf.reader import read_header

    header = read_header(path)
    infos = {t.name: t for t in header.tensors}
    data = np.memmap(path, dtype=np.uint8, mode="r")

    def read(name: str, check_only: bool = False):
        t = infos.get(name)
        if t is None:
            raise PipelineError(f"screen: tensor {name} is missing from {Path(path).name}")
        if check_only:
            return None
        rows = t.n_elements // t.shape[0]
        raw = data[t.offset:t.offset + t.n_bytes].reshape(rows, t.n_bytes // rows)
        return dequantize(raw, GGMLQuantizationType(t.ggml_type)).astype(np.float32, copy=False)
    return read


def weight_errors(base: str | Path, quant: str | Path, names: list[str], importance: dict,
                  threads: int = 1, fisher: dict | None = None) -> dict[str, float]:
    """name -> the relative activation-weighted squared error of the tensor as ``quant`` holds it, against ``base``'s;
    with ``fisher`` (name -> diagonal Fisher in the file's shape, pipeline/stages/mix/fisher.py) instead
    ``1/2 sum F dW^2``. ``threads`` tensors at a time (numpy leaves the interpreter lock while it works on whole
    arrays)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    b, q = tensor_reader(base), tensor_reader(quant)
    for n in names:
        for read in (b, q):
            read(n, check_only=True)

    def one(n: str) -> float:
        w = b(n)
        d = q(n) - w
        if fisher is not None:
            return 0.5 * float(np.einsum("ij,ij->", fisher[n].reshape(d.shape[0], -1), d.reshape(d.shape[0], -1) ** 2,
                                         dtype=np.float64))
        w, d = w.reshape(-1, w.shape[-1]), d.reshape(-1, w.shape[-1])
        err, ref = (np.einsum("ij,ij->j", x, x, dtype=np.float64) for x in (d, w))  # per input column
        a = importance.get(n)
        if a is None or a.shape[0] != err.shape[0]:  # a lookup table (token_embd), or a tensor imatrix did not see
            a = np.ones_like(err)
        ref_sum = float(ref @ a)
        return float(err @ a) / ref_sum if ref_sum > 0 else 0.0

    with ThreadPoolExecutor(max(1, threads)) as pool:
        return dict(zip(names, pool.map(one, names), strict=True))


@dataclass
class Segment:
    """A run of one role's groups (or one group outside the blocks) measured together at ``anchor``."""
    role: str
    groups: tuple[str, ...]  # group names, in band order
    anchor: str = ""
    added_error: float = 0.0  # screened error the anchor adds over the floor, over the segment's tensors
    added_kld: float = 0.0  # measured mean KLD over the floor's
    scale: float = 0.0
    measured: dict = field(default_factory=dict)  # the anchor's KEPT statistics
    derived: bool = False  # added_kld is its parent's less its measured sibling's
    profile_from: str = ""  # a role left whole: the sibling role whose scale per band it takes (band_scales)

    def describe(self) -> dict:
        return {"role": self.role, "groups": list(self.groups), "anchor": self.anchor,
                "added_error": float(f"{self.added_error:.6g}"), "added_kld": round(self.added_kld, 8),
                "scale": float(f"{self.scale:.6g}"), **({"derived": True} if self.derived else {}),
                **({"profile_from": self.profile_from} if self.profile_from else {})}


def first_segments(groups: list, runs: int = 1) -> list[Segment]:
    """Each role's groups (band order) in ``runs`` runs (fewer when it has fewer groups); a group outside the blocks
    alone."""
    by_role: dict[str, list] = {}
    for g in groups:
        by_role.setdefault(g.role, []).append(g)
    out = []
    for role, gs in sorted(by_role.items()):
        names = tuple(g.name for g in sorted(gs, key=lambda g: g.band or (0, 0)))
        k = min(runs, len(names))
        out += [Segment(role, names[i * len(names) // k:(i + 1) * len(names) // k]) for i in range(k)]
    return out


def split(seg: Segment) -> tuple[Segment, Segment]:
    half = (len(seg.groups) + 1) // 2
    return Segment(seg.role, seg.groups[:half]), Segment(seg.role, seg.groups[half:])


def anchor_of(groups: tuple[str, ...], cands: tuple[str, ...], added) -> str:
    """The candidate a segment is measured at: the second-largest distinct screened error over its groups (the
    largest when the segment has one written form other than the floor's); on equal errors the earlier candidate."""
    errs = {c: round(added(groups, c), 12) for c in cands}
    forms: dict[float, str] = {}
    for c in sorted(cands, key=lambda c: (-errs[c], cands.index(c))):
        forms.setdefault(errs[c], c)
    ranked = [c for e, c in forms.items() if e > 0] or [cands[0]]
    return ranked[min(1, len(ranked) - 1)]


def exhaustive_runs(groups: list, types: dict[str, dict[str, str]], floor: str, cands: tuple[str, ...]) -> int:
    """The evaluations the exhaustive search runs: the floor and, per group, each distinct written form of its
    candidates other than the floor's."""
    n = 1
    for g in groups:
        forms = {tuple(types[c][t] for t in g.tensors) for c in cands}
        forms.discard(tuple(types[floor][t] for t in g.tensors))
        n += len(forms)
    return n


def screened_search(measure, plan, floor_type: str, cands: tuple[str, ...], flavour: str, errors: dict,
                    cap: int, probe_all: bool = False) -> tuple[dict, list[dict], list[Segment], list[dict]]:
    """The floor, the segments measured (adaptive bands within ``cap`` evaluations), the type probes and every
    group's predicted entry. ``measure(label, assign)``: the KEPT statistics of a map (cached); ``errors``: type ->
    tensor -> screened error (:func:`weight_errors`); ``cap``: evaluations allowed, the floor's included;
    ``probe_all`` (the Fisher search): type probes for every role, the role that measured the most KLD first, before
    any cut (the Fisher error tracks the bands well enough that the types' ratios matter more,
    docs/mixes.md#the-fisher-weighted-search)."""
    floor_map = dict.fromkeys(plan.quantized, floor_type)
    floor = measure("floor", floor_map)
    print(f"[sensitivity {flavour}] floor {floor_type}: mean KLD {floor['kld_mean']:.6f}", flush=True)
    by_name = {g.name: g for g in plan.groups}

    def added(names, c) -> float:
        return sum(max(0.0, errors[c][t] - errors[floor_type][t]) for g in names for t in by_name[g].tensors)

    def tensors_of(names) -> list[str]:
        return [t for g in names for t in by_name[g].tensors]

    def run(seg: Segment, anchor: str | None = None) -> Segment:
        seg.anchor = anchor or anchor_of(seg.groups, cands, added)
        seg.added_error = added(seg.groups, seg.anchor)
        got = measure(f"{'+'.join(seg.groups)} at {seg.anchor}",
                      {**floor_map, **dict.fromkeys(tensors_of(seg.groups), seg.anchor)})
        seg.added_kld = got["kld_mean"] - floor["kld_mean"]
        seg.scale = max(0.0, seg.added_kld) / seg.added_error if seg.added_error > 0 else 0.0
        seg.measured = got
        print(f"[sensitivity {flavour}] segment {seg.groups[0]}..{seg.groups[-1]} at {seg.anchor}: mean KLD "
              f"{got['kld_mean']:.6f}", flush=True)
        return seg

    # groups every candidate writes as the floor: nothing to measure, nothing to choose
    live = [g for g in plan.groups if any(errors[c][t] != errors[floor_type][t] for c in cands for t in g.tensors)]
    segs = [run(s) for s in first_segments(live)]
    used = 1 + len(segs)
    # type probes: each role of one group (with probe_all every role) at its other written forms
    probes: list[dict] = []
    if probe_all:
        order = probe_order(segs, cands, added, lambda s: max(s.added_kld, 0.0))
    else:
        order = probe_order([s for s in segs if len(s.groups) == 1], cands, added,
                            lambda s: sum(plan.group_bytes(by_name[g], floor_type) for g in s.groups))
    for role_seg, c in order[:max(0, cap - used)]:
        got = measure(f"{role_seg.role} at {c}", {**floor_map, **dict.fromkeys(tensors_of(role_seg.groups), c)})
        e = added(role_seg.groups, c)
        k = got["kld_mean"] - floor["kld_mean"]
        probes.append({"role": role_seg.role, "type": c, "added_error": e, "added_kld": k, "measured": got,
                       "ratio": (max(0.0, k) / e) / role_seg.scale if e > 0 and role_seg.scale > 0 else 1.0})
        used += 1
        print(f"[sensitivity {flavour}] probe {role_seg.role} at {c}: mean KLD {got['kld_mean']:.6f}", flush=True)
    whole = {s.role: s for s in segs}
    while used < cap:
        # the most KLD at stake: the segment of several groups that measured the most
        ranked = sorted(((max(s.added_kld, 0.0), -i) for i, s in enumerate(segs) if len(s.groups) > 1), reverse=True)
        if not ranked or ranked[0][0] <= 0:
            break
        i = -ranked[0][1]
        parent, (first, rest) = segs[i], split(segs[i])
        run(first, parent.anchor)  # one evaluation: the rest is what the parent measured beyond it (additive)
        used += 1
        rest.anchor, rest.added_error, rest.derived = parent.anchor, added(rest.groups, parent.anchor), True
        rest.added_kld = parent.added_kld - first.added_kld
        rest.scale = max(0.0, rest.added_kld) / rest.added_error if rest.added_error > 0 else 0.0
        if rest.scale < IMPLAUSIBLE * parent.scale and used < cap:  # the parts interact: measure the rest too
            run(rest, parent.anchor)
            rest.derived = False
            used += 1
        segs[i:i + 1] = [first, rest]
    seg_of = {g: s for s in segs for g in s.groups}
    scales = band_scales(segs, by_name, added)
    out_groups = []
    for g in plan.groups:
        entry = {"group": g.name, "role": g.role, "band": list(g.band) if g.band else None, "tensors": list(g.tensors),
                 "bytes": {c: plan.group_bytes(g, c) for c in (floor_type, *cands)}, "kld": {}}
        s = seg_of.get(g.name)
        for c in cands:
            w = whole.get(g.role)
            probe = probe_for(probes, g.role, added(w.groups, c)) if w else None  # a probe prices a written form
            if s is not None and s.groups == (g.name,) and c == s.anchor and not s.derived:
                entry["kld"][c] = {**s.measured, "source": "measured"}
            elif probe is not None and w.groups == (g.name,):
                entry["kld"][c] = {**probe["measured"], "source": "measured"}
            else:
                ratio = probe["ratio"] if probe is not None else 1.0
                d = scales[g.name] * added((g.name,), c) * ratio if s is not None else 0.0
                entry["kld"][c] = {"kld_mean": round(floor["kld_mean"] + d, 8), "source": "screened"}
        out_groups.append(entry)
    return floor, out_groups, segs, [{k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in p.items()
                                      if k != "measured"} for p in probes]


def band_scales(segs: list[Segment], by_name: dict, added) -> dict[str, float]:
    """group -> the KLD per unit of screened error its predictions use: its segment's scale; for a role left whole
    (one segment of several groups) with a sibling (:data:`SIBLINGS`) that was cut, the sibling's scale band by band
    (the sibling cut into the most segments), rescaled so that the role's groups at its anchor still add up to what
    the role measured. The role's segment records the sibling (``profile_from``)."""
    out = {g: s.scale for s in segs for g in s.groups}
    by_role: dict[str, list[Segment]] = {}
    for s in segs:
        by_role.setdefault(s.role, []).append(s)
    for role, ss in by_role.items():
        whole = ss[0]
        family = next((f for f in SIBLINGS if role in f), ())
        cut = [r for r in family if r != role and len(by_role.get(r, ())) > 1]
        if len(ss) > 1 or len(whole.groups) < 2 or not cut:
            continue
        src = max(cut, key=lambda r: len(by_role[r]))  # the first of the family on a tie
        per_band = {by_name[g].band: s.scale for s in by_role[src] for g in s.groups}
        raw = {g: per_band.get(by_name[g].band) for g in whole.groups}
        if None in raw.values():
            continue
        total = sum(raw[g] * added((g,), whole.anchor) for g in whole.groups)
        if total <= 0 or whole.added_kld <= 0:
            continue
        for g in whole.groups:
            out[g] = raw[g] * whole.added_kld / total
        whole.profile_from = src
    return out


def probe_order(segs: list[Segment], cands: tuple[str, ...], added, role_bytes) -> list[tuple[Segment, str]]:
    """The type probes in the order they are measured. Per role (a first segment): its candidates other than the
    anchor whose screened error differs from the anchor's and each other's (written differently), the least error
    first (the types a budget near the role's top chooses between). Across roles: the most bytes per probe first
    (a role's bytes over one more than the probes it already has), so that a large role of one group (``output``,
    ``token_embd``) is measured at each of its forms before a small role gets its first."""
    forms = {}
    for s in segs:
        seen, forms[s.role] = {round(s.added_error, 12), 0.0}, []
        for c in sorted(cands, key=lambda c: (added(s.groups, c), cands.index(c))):
            e = round(added(s.groups, c), 12)
            if e not in seen:
                seen.add(e)
                forms[s.role].append(c)
    order, taken = [], dict.fromkeys(forms, 0)
    by_role = {s.role: s for s in segs}
    while True:
        left = [s for s in segs if taken[s.role] < len(forms[s.role])]
        if not left:
            return order
        s = min(left, key=lambda s: (-role_bytes(s) / (1 + taken[s.role]), s.role))
        order.append((by_role[s.role], forms[s.role][taken[s.role]]))
        taken[s.role] += 1


def probe_for(probes: list[dict], role: str, error: float) -> dict | None:
    """The probe of ``role`` at the written form whose screened error over the role is ``error`` (candidates written
    alike share it), or None: that type keeps the anchor's ratio. Not interpolated between forms: measured ratios are
    not monotonic in the type (docs/mixes.md#the-screened-search)."""
    return next((p for p in probes if p["role"] == role and round(p["added_error"], 12) == round(error, 12)), None)


def screened_cap(exhaustive: int, charge: int = 1) -> int:
    """The evaluations the screened search may run, the floor's included: a fifth (:data:`EVAL_SHARE`) of the
    exhaustive search's less ``charge``, what its weighting pass counts as (the llama-imatrix pass: one; the Fisher
    pass: :data:`FISHER_CHARGE`)."""
    return max(1, exhaustive // EVAL_SHARE) - charge


def planned_runs(names: list[str], n_bands: int, n_cands: int, search: str) -> dict:
    """What a search of quantized tensors ``names`` will run, before any file exists (``ggufpipe plan``): the
    exhaustive count counts every candidate (the dry run that finds duplicates needs the file), the screened and
    Fisher ones their cap (the llama-imatrix or Fisher pass counted in it) and one whole-model quantize per type."""
    groups = group_tensors(names, n_bands)
    exhaustive = 1 + len(groups) * n_cands
    if search == "exhaustive":
        return {"evaluations": exhaustive, "quantizes": exhaustive, "imatrix_passes": 0, "fisher_passes": 0,
                "screened_types": 0, "exhaustive": exhaustive}
    first = 1 + len(first_segments(groups))
    fisher = search == "fisher"
    evals = max(first, screened_cap(exhaustive, FISHER_CHARGE if fisher else 1))
    return {"evaluations": evals, "quantizes": evals + 1 + n_cands, "imatrix_passes": int(not fisher),
            "fisher_passes": int(fisher), "screened_types": 1 + n_cands, "exhaustive": exhaustive}
