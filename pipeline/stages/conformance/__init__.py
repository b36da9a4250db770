"""Stage conformance: prove that the base GGUF is the Hugging Face model it was converted from (issue #15).

Five checks, each comparing the HF side (transformers on the fetched folder; remote code only when the recipe
opts in) with the llama.cpp side (the ``ggufpipe-conformance`` helper of the pinned build: llama.cpp's own
tokenizer, chat-template engine and EOG set, on the GGUF loaded vocab-only; one process for all requests):

1. **tokenizer parity** on the probes of ``data/conformance/probes.txt``, every added/special token of the HF
   tokenizer (alone, and all of them in running text) and a 2,000-character slice of the first eval text, in
   three modes: (a) no specials added, special text parsed (HF ``add_special_tokens=False``; llama.cpp
   ``add_special=false parse_special=true``): pre-tokenizer, normalizer and merges; (b) each side's defaults
   (``add_special_tokens=True`` / ``add_special=true``): a probe that differs only here is a "BOS/EOS policy
   differs" failure; (c) special text not parsed (HF ``split_special_tokens=True`` / ``parse_special=false``).
   Each mismatch gets a cause (``normalizer.py``): the HF normalizer members llama.cpp's tokenizer type does
   not apply, when llama.cpp's ids of the probe so normalized are HF's ids. ``nfc`` is llama.cpp's known
   limitation (a warning; ``conformance.strict`` fails it), any other cause a defect unless the recipe's
   ``conformance.accept`` names it; an ``unexplained`` mismatch always fails.
2. **logit fidelity**: the HF model in float32 on the token ids of eval-base's ``--kl-divergence-base`` file
   (pipeline/stages/logitsfile.py), first ``chunks`` chunks, BOS substituted at each chunk's first position when the
   GGUF adds one (as llama-perplexity does); per scored position: top-1 agreement, KLD(llama.cpp base || HF)
   with llama.cpp's own rule (only base tokens with log-prob > -16, perplexity.cpp:229), mean and p99, and the
   PPL of both sides over the same positions. FIXED thresholds (:data:`THRESHOLDS`, an F16/BF16 GGUF against
   HF float32), not recipe keys. Run only when 4 x parameters + 2 GiB fits in MemAvailable. With an AWQ-folded
   folder, the same numbers of that folder against the original HF model (recorded, not gated).
3. **chat template**: the conversations of ``data/conformance/conversations.json`` rendered by transformers'
   ``apply_chat_template`` and by llama.cpp's ``common_chat_templates_apply``: identical text after llama.cpp's
   own normalisations (one leading ``bos_token`` text stripped when the vocab adds BOS, one trailing
   ``eos_token`` text when it adds EOS: common/chat.cpp:958-964; a system message merged into the next one for
   a template without a system role, chat.cpp:1016-1030), identical model input ids (HF: the rendered text
   tokenized without specials, what ``apply_chat_template(tokenize=True)`` returns; llama.cpp: its prompt
   tokenized with ``add_special=true parse_special=true``, as llama-server does), no double BOS, no BOS/EOS that
   llama.cpp adds where HF has none; a conversation rejected by one engine must be rejected by both.
4. **end of generation**: every id of HF ``generation_config.json`` ``eos_token_id`` (``config.json``'s when
   that file is absent) and the template's turn-end token must be in llama.cpp's EOG set; a GGUF EOS that HF
   never stops on is a warning.
5. **hyperparameters**: the GGUF's ``<arch>.*`` keys that change the computation (rope bases and scaling factor,
   norm epsilon, head counts, embedding length) equal to the HF config's (hparams.py).

Dates: both engines get ``date_string`` = the pinned date of conversations.json. llama.cpp b11312's
``strftime_now`` reads the wall clock (common/jinja/value.cpp:422-433: ``std::time(nullptr)`` when the Jinja
context is built) and cannot be given a date; transformers' reads it too (``datetime.now()``), so both render
the same date in the same process environment (same TZ) except across a midnight between the two renders.
The record says which templates call ``strftime_now`` (``now_dependent``).

:func:`run` writes the record (JSON, atomically) and never raises for a measured failure: the record holds
``passed`` and ``failures``, one line each, ``conformance: recipe <name>: <check>: <detail>``. It raises
PipelineError only when it cannot measure (a missing file, an HF folder that does not load, the helper failing).
"""

from __future__ import annotations

# The package's API (modules: ``common``, one per check: ``tokenizer``, ``logits``, ``template``, ``eog``, ``hparams``, and
# ``stage``); everything else is imported from its module.
from pipeline.stages.conformance.common import (
    DEFAULT_CHUNKS,
    HELPER,
    THRESHOLDS,
    clean_piece,
    fail_line,
    load_conversations,
    load_probes,
)
from pipeline.stages.conformance.eog import check_eog
from pipeline.stages.conformance.hparams import check_hparams
from pipeline.stages.conformance.logits import check_logits, compare_distributions
from pipeline.stages.conformance.stage import compact, run, run_stage
from pipeline.stages.conformance.template import check_chat_template, plan_chat_template
from pipeline.stages.conformance.tokenizer import check_tokenizer

__all__ = [
    "DEFAULT_CHUNKS", "HELPER", "THRESHOLDS", "check_chat_template", "check_eog", "check_hparams", "check_logits", "check_tokenizer",
    "clean_piece", "compact", "compare_distributions", "fail_line", "load_conversations", "load_probes",
    "plan_chat_template", "run", "run_stage",
]
