"""The memory model (pipeline/memory.py) on generated header-only GGUFs, and ``ggufpipe fit``.

The GGUFs are written here with the standard library (header, tensor infos, zero bytes of data): no llama.cpp,
no numpy. What llama.cpp itself prints of the same components is checked in bench/memory_bench.py."""

from __future__ import annotations

import struct

import pytest

from pipeline.cli import main
from pipeline.gguf.types import GGML_TYPES
from pipeline.memory import (
    CTX_PAD,
    FIT,
    TENSOR_ALIGNMENT,
    VOCAB_BYTES_PER_MERGE,
    VOCAB_BYTES_PER_TOKEN,
    predict_memory,
    repacked,
    swa_layers,
)

U32, I32, F32, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10
TYPE_ID = {name: tid for tid, (name, _, _) in GGML_TYPES.items()}


def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, value) -> bytes:
    out = _s(key)
    if isinstance(value, bool):
        return out + struct.pack("<I?", BOOL, value)
    if isinstance(value, int):
        return out + struct.pack("<II", U32, value)
    if isinstance(value, float):
        return out + struct.pack("<If", F32, value)
    if isinstance(value, str):
        return out + struct.pack("<I", STR) + _s(value)
    if isinstance(value, list) and value and isinstance(value[0], str):
        return out + struct.pack("<IIQ", ARR, STR, len(value)) + b"".join(_s(v) for v in value)
    if isinstance(value, list) and value and isinstance(value[0], bool):
        return out + struct.pack("<IIQ", ARR, BOOL, len(value)) + b"".join(struct.pack("<?", v) for v in value)
    return out + struct.pack("<IIQ", ARR, I32, len(value)) + b"".join(struct.pack("<i", v) for v in value)


def write_gguf(path, arch: str, meta: dict, tensors: list[tuple[str, tuple[int, ...], str]]):
    """A GGUF v3 with ``meta`` (keys without the ``<arch>.`` prefix when they start with a dot) and ``tensors``
    (name, ne, type name) whose data is zeros."""
    kvs = {"general.architecture": arch}
    kvs.update({(f"{arch}{k}" if k.startswith(".") else k): v for k, v in meta.items()})
    infos, offset, sizes = b"", 0, []
    for name, shape, tname in tensors:
        tid = TYPE_ID[tname]
        _, blck, tsize = GGML_TYPES[tid]
        n = 1
        for d in shape:
            n *= d
        size = n // blck * tsize
        infos += _s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        infos += struct.pack("<IQ", tid, offset)
        sizes.append(size)
        offset += (size + 31) // 32 * 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(_kv(k, v) for k, v in kvs.items())
    head += infos
    head += b"\0" * ((-len(head)) % 32)
    path.write_bytes(head + b"\0" * offset)
    return path


def llama_like(tmp_path, name="m.gguf", *, arch="llama", n_layer=4, n_embd=256, n_head=8, n_head_kv=2,
               n_ff=512, n_vocab=1000, wtype="F16", embd_type=None, tied=True, extra=None, merges=0):
    meta = {".block_count": n_layer, ".embedding_length": n_embd, ".attention.head_count": n_head,
            ".attention.head_count_kv": n_head_kv, ".feed_forward_length": n_ff,
            "tokenizer.ggml.tokens": [f"t{i}" for i in range(n_vocab)]}
    if merges:
        meta["tokenizer.ggml.merges"] = [f"a b{i}" for i in range(merges)]
    meta.update(extra or {})
    hd = n_embd // n_head
    tensors = [("token_embd.weight", (n_embd, n_vocab), embd_type or wtype), ("output_norm.weight", (n_embd,), "F32")]
    if not tied:
        tensors.append(("output.weight", (n_embd, n_vocab), wtype))
    for il in range(n_layer):
        tensors += [(f"blk.{il}.attn_norm.weight", (n_embd,), "F32"),
                    (f"blk.{il}.attn_q.weight", (n_embd, n_head * hd), wtype),
                    (f"blk.{il}.attn_k.weight", (n_embd, n_head_kv * hd), wtype),
                    (f"blk.{il}.attn_v.weight", (n_embd, n_head_kv * hd), wtype),
                    (f"blk.{il}.attn_output.weight", (n_head * hd, n_embd), wtype),
                    (f"blk.{il}.ffn_gate.weight", (n_embd, n_ff), wtype),
                    (f"blk.{il}.ffn_up.weight", (n_embd, n_ff), wtype),
                    (f"blk.{il}.ffn_down.weight", (n_ff, n_embd), wtype)]
    return write_gguf(tmp_path / name, arch, meta, tensors)


