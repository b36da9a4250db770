"""The Hugging Face side's tokenizer: the model's tokenizer as its files define it (see :func:`load_hf_tokenizer`)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.errors import PipelineError


def load_hf_tokenizer(hf_dir: Path, trust_remote_code: bool, what: str):
    """The model's tokenizer as its files define it (the reference the GGUF's must match).

    transformers 5 rebuilds the pipeline of a tokenizer class that has its own ``__init__`` (``GPT2Tokenizer``,
    ``LlamaTokenizer``) from the class's defaults: the published ``tokenizer.json``'s pre-tokenizer is dropped
    (SmolLM2's digit split, transformers/tokenization_utils_tokenizers.py ``convert_to_native_format``), and a
    SentencePiece model becomes a ``Metaspace`` pipeline that drops the dummy prefix of a leading space. So a
    ``tokenizer.json`` is loaded as written (``TokenizersBackend``), a folder with only ``tokenizer.model`` by the
    sentencepiece library itself, and a tokenizer class of the repository's own code (``auto_map`` in
    tokenizer_config.json, with ``source.trust_remote_code``) as the repository says."""
    # transformers: only the conformance run loads it
    from transformers import AutoTokenizer

    hf_dir = Path(hf_dir)
    cfg = _tokenizer_config(hf_dir)
    try:
        if trust_remote_code and "auto_map" in cfg:
            return AutoTokenizer.from_pretrained(str(hf_dir), trust_remote_code=True)
        if (hf_dir / "tokenizer.json").is_file():
            from transformers import TokenizersBackend

            return TokenizersBackend.from_pretrained(str(hf_dir))
        if (hf_dir / "tokenizer.model").is_file():
            return _sentencepiece_tokenizer(hf_dir, cfg)
        return AutoTokenizer.from_pretrained(str(hf_dir), trust_remote_code=trust_remote_code)
    except Exception as exc:  # one line for whatever the loader raises
        raise PipelineError(f"{what}: the HF tokenizer in {hf_dir} cannot be loaded: {type(exc).__name__}: "
                            f"{' '.join(str(exc).split())[:300]}") from None


def _tokenizer_config(hf_dir: Path) -> dict:
    f = hf_dir / "tokenizer_config.json"
    try:
        cfg = json.loads(f.read_text(encoding="utf-8")) if f.is_file() else {}
    except (OSError, ValueError):
        return {}  # the loader says what is wrong with it
    return cfg if isinstance(cfg, dict) else {}


def _sentencepiece_tokenizer(hf_dir: Path, cfg: dict):
    """transformers' SentencePiece backend on the folder's ``tokenizer.model``, adding BOS / EOS as its
    tokenizer_config.json says (``add_bos_token`` defaults to true, as LlamaTokenizer's did)."""
    from transformers.tokenization_utils_sentencepiece import SentencePieceBackend

    bos, eos = bool(cfg.get("add_bos_token", True)), bool(cfg.get("add_eos_token", False))
    pattern = {(True, True): "bos_eos", (True, False): "bos", (False, True): "eos"}.get((bos, eos))
    return SentencePieceBackend.from_pretrained(str(hf_dir), special_tokens_pattern=pattern)
