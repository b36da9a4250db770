#!/usr/bin/env bash
# The CPU-vs-CUDA measurement of issue #20 item 5 (docs/gpu.md), in one run on a borrowed GPU box, from the carry
# that bench/gpu/prepare.sh wrote into bench/gpu/carry/ on a CPU box:
#   1. builds llama-perplexity of the pinned tree twice, CPU and CUDA (CMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS, default
#      90 for an H100/H200; never "native"), with the pipeline's flags (pipeline/tools.py CMAKE_FLAGS, minus the
#      server and examples), side by side;
#   2. on each backend, twice: base logits of base-F16.gguf (--kl-divergence-base) and the KL divergence of
#      quant-Q4_K_M.gguf against them, plus the CUDA quant against the CPU base logits (are base logits to be keyed
#      by backend?);
#   3. prints eval seconds and the metric differences (PPL, mean KLD, same-top-p) CPU vs CUDA and run to run, and
#      whether the base logits files are byte-identical, into $OUT/results.md (or bench/gpu/out/) for bench/RESULTS.md.
# Usage on the GPU box: bench/gpu/run.sh            CPU half only (no GPU, a sanity run): CPU_ONLY=1 bench/gpu/run.sh
# Env: CUDA_ARCHS (90), JOBS (nproc), THREADS (CPU eval threads, nproc), NGL (999: all layers); CPU_BIN: a folder
# with the pinned llama-perplexity to use instead of building the CPU one (a quick sanity run of the CPU half);
# CUDA_FLAGS: extra cmake flags of the CUDA build, recorded in the results (-DGGML_CUDA_FA=OFF builds faster, but the
# pipeline's CUDA tools keep FlashAttention: a measurement without it is not theirs).
set -euo pipefail
cd "$(dirname "$0")/../.."
CARRY=bench/gpu/carry
RES=${OUT:-bench/gpu/out}
ARCHS=${CUDA_ARCHS:-90}
JOBS=${JOBS:-$(nproc)}
THREADS=${THREADS:-$(nproc)}
NGL=${NGL:-999}
for f in llama.cpp-src.tar.gz base-F16.gguf quant-Q4_K_M.gguf eval.txt; do
  [ -f "$CARRY/$f" ] || { echo "error: $CARRY/$f missing: run bench/gpu/prepare.sh on a CPU box first" >&2; exit 1; }
done
for cmd in cmake python3 awk; do
  command -v "$cmd" > /dev/null || { echo "error: $cmd is not installed on this box" >&2; exit 1; }
done
mkdir -p "$RES" && rm -f "$RES/times.txt"
W=$(mktemp -d) && trap 'rm -rf "$W"' EXIT
tar -xzf "$CARRY/llama.cpp-src.tar.gz" -C "$W"
BACKENDS="cpu cuda"
[ -n "${CPU_ONLY:-}" ] && BACKENDS=cpu
if [ "$BACKENDS" != cpu ]; then
  export PATH=$PATH:/usr/local/cuda/bin
  command -v nvcc > /dev/null || { echo "error: no nvcc (CUDA toolkit) on this box: CPU_ONLY=1 runs the CPU half" >&2; exit 1; }
  nvidia-smi -L > /dev/null 2>&1 || { echo "error: nvidia-smi sees no GPU: CPU_ONLY=1 runs the CPU half" >&2; exit 1; }
fi
FLAGS=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF
       -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_APP=OFF
       -DLLAMA_BUILD_NUMBER=11312 -DLLAMA_BUILD_COMMIT=0c1e570)

build() {  # backend jobs
  local extra=()
  # shellcheck disable=SC2206  # CUDA_FLAGS: words on purpose
  [ "$1" = cuda ] && extra=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS" ${CUDA_FLAGS:-})
  local t0=$SECONDS
  cmake -S "$W/llama.cpp" -B "$W/build-$1" "${FLAGS[@]}" "${extra[@]}" > "$RES/cmake-$1.log" 2>&1
  cmake --build "$W/build-$1" --config Release -j "$2" --target llama-perplexity > "$RES/build-$1.log" 2>&1
  echo "build $1: $((SECONDS - t0)) s${extra[*]:+ (${extra[*]})}" | tee -a "$RES/times.txt"
}
# side by side: the CUDA kernels take most of the time, the CPU build a few cores
if [ -n "${CPU_BIN:-}" ]; then
  mkdir -p "$W/build-cpu/bin" && ln -s "$(cd "$CPU_BIN" && pwd)/llama-perplexity" "$W/build-cpu/bin/"
  echo "build cpu: prebuilt $CPU_BIN" >> "$RES/times.txt"
  [ "$BACKENDS" = cpu ] || build cuda "$JOBS"
elif [ "$BACKENDS" = cpu ]; then
  build cpu "$JOBS"
else
  build cpu 4 & cpu_pid=$!
  build cuda "$((JOBS > 4 ? JOBS - 4 : 1))"
  wait "$cpu_pid"