# ------------------------------------------------------------------ KV cache
@pytest.mark.parametrize("ctx", [256, 1000, 4096])
def test_kv_bytes_gqa_formula(tmp_path, ctx):
    f = llama_like(tmp_path, n_layer=4, n_embd=256, n_head=8, n_head_kv=2)
    p = predict_memory(f, ctx)
    cells = (ctx + CTX_PAD - 1) // CTX_PAD * CTX_PAD
    head_dim = 256 // 8
    assert p["kv"] == 4 * cells * 2 * (2 * head_dim) * 2  # layers x cells x (K+V) x n_embd_k_gqa x f16
    assert p["details"]["n_ctx"] == cells


def test_kv_padding_and_types(tmp_path):
    f = llama_like(tmp_path, n_layer=1, n_embd=64, n_head=2, n_head_kv=1)  # head 32: one q8_0 block per row
    assert predict_memory(f, 1)["details"]["n_ctx"] == 256
    assert predict_memory(f, 257)["details"]["n_ctx"] == 512
    f16, q8 = predict_memory(f, 512)["kv"], predict_memory(f, 512, kv_type="q8_0")["kv"]
    assert f16 == 512 * 2 * 32 * 2 and q8 == 512 * 2 * 34  # a q8_0 block: 32 values in 34 bytes
    assert predict_memory(f, 512, kv_type="F32")["kv"] == 2 * f16


def test_kv_head_count_per_layer(tmp_path):
    f = llama_like(tmp_path, n_layer=3, n_embd=128, n_head=4, n_head_kv=2,
                   extra={".attention.head_count_kv": [2, 1, 0]})  # a layer without KV heads holds nothing
    assert predict_memory(f, 256)["kv"] == 256 * 2 * 32 * 2 * (2 + 1 + 0)


def test_swa_layers_at_window_size(tmp_path):
    f = llama_like(tmp_path, arch="gemma3", n_layer=12, n_embd=256, n_head=4, n_head_kv=2,
                   extra={".attention.sliding_window": 512, ".attention.key_length": 128,
                          ".attention.value_length": 128})
    p = predict_memory(f, 8192)
    d = p["details"]
    assert d["swa_layers"] == 10 and d["swa_cells"] == 1024  # 5 of 6 (src/models/gemma3.cpp); pad(512 + 512, 256)
    row = 2 * 128 * 2  # n_head_kv x head_dim x f16, K and V alike
    assert p["kv"] == 2 * 8192 * 2 * row + 10 * 1024 * 2 * row
    # a window larger than the context: the SWA cache is capped at the base size
    assert predict_memory(f, 512)["details"]["swa_cells"] == 512
    # the same file without a window is all full-attention layers
    g = llama_like(tmp_path, "g.gguf", arch="gemma3", n_layer=12, n_embd=256, n_head=4, n_head_kv=2,
                   extra={".attention.key_length": 128, ".attention.value_length": 128})
    assert predict_memory(g, 8192)["kv"] == 12 * 8192 * 2 * row


def test_swa_pattern_from_file_and_dense_first():
    meta = {"gemma2.attention.sliding_window": 4096}
    assert swa_layers("gemma2", meta, 4) == [True, False, True, False]
    meta = {"cohere2moe.attention.sliding_window": 4096}  # dense_first: the full layer opens each period
    assert swa_layers("cohere2moe", meta, 5) == [False, True, True, True, False]
    meta = {"gemma3.attention.sliding_window": 512, "gemma3.attention.sliding_window_pattern": [True, False, True]}
    assert swa_layers("gemma3", meta, 3) == [True, False, True]
    assert swa_layers("llama", {"llama.attention.sliding_window": 4096}, 2) == [False, False]  # llama has no SWA


# ------------------------------------------------------------------ repack
@pytest.mark.parametrize(("tname", "arch", "expected"), [
    ("Q4_0", "x86_64", True), ("Q4_K", "x86_64", True), ("IQ4_NL", "x86_64", True), ("MXFP4", "x86_64", True),
    ("Q8_0", "x86_64", False), ("Q5_K", "x86_64", False), ("Q6_K", "x86_64", False), ("Q2_K", "x86_64", False),
    ("Q2_K", "x86_64-avx512", True), ("F16", "x86_64", False),
    ("Q8_0", "arm64", True), ("Q5_K", "arm64", True), ("Q6_K", "arm64", True), ("Q4_0", "arm64-dotprod", True),
    ("Q2_K", "arm64", False), ("Q4_0", "generic", False),
])
def test_repack_types_by_arch(tname, arch, expected):
    from pipeline.memory import ARCH_FEATURES

    assert repacked(tname, (256, 64), ARCH_FEATURES[arch]) is expected


