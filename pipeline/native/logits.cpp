// ggufpipe-logits: llama-perplexity's --kl-divergence-base file, written from token ids instead of text.
//
// usage: ggufpipe-logits -m MODEL.gguf -f IDS.txt -c N_CTX --chunks N -b N_CTX -t THREADS --kl-divergence-base OUT
//
// llama-perplexity tokenizes its text with special tokens left as text (tools/perplexity/perplexity.cpp:473,
// common_tokenize(..., parse_special = false)), so a chat-rendered `<|im_start|>` would be scored as the characters
// of its name. This tool takes the ids instead (IDS.txt: whitespace-separated integers, tokenized by
// ggufpipe-conformance with parse_special), and otherwise does what llama-perplexity's base run does, so that
// `llama-perplexity --kl-divergence` reads the file as its own: the same command line and context set-up
// (common_params_parse with LLAMA_EXAMPLE_PERPLEXITY, common_init_from_params; perplexity.cpp:1985-2030), one chunk
// per sequence with the vocab's BOS in its first position when the vocab adds one and logits from position n_ctx/2
// on (540-590), and the file layout and record arithmetic that pipeline/stages/logitsfile.py documents (466-467,
// 521-525, 79-107). On prose tokenized by llama-tokenize its output equals llama-perplexity's byte for byte
// (tests/e2e/test_eval_sets.py).
//
// Built by pipeline/tools.py as one more target of the pinned llama.cpp tree (b11312, commit 0c1e570), like
// ggufpipe-conformance. Prints "Final estimate: PPL = ... +/- ..." as llama-perplexity does (640-649).
// Exit status: 0 when the file is written; 1 with one "error: ..." line otherwise (the file is then incomplete:
// the caller writes it under a temporary name).

#include "arg.h"
#include "common.h"
#include "llama.h"
#include "log.h"

#include <algorithm>
#include <clocale>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace {

// round to nearest (ties to even) through the float mantissa, as the reader's encoder expects
int round_nearest(float x) {
    const float shifted = x + 12582912.f;
    int32_t     bits;
    memcpy(&bits, &shifted, sizeof(bits));
    return (bits & 0x007fffff) - 0x00400000;
}

// one record of the base file: float32 scale and min log-prob, then one uint16 per token; returns the token's
// negative log-likelihood
double write_record(int n_vocab, const float * logits, uint16_t * rec, int target) {
    float hi = logits[0];
    float lo = logits[0];
    for (int i = 1; i < n_vocab; ++i) {
        hi = std::max(hi, logits[i]);
        lo = std::min(lo, logits[i]);
    }
    lo = std::max(lo, hi - 16);  // the reader ignores log-probs 16 nats below the top one
    double sum = 0.0;
    for (int i = 0; i < n_vocab; ++i) {
        sum += expf(logits[i] - hi);
    }
    const float log_sum = log(sum);
    const float scale   = (hi - lo) / 65535.f;
    const float head[2] = { scale, lo - hi - log_sum };
    memcpy(rec, head, sizeof(head));
    uint16_t * q = rec + 4;
    if (scale) {
        const float inv = 1 / scale;
        for (int i = 0; i < n_vocab; ++i) {
            q[i] = logits[i] > lo ? round_nearest(inv * (logits[i] - lo)) : 0;
        }
    } else {
        memset(q, 0, n_vocab * sizeof(uint16_t));
    }
    return hi + log_sum - logits[target];
}

