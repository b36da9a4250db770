#!/usr/bin/env bash
# Prepares, on a CPU box, what bench/gpu/run.sh needs on a borrowed GPU box (docs/gpu.md), into bench/gpu/carry/
# (gitignored; it travels as the device run's 64 MiB carry):
#   llama.cpp-src.tar.gz  the pinned llama.cpp tree (b11312, from the llama-cpp-python sdist the tools are built
#                         from), trimmed to what llama-perplexity needs on the CPU and CUDA backends (<= 20 MB)
#   base-F16.gguf         a tiny random llama (tests/helpers/gguf_factory.py, llama-spm vocab, 4 layers x 256)
#   quant-Q4_K_M.gguf     its Q4_K_M, quantized here with the pinned llama-quantize (llama-quantize runs on the CPU
#                         on every backend: the quant is the same bytes there)
#   eval.txt              the first 48 KB of data/botchan.txt
# The model is random (no real model under 40 MB is at hand: SmolLM2-135M is 145 MB in Q8_0, 88 MB in Q2_K), so the
# run measures llama.cpp's numeric differences between backends, not a real model's quality.
# Usage: bench/gpu/prepare.sh   (needs the venv and the pinned tools: `make tools`)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=bench/gpu/carry
CACHE=${GGUFPIPE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ggufpipe}
SDIST=$CACHE/downloads/llama_cpp_python-0.3.36.tar.gz
[ -f "$SDIST" ] || { echo "error: $SDIST missing: run \`make tools\` first" >&2; exit 1; }
TOOLS=$(.venv/bin/python -m pipeline.tools where)
rm -rf "$OUT" && mkdir -p "$OUT"
TMP=$(mktemp -d) && trap 'rm -rf "$TMP"' EXIT

# 1. the trimmed source tree
tar -xzf "$SDIST" -C "$TMP" --wildcards '*/vendor/llama.cpp/*'
SRC=$(echo "$TMP"/*/vendor/llama.cpp)
( cd "$SRC"
  rm -rf .git* models docs tests benches examples pocs app media scripts conversion gguf-py requirements* \
         convert_*.py .devops .github ci
  # ggml: the CPU and CUDA backends only (ggml/src/CMakeLists.txt adds a backend's folder only when it is enabled)
  for d in ggml/src/ggml-*/; do
    case "$d" in ggml/src/ggml-cpu/|ggml/src/ggml-cuda/) ;; *) rm -rf "$d" ;; esac
  done
  # tools: llama-perplexity only
  for d in tools/*/; do [ "$d" = tools/perplexity/ ] || rm -rf "$d"; done
  printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(perplexity)\n' > tools/CMakeLists.txt
)
tar -czf "$OUT/llama.cpp-src.tar.gz" -C "$(dirname "$SRC")" llama.cpp

# 2. the model, its quant and the text
.venv/bin/python - "$OUT/base-F16.gguf" "$TOOLS/../vocab/ggml-vocab-llama-spm.gguf" <<'PY'
import sys
sys.path.insert(0, "tests")
from helpers.gguf_factory import tiny_llama

tiny_llama(sys.argv[1], sys.argv[2], n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=768, dtype="F16",
           tie_embeddings=True, n_ctx_train=2048, name="gpu-bench-tiny")
PY
"$TOOLS/llama-quantize" "$OUT/base-F16.gguf" "$OUT/quant-Q4_K_M.gguf" Q4_K_M 2 > "$TMP/quantize.log" 2>&1 \
  || { tail -5 "$TMP/quantize.log" >&2; exit 1; }
head -c 49152 data/botchan.txt > "$OUT/eval.txt"

ls -l "$OUT"
du -cb "$OUT"/* | awk '{ if ($2 == "total") printf "carry: %d bytes (%.1f MiB; the limit is 64 MiB, the source tarball <= 20 MB, the model <= 40 MB)\n", $1, $1 / 1048576 }'