def test_repack_needs_row_multiple():
    from pipeline.memory import ARCH_FEATURES

    assert not repacked("Q4_0", (256, 12), ARCH_FEATURES["x86_64"])  # AVX2 8x8 needs ne[1] % 8
    assert repacked("Q4_0", (256, 12), ARCH_FEATURES["arm64"])  # NEON 4x8: % 4


def test_repack_in_a_model(tmp_path):
    # Q4_0 matmul weights repacked on x86_64 (AVX2); token_embd (GET_ROWS) never; norms (1-D) never
    f = llama_like(tmp_path, wtype="Q4_0", embd_type="Q8_0", tied=False)
    p = predict_memory(f, 512)
    names = p["details"]["repacked_tensors"]
    assert "token_embd.weight" not in names and "output.weight" in names and len(names) == 1 + 4 * 7
    assert p["repack"] == sum(_pad32(b) for b in _q4_0_sizes(f, names))
    assert p["reserved"]["mapped"] < p["weights"]  # repacked tensors leave the CPU_Mapped range when at its ends
    assert predict_memory(f, 512, arch="generic")["repack"] == 0
    # Q8_0 is repacked on arm64 only: token_embd stays, the tied output (its duplicate) is repacked
    g = llama_like(tmp_path, "g.gguf", wtype="Q8_0", tied=True)
    assert predict_memory(g, 512)["repack"] == 0
    names = predict_memory(g, 512, arch="arm64")["details"]["repacked_tensors"]
    assert "token_embd.weight (as output)" in names and "token_embd.weight" not in names


def _pad32(n: int) -> int:
    return (n + TENSOR_ALIGNMENT - 1) // TENSOR_ALIGNMENT * TENSOR_ALIGNMENT


def _q4_0_sizes(path, names):
    from pipeline.gguf.reader import read_header

    return [t.n_bytes for t in read_header(path).tensors if t.name in names]


# ------------------------------------------------------------------ totals
def test_components_add_up(tmp_path):
    f = llama_like(tmp_path, merges=100)
    p = predict_memory(f, 2048)
    assert p["total"] == sum(p[k] for k in ("weights", "repack", "kv", "compute", "output", "overhead"))
    assert p["output"] == 1000 * 4  # one row of logits
    assert p["details"]["vocab_heap"] >= 1000 * VOCAB_BYTES_PER_TOKEN + 100 * VOCAB_BYTES_PER_MERGE
    assert p["overhead"] == FIT["process_base"] + p["details"]["vocab_heap"]
    # the reserve holds n_ubatch rows of logits; the run touches one
    d = p["details"]
    assert p["compute"] - d["work_buffer"] - d["fa_scratch"] - 1000 * 4 == p["reserved"]["compute"] - 1000 * 512 * 4
    assert predict_memory(f, 4096)["total"] > p["total"]


def test_bad_arguments(tmp_path):
    from pipeline.errors import PipelineError

    f = llama_like(tmp_path)
    with pytest.raises(PipelineError, match="unknown KV cache type"):
        predict_memory(f, 512, kv_type="q3_k")
    with pytest.raises(PipelineError, match="unknown arch"):
        predict_memory(f, 512, arch="sparc")
    with pytest.raises(PipelineError, match="at least 1"):
        predict_memory(f, 0)