int fail(const char * what) {
    fprintf(stderr, "error: %s\n", what);
    llama_backend_free();
    return 1;
}

}  // namespace

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");
    common_params params;
    params.n_ctx  = 512;
    params.escape = false;
    common_init();
    // -f reads the file into params.prompt (common/arg.cpp); here it holds ids, not text
    if (!common_params_parse(argc, argv, params, LLAMA_EXAMPLE_PERPLEXITY)) {
        return 1;
    }
    const int n_ctx = params.n_ctx;
    if (n_ctx <= 0 || params.logits_file.empty() || params.n_batch != n_ctx) {
        fprintf(stderr, "error: need -c N > 0, -b N (the same N) and --kl-divergence-base FILE\n");
        return 1;
    }
    params.n_parallel = 1;

    std::vector<llama_token> tokens;
    {
        std::istringstream in(params.prompt);
        long long          id;
        while (in >> id) {
            tokens.push_back((llama_token) id);
        }
        if (!in.eof()) {
            fprintf(stderr, "error: the -f file holds something that is not a token id\n");
            return 1;
        }
    }

    llama_backend_init();
    llama_numa_init(params.numa);
    auto                init  = common_init_from_params(params);
    llama_model *       model = init->model();
    llama_context *     ctx   = init->context();
    if (!model || !ctx) {
        return fail("cannot load the model or create its context (see the lines above)");
    }
    const llama_vocab * vocab   = llama_model_get_vocab(model);
    const int           n_vocab = llama_vocab_n_tokens(vocab);
    const bool          add_bos = llama_vocab_get_add_bos(vocab);
    for (llama_token t : tokens) {
        if (t < 0 || t >= n_vocab) {
            return fail("a token id of the -f file is outside the model's vocabulary");
        }
    }
    if ((int) tokens.size() < 2 * n_ctx) {
        fprintf(stderr, "error: %zu token ids, the base file needs at least %d (2 x ctx)\n", tokens.size(), 2 * n_ctx);
        llama_backend_free();
        return 1;
    }
    const int n_max   = (int) tokens.size() / n_ctx;
    const int n_chunk = params.n_chunks < 0 ? n_max : std::min(params.n_chunks, n_max);
    const int first   = n_ctx / 2;
    const int nv      = 2 * ((n_vocab + 1) / 2) + 4;
    LOG_INF("%s: computing over %d chunks, n_ctx=%d\n", __func__, n_chunk, n_ctx);

    std::ofstream out(params.logits_file, std::ios::binary);
    if (!out) {
        return fail("cannot open the --kl-divergence-base file for writing");
    }
    out.write("_logits_", 8);
    out.write((const char *) &n_ctx, sizeof(n_ctx));
    out.write((const char *) &n_vocab, sizeof(n_vocab));
    out.write((const char *) &n_chunk, sizeof(n_chunk));
    out.write((const char *) tokens.data(), sizeof(llama_token) * size_t(n_chunk) * n_ctx);

    std::vector<uint16_t> recs(size_t(n_ctx - 1 - first) * nv);
    common_batch          batch(ctx);
    double                nll = 0.0, nll2 = 0.0;
    size_t                count = 0;
    for (int c = 0; c < n_chunk; ++c) {
        const llama_token * chunk = tokens.data() + size_t(c) * n_ctx;
        llama_memory_clear(llama_get_memory(ctx), true);
        batch.clear();
        for (int k = 0; k < n_ctx; ++k) {
            const llama_token id = (k == 0 && add_bos) ? llama_vocab_bos(vocab) : chunk[k];
            batch.add(id, k, 0, k >= first);
        }
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get())) {
            return fail("llama_process failed to decode a chunk");
        }
        const float * logits = llama_get_logits_ith(ctx, first);
        for (int r = 0; r < n_ctx - 1 - first; ++r) {
            const double v = write_record(n_vocab, logits + size_t(r) * n_vocab, recs.data() + size_t(r) * nv,
                                          chunk[first + r + 1]);
            nll += v;
            nll2 += v * v;
            ++count;
        }
        out.write((const char *) recs.data(), sizeof(uint16_t) * recs.size());
        LOG("[%d]%.4lf,", c + 1, std::exp(nll / count));
    }
    LOG("\n");
    out.close();
    if (!out) {
        return fail("cannot write the --kl-divergence-base file");
    }
    const double mean = nll / count;
    const double var  = nll2 / count - mean * mean;
    LOG_INF("Final estimate: PPL = %.4lf +/- %.5lf\n", std::exp(mean), var > 0 ? sqrt(var / (count - 1)) * std::exp(mean) : 0.0);
    llama_backend_free();
    return 0;
}