fi

ppl() {  # backend label args...: one llama-perplexity run, its output in $RES/<label>.log, seconds in times.txt
  local b=$1 label=$2; shift 2
  local gpu=()
  [ "$b" = cuda ] && gpu=(-ngl "$NGL")
  local t0
  t0=$(date +%s%N)
  "$W/build-$b/bin/llama-perplexity" "$@" -f "$CARRY/eval.txt" -c 512 -b 512 -t "$THREADS" "${gpu[@]}" \
    > "$RES/$label.log" 2>&1 || { echo "error: $label failed: $(tail -3 "$RES/$label.log")" >&2; exit 1; }
  awk -v l="$label" -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { printf "%s %.3f\n", l, (b - a) / 1e9 }' \
    >> "$RES/eval-seconds.txt"
}
: > "$RES/eval-seconds.txt"
for b in $BACKENDS; do
  for r in 1 2; do
    ppl "$b" "base-$b-$r" -m "$CARRY/base-F16.gguf" --kl-divergence-base "$W/base-$b-$r.logits"
    ppl "$b" "kld-$b-$r" -m "$CARRY/quant-Q4_K_M.gguf" --kl-divergence-base "$W/base-$b-$r.logits" --kl-divergence
  done
done
[ "$BACKENDS" = cpu ] || ppl cuda "kld-cuda-on-cpu-base" -m "$CARRY/quant-Q4_K_M.gguf" \
  --kl-divergence-base "$W/base-cpu-1.logits" --kl-divergence
sha256sum "$W"/*.logits | sed "s|$W/||" > "$RES/logits-sha256.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$RES/device.txt" 2>/dev/null \
  || echo "no GPU" > "$RES/device.txt"

python3 - "$RES" "$BACKENDS" <<'PY' | tee "$RES/results.md"
import re, sys
from pathlib import Path
res, backends = Path(sys.argv[1]), sys.argv[2].split()
NUM = r"(-?[0-9.]+(?:e[-+]?\d+)?)"
PATS = {"ppl": rf"Final estimate: PPL = {NUM}", "ppl_q": rf"^Mean PPL\(Q\)\s*:\s*{NUM}",
        "kld_mean": rf"^Mean\s+KLD:\s*{NUM}", "kld_p99": rf"^99\.0%\s+KLD:\s*{NUM}",
        "same_top_p": rf"^Same top p:\s*{NUM}"}
secs = dict(line.split() for line in (res / "eval-seconds.txt").read_text().splitlines())
def metrics(label):
    text = (res / f"{label}.log").read_text(errors="replace")
    out = {k: float(m.group(1)) for k, p in PATS.items() if (m := re.search(p, text, re.M))}
    out["seconds"] = float(secs[label])
    return out
runs = {lab: metrics(lab) for lab in secs}
print(f"# CPU vs CUDA, llama-perplexity b11312 ({(res / 'device.txt').read_text().strip()})\n")
print("| run | eval s | PPL (base) | PPL(Q) | mean KLD | KLD p99 | same top p % |\n|---|---|---|---|---|---|---|")
for lab, m in runs.items():
    kld = runs.get(lab.replace("base-", "kld-"), {}) if lab.startswith("base-") else m
    if lab.startswith("base-"):
        print(f"| {lab} | {m['seconds']:.2f} | {m.get('ppl', float('nan')):.6f} | | | | |")
    else:
        print(f"| {lab} | {m['seconds']:.2f} | | {kld.get('ppl_q', float('nan')):.6f} | {kld.get('kld_mean', float('nan')):.8f} "
              f"| {kld.get('kld_p99', float('nan')):.8f} | {kld.get('same_top_p', float('nan')):.4f} |")
def diff(a, b, keys=("ppl", "ppl_q", "kld_mean", "kld_p99", "same_top_p")):
    return ", ".join(f"{k} {runs[b][k] - runs[a][k]:+.3g} ({(runs[b][k] - runs[a][k]) / runs[a][k]:+.2e} rel)"
                     for k in keys if k in runs[a] and k in runs[b] and runs[a][k])
print("\nRun to run (run 2 - run 1):")
for b in backends:
    for kind in ("base", "kld"):
        print(f"- {kind} {b}: {diff(f'{kind}-{b}-1', f'{kind}-{b}-2') or 'identical'}")
if "cuda" in backends:
    print("\nCUDA - CPU (run 1):")
    for kind in ("base", "kld"):
        print(f"- {kind}: {diff(f'{kind}-cpu-1', f'{kind}-cuda-1')}")
    print(f"- CUDA quant on the CPU base logits vs on its own: {diff('kld-cuda-1', 'kld-cuda-on-cpu-base')}")
print("\nBase logits files (SHA256):\n" + "".join(f"- {line}\n" for line in (res / "logits-sha256.txt").read_text().splitlines()))
print("Build times: " + "; ".join((res / "times.txt").read_text().split("\n")).strip("; "))
PY