# ------------------------------------------------------------------ ggufpipe fit
def test_fit_command(tmp_path, capsys):
    f = llama_like(tmp_path)
    need = predict_memory(f, 4096)["total"]
    assert main(["fit", str(f), "--mem", f"{need // (1 << 20) + 1}M", "--ctx", "4096"]) == 0
    out = capsys.readouterr().out
    assert "fits in" in out and "kv" in out and "total" in out
    assert main(["fit", str(f), "--mem", f"{need // (1 << 20) - 1}M", "--ctx", "4096"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: does not fit:") and err.count("\n") == 1
    with pytest.raises(SystemExit) as exc:  # a usage error: argparse's line, exit status 2
        main(["fit", str(f), "--mem", "lots"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == ("ggufpipe fit: error: argument --mem: 'lots' is not a memory "
                                                        "size such as 8G, 512M or 1.5GiB")
    assert main(["fit", str(tmp_path / "missing.gguf"), "--mem", "8G"]) == 1


def test_fit_command_options(tmp_path, capsys):
    f = llama_like(tmp_path, wtype="Q4_0", embd_type="Q8_0")
    assert main(["fit", str(f), "--mem", "8G", "--kv-type", "q8_0", "--arch", "arm64", "--ctx", "1024"]) == 0
    out = capsys.readouterr().out
    assert "KV q8_0" in out and "arm64" in out
    with pytest.raises(SystemExit):
        main(["fit", str(f), "--mem", "8G", "--arch", "sparc"])


def test_fit_on_a_jetson_is_marked_derived(tmp_path, capsys):
    f = llama_like(tmp_path, wtype="Q4_0", embd_type="Q8_0")
    assert main(["fit", str(f), "--mem", "8G", "--arch", "jetson-orin", "--ctx", "1024"]) == 0
    out = capsys.readouterr().out
    assert "DERIVED for jetson-orin (sm_87), not measured" in out and "--no-mmap" in out
    # nothing stays on the CPU to repack, which the same file on the Orin's CPU alone would
    assert predict_memory(f, 1024, arch="jetson-orin")["repack"] == 0 < predict_memory(f, 1024, arch="arm64-dotprod")[
        "repack"]


def test_moe_total_and_active_parameters(tmp_path, capsys):
    """pipeline.memory.experts (issue #31): every expert is mapped, each token reads n_expert_used of n_expert."""
    from pipeline.memory import ModelShape, experts

    meta = {".block_count": 1, ".embedding_length": 256, ".attention.head_count": 4, ".attention.head_count_kv": 2,
            ".feed_forward_length": 1024, ".expert_count": 8, ".expert_used_count": 2,
            "tokenizer.ggml.tokens": [f"t{i}" for i in range(1000)]}
    tensors = [("token_embd.weight", (256, 1000), "F16"), ("blk.0.attn_q.weight", (256, 256), "F16"),
               ("blk.0.ffn_gate_inp.weight", (256, 8), "F32")] + [
        (f"blk.0.ffn_{r}_exps.weight", (256, 512, 8) if r != "down" else (512, 256, 8), "Q8_0")
        for r in ("gate", "up", "down")]
    f = write_gguf(tmp_path / "moe.gguf", "qwen3moe", meta, tensors)
    e = experts(ModelShape.from_gguf(f))
    expert_params = 3 * 256 * 512 * 8
    total = 256 * 1000 + 256 * 256 + 256 * 8 + expert_params
    assert e["params_total"] == total and e["params_active"] == total - expert_params * 3 // 4
    assert e["expert_bytes"] == 3 * 256 * 512 * 8 * 34 // 32 and e["expert_bytes_read_per_token"] == e["expert_bytes"] // 4
    assert experts(ModelShape.from_gguf(llama_like(tmp_path))) is None  # dense
    assert main(["fit", str(f), "--mem", "1G"]) == 0
    assert "experts   2 of 8 per token: " in capsys.readouterr().out


def test_hybrid_recurrent_state_replaces_kv(tmp_path, capsys):
    """A hybrid (qwen35moe, issue #31): the KV cache holds the full-attention layers only, each linear-attention
    layer keeps one F32 state per sequence: (d_conv - 1) x (d_inner + 2 x groups x d_state) + d_state x d_inner
    (src/llama-hparams.cpp:208-258), every 4th layer attention (full_attention_interval); the MTP layer has neither
    (llama.cpp printed 0.12 MiB of KV at ctx 512 for the generated Qwen3.5-MoE's one attention layer, not 0.25)."""
    extra = {".ssm.conv_kernel": 4, ".ssm.inner_size": 128, ".ssm.state_size": 32, ".ssm.group_count": 2,
             ".full_attention_interval": 4, ".nextn_predict_layers": 1}
    f = llama_like(tmp_path, arch="qwen35moe", n_layer=9, n_embd=128, n_head=4, n_head_kv=2, extra=extra)
    p = predict_memory(f, 256)
    state = 4 * (3 * (128 + 2 * 2 * 32) + 32 * 128)
    recurrent = [i < 8 and (i + 1) % 4 != 0 for i in range(9)]  # 0-2, 4-6 linear; 3, 7 attention; 8 the MTP layer
    assert p["details"]["recurrent_layers"] == sum(recurrent) == 6
    assert p["reserved"]["recurrent"] == 6 * state and p["reserved"]["kv"] == 2 * 256 * 2 * 32 * 2 * 2
    assert p["kv"] == p["reserved"]["kv"] + p["reserved"]["recurrent"]
    flags = dict(extra, **{".attention.recurrent_layers": [True, False] * 4 + [False]})  # the converter's array wins
    g = llama_like(tmp_path, "g.gguf", arch="qwen35moe", n_layer=9, n_embd=128, n_head=4, n_head_kv=2, extra=flags)
    assert predict_memory(g, 256)["details"]["recurrent_layers"] == 4
    assert main(["fit", str(f), "--mem", "1G", "--ctx", "256", "--parallel", "2"]) == 0
    assert f"recurrent state of 6 linear-attention layers, 2 sequence(s): {12 * state / 2**20:.1f} MiB" in (
        capsys.readouterr().out)
