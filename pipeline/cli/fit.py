"""``ggufpipe fit``: does a GGUF fit in a device's memory at a context size? See ``ggufpipe fit --help`` and
docs/devices.md. Exit status 0 when it fits, 1 (one line ``error: ...``) when it does not."""

from __future__ import annotations

import argparse
import os
import stat

from pipeline.bounds import CTX, PARALLEL, THREADS
from pipeline.errors import PipelineError
from pipeline.launch import draft_memory
from pipeline.memory import ModelShape, components, experts
from pipeline.memory_profiles import ARCH_FEATURES, JETSON_ARCHES, KV_TYPES, parse_size


def _mib(n: float) -> str:
    return f"{n / (1 << 20):10.1f} MiB"


def memory_size(text: str) -> tuple[int, str]:
    """``--mem`` as argparse's ``type=``: (bytes, as given) by :func:`parse_size`, one usage line when it is not a
    size."""
    try:
        return parse_size(text), text
    except PipelineError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def model_file(path: str, what: str) -> str:
    """``path`` when it is a regular file: a FIFO or a device would block the GGUF reader or never end."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise PipelineError(f"{what} {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise PipelineError(f"{what} {path}: not a regular file (a folder, FIFO or device): give a GGUF file")
    return path


def cmd_fit(args) -> None:
    mem, mem_text = args.mem
    shape = ModelShape.from_gguf(model_file(args.gguf, "GGUF"))
    p = components(shape, args.ctx, kv_type=args.kv_type, arch=args.arch, threads=args.threads,
                   n_outputs=args.parallel, n_seq=args.parallel)
    if args.draft:  # a draft in the same server: its weights, its own KV cache and buffers, one process base
        draft = ModelShape.from_gguf(model_file(args.draft, "--draft"))
        p["draft"] = draft_memory(draft, args.ctx, args.kv_type, args.arch, args.threads, args.parallel)
        p["total"] += p["draft"]
    d = p["details"]
    print(f"{args.gguf}: {d['architecture']}, ctx {args.ctx} (KV cells {d['n_ctx']}"
          + (f", sliding-window layers {d['swa_layers']} at {d['swa_cells']}" if d["swa_layers"] else "")
          + f"), KV {d['kv_type']}, CPU profile {args.arch}")
    for key in ("weights", "repack", "kv", "compute", "output", "overhead", "draft"):
        if key in p:
            print(f"  {key:9} {_mib(p[key])}" + (
                f"   (of which the recurrent state of {d['recurrent_layers']} linear-attention layers, "
                f"{d['n_seq']} sequence(s): {_mib(d['recurrent_bytes']).strip()})"
                if key == "kv" and d["recurrent_layers"] else ""))
    what = (f"llama-server -c {args.ctx} -np {args.parallel}" + (" with the draft" if args.draft else "")
            if args.draft or args.parallel > 1 else f"llama-bench -p {args.ctx}")
    print(f"  {'total':9} {_mib(p['total'])}   (peak RSS of {what}; docs/devices.md)")
    if args.arch in JETSON_ARCHES:  # what no Jetson has measured yet: the breakdown above is read from the source
        print(f"  DERIVED for {args.arch} (sm_{JETSON_ARCHES[args.arch]}), not measured: every layer on the GPU "
              "(-ngl), which the pinned ggml-cuda treats as discrete (ggml-cuda.cu:308), so the weights are CUDA "
              f"buffers in the same memory; with --no-mmap, as the launch line runs. With mmap the mapped pages "
              f"stay as well: +{_mib(p['weights']).strip()}. The CUDA context is not counted (docs/devices.md#jetson)")
    moe = experts(shape)
    if moe:  # every expert is mapped (and counted above); each token reads only the routed ones
        print(f"  experts   {moe['n_expert_used']} of {moe['n_expert']} per token: {moe['params_total'] / 1e6:.1f} M "
              f"parameters, {moe['params_active'] / 1e6:.1f} M active; expert tensors {_mib(moe['expert_bytes']).strip()}"
              f" mapped, about {_mib(moe['expert_bytes_read_per_token']).strip()} of them read per token")
    margin = mem - p["total"]
    if margin >= 0:
        print(f"fits in {mem_text}: margin {margin / (1 << 20):.1f} MiB ({margin / mem:.0%})")
        return
    raise PipelineError(f"does not fit: {args.gguf} at ctx {args.ctx} needs {p['total'] / (1 << 20):.1f} MiB, "
                        f"{-margin / (1 << 20):.1f} MiB more than --mem {mem_text}")


def register(sub) -> None:
    p = sub.add_parser("fit", help="predict the memory a GGUF takes on a CPU device and whether it fits")
    p.add_argument("gguf")
    p.add_argument("--mem", required=True, type=memory_size,
                   help="the device's memory for the model, e.g. 8G, 512M (binary units)")
    p.add_argument("--ctx", type=CTX.arg("--ctx"), default=4096, help="context size (default 4096)")
    p.add_argument("--kv-type", default="f16", choices=sorted(KV_TYPES), help="KV cache type (default f16)")
    p.add_argument("--arch", default="x86_64", choices=sorted(ARCH_FEATURES),
                   help="CPU profile: which tensor types ggml-cpu repacks (default x86_64, the pinned build); "
                        "jetson-orin/jetson-xavier: every layer on the GPU, derived")
    p.add_argument("--threads", type=THREADS.arg("--threads"), default=2, help="threads (default 2)")
    p.add_argument("--parallel", type=PARALLEL.arg("--parallel"), default=1,
                   help="server slots (llama-server -np, sharing --ctx): one row of logits each (default 1)")
    p.add_argument("--draft", help="a draft GGUF served beside it (llama-server -md): its weights and KV cache")
    p.set_defaults(func=cmd_fit)
