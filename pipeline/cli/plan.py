"""``ggufpipe plan RECIPE``: what the recipe's build will need before it runs: disk per output, RAM per stage, the
Slurm resources each rule would request (the functions each stage declares) and hours on a stated box, all
from the checkpoint's config.json and safetensors headers (pipeline/devices/plan.py, docs/planning.md)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.bounds import CORES, SIZE_MAX
from pipeline.devices import plan as P
from pipeline.devices import plan_jobs as J
from pipeline.devices.plan_source import source_facts
from pipeline.errors import PipelineError
from pipeline.workflow import Workflow


def _row(*cells, widths=(12, 20, 11, 9, 9, 8, 7, 6)) -> str:
    return "  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w)
                     for i, (c, w) in enumerate(zip(cells, widths, strict=True)))


def plan_recipe(W, name: str, source: str | None, box: dict) -> dict:
    folder = Path(source) if source else J.source_dir(W, name)
    if folder is None:
        raise PipelineError(f"{name}: the checkpoint is not on this machine (not fetched, not in the hub cache "
                            f"{W.hub_cache or '(default)'}): give its config.json folder with --source")
    r = W.recipes[name]
    facts = source_facts(folder)
    disk = P.disk_plan(r, facts)
    ram = P.ram_plan(r, facts)
    for row in disk + ram:  # an in-range recipe can still ask for more than a file or a process can hold
        if row["bytes"] > SIZE_MAX:
            what = f"{row['stage']}{' ' + row['key'] if row['key'] else ''}"
            raise PipelineError(f"{r.path}: {what}: would need {P.fmt(row['bytes'])} ({row.get('what') or 'RAM'}), more "
                                "than any file or process can hold (2^63 bytes): lower its ctx or chunks")
    jobs = J.plan_jobs(r, facts)
    for j in jobs:
        j["hours"] = J.hours(j, facts, r, box)
    return {"name": name, "source": str(folder), "facts": {
        "origin": facts.origin, "model_type": facts.model_type, "params": facts.n_params, "n_layer": facts.n_layer,
        "n_embd": facts.n_embd, "n_ff": facts.n_ff, "n_head": facts.n_head, "n_head_kv": facts.n_head_kv,
        "n_vocab": facts.n_vocab, "tied": facts.tied, "weight_bytes": facts.weight_bytes,
        "snapshot_bytes": facts.snapshot_bytes, "notes": facts.notes},
        "disk": disk, "disk_total": sum(d["bytes"] for d in disk), "ram": ram, "jobs": jobs,
        "hours": sum(j["hours"] for j in jobs), "moe": P.moe_plan(facts, [r.base_key, *(q.type for q in r.quants)])}


def print_plan(p: dict, box: dict) -> None:
    f = p["facts"]
    print(f"{p['name']}: {f['model_type']}, {f['params'] / 1e9:.2f} B parameters ({P.fmt(f['weight_bytes'])} of weights), "
          f"{f['n_layer']} layers, n_embd {f['n_embd']}, n_ff {f['n_ff']}, heads {f['n_head']}/{f['n_head_kv']} KV, "
          f"vocabulary {f['n_vocab']}{', tied embeddings' if f['tied'] else ''}")
    print(f"  from {f['origin']} in {p['source']}")
    for n in f["notes"]:
        print(f"  note: {n}")
    if p.get("moe"):
        print_moe(p["moe"])
    print("disk (what the build writes; the snapshot once, the fetched folder is hard links of it):")
    for d in p["disk"]:
        print(f"  {d['stage']:12} {d['key']:14} {d['what']:32} {P.fmt(d['bytes']):>11}")
    print(f"  {'total':60} {P.fmt(p['disk_total']):>11}")
    print("RAM per stage (predicted peak RSS of its largest process):")
    for r in p["ram"]:
        print(f"  {r['stage']:12} {r['key']:22} {P.fmt(r['bytes']):>11}   {r['how']}")
    print(f"Slurm resources per job (each stage's declared resources) and hours on the box "
          f"({box['cores']} cores, {P.fmt(box['ram'])} RAM):")
    print("  " + _row("rule", "key", "inputs", "mem_mb", "disk_mb", "runtime", "hours", "RAM ok"))
    for j in p["jobs"]:
        s = j["slurm"]
        ok = "" if j["ram"] is None else ("yes" if j["ram"] <= s["mem_mb"] * 2**20 else "NO")
        print("  " + _row(j["rule"], j["key"], P.fmt(sum(j["inputs"].values()) * 2**20), s["mem_mb"], s["disk_mb"],
                          s["runtime"], f"{j['hours']:.2f}", ok))
    print(f"  total hours on the box: {p['hours']:.1f} (one job at a time)")
    for j in p["jobs"]:
        if "search" in j:
            r = j["search"]
            print(f"  sensitivity {j['key']}: {r['search']} search, {r['evaluations']} evaluations"
                  + (f" and {r['imatrix_passes']} llama-imatrix pass" if r["imatrix_passes"] else "")
                  + (f" and {r['fisher_passes']} Fisher pass (torch)" if r.get("fisher_passes") else "")
                  + f", {r['quantizes']} whole-model quantizes (exhaustive: {r['exhaustive']} evaluations): "
                  f"{j['hours']:.2f} h")


def print_moe(moe: dict) -> None:
    """The mixture of experts: total vs active parameters; per file the routed experts (mapped, read per token) and
    what a GPU holds with ``-cmoe`` (every routed expert on the CPU) or per layer ``-ncmoe N`` moves back."""
    print(f"mixture of experts: {moe['n_expert_used']} of {moe['n_expert']} experts per token: "
          f"{moe['params_total'] / 1e9:.2f} B parameters, {moe['params_active'] / 1e9:.2f} B active per token")
    print("  file        routed experts (mapped)  read per token  the rest: on the GPU with -cmoe  experts of a layer "
          "(-ncmoe N: N x this to the CPU)")
    for key, f in moe["files"].items():
        print(f"  {key:10}  {P.fmt(f['expert_bytes']):>23}  {P.fmt(f['read_per_token']):>14}  "
              f"{P.fmt(f['other_bytes']):>30}  {P.fmt(f['layer_expert_bytes']):>18}")
    print("  (llama.cpp: -ngl 999 -cmoe, or -ngl 999 -ncmoe N; the regex \\.ffn_(up|down|gate|gate_up)_(ch|)exps keeps "
          "shared experts on the GPU; KV cache and compute buffers come on top)")


def cmd_plan(args) -> None:
    config = {"recipes": args.recipe, "artifacts": args.artifacts, "work": args.work}
    if args.hub_cache:
        config["hf_hub_cache"] = args.hub_cache
    W = Workflow(config)
    if args.name and args.name not in W.recipes:
        raise PipelineError(f"{args.recipe}: no recipe named {args.name!r} (there: {', '.join(sorted(W.recipes))})")
    names = [args.name] if args.name else [n for n in W.recipes if not n.endswith("-draft")]
    if not names:
        raise PipelineError(f"{args.recipe}: no recipe (*.yaml) to plan")
    box = dict(J.BOX)
    if args.cores:
        box["cores"] = args.cores
    plans = [plan_recipe(W, n, args.source, box) for n in names]
    if args.json:
        print(json.dumps(plans, indent=1, default=str))
        return
    for p in plans:
        print_plan(p, box)
    mem = P.free_memory()
    _, free = P.free_disk(W.layout.work)
    print(f"this machine: {P.fmt(mem)} available memory, {P.fmt(free)} free disk at {W.layout.work}")


def register(sub) -> None:
    p = sub.add_parser("plan", help="predict a recipe's disk, RAM per stage and Slurm resources before building")
    p.add_argument("recipe")
    p.add_argument("--source", help="a checkpoint folder (config.json + safetensors or their index) instead of the "
                                    "recipe's own (e.g. data/paper/llama-3.1-70b)")
    p.add_argument("--name", help="the recipe's name (default: every recipe of the file, drafts aside)")
    p.add_argument("--artifacts", default="artifacts")
    p.add_argument("--work", default="work")
    p.add_argument("--hub-cache", help="Hugging Face hub cache (default: $HF_HUB_CACHE or huggingface_hub's)")
    p.add_argument("--cores", type=CORES.arg("--cores"), help=f"the box's cores for the hours (default {J.BOX['cores']})")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)
