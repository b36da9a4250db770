"""The stages of the build, one entry function each (called by the CLI's stage registry, the Snakefile's rules
and the tests): fetch, convert, awq, imatrix, quantize, evaluate (eval-base, eval), bench, conformance, draft
(vocab, acceptance, agreement), mtp, split, publish (manifest, report, card, Hub files) and gate."""
