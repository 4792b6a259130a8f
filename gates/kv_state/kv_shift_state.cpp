// K-shift and state save/restore of a quantized KV cache.
//
// On the first N tokens of a text, one context per run, flash attention on, P probe tokens scored:
//   shift: decode T[0, N), move every cell but the first up by D (the K-shift graph re-ropes the
//          stored keys, as a context shift does), score the probes after them; once with the
//          types under test and once with f16 K/V, where the shift is exact up to rounding;
//   base:  the same without the shift, both types;
//   state: decode T[0, N), save the sequence, restore it into a new context and score the probes;
//          compare with the probes scored in the first context;
//   reuse: decode another opening (BOS and N - 1 tokens from later in the text), empty the cache
//          with and without clearing its data, then run "base" in that context: cleared, it must
//          score the probes bit for bit as a new context does (a new calibration); emptied only, it
//          keeps the key scale its first ubatch calibrated (the scores differ where there is one).
// A shifted cache should stay as close to the shifted f16 cache as the unshifted one is to f16: a
// stored key offset that did not turn with the shifted keys would move their logits against the
// first key's, and the shift's divergence would grow far beyond the base's.
//
// build: c++ -O2 -std=c++17 kv_shift_state.cpp -I$ROOT/vendor/llama.cpp/include
//          -I$ROOT/vendor/llama.cpp/ggml/include -L$BIN -lllama -lggml -lggml-base -Wl,-rpath,$BIN
// usage: kv_shift_state MODEL.gguf TEXT TYPE_K TYPE_V [N D P]   -> one JSON object on stdout
#include "llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static ggml_type parse_type(const char * name) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * tn = ggml_type_name((ggml_type) t);
        if (tn && strcmp(tn, name) == 0) {
            return (ggml_type) t;
        }
    }
    fprintf(stderr, "error: unknown KV type %s\n", name);
    exit(2);
}

struct runner {
    llama_model * model;
    ggml_type type_k;
    ggml_type type_v;
    int n_vocab;

    llama_context * new_context() const {
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx           = 1024;
        cp.n_batch         = 512;
        cp.n_ubatch        = 512;
        cp.type_k          = type_k;
        cp.type_v          = type_v;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
        cp.n_threads       = 2;
        cp.n_threads_batch = 2;
        llama_context * ctx = llama_init_from_model(model, cp);
        if (!ctx) {
            fprintf(stderr, "error: cannot create a context with K %s, V %s\n", ggml_type_name(type_k), ggml_type_name(type_v));
            exit(1);
        }
        return ctx;
    }

    // decode toks at the positions following the sequence's last, logits for every token if all
    void decode(llama_context * ctx, const std::vector<llama_token> & toks, bool all) const {
        llama_memory_t mem = llama_get_memory(ctx);
        const llama_pos p0 = llama_memory_seq_pos_max(mem, 0) + 1;
        llama_batch batch = llama_batch_init((int) toks.size(), 0, 1);
        for (size_t i = 0; i < toks.size(); ++i) {
            batch.token[i]     = toks[i];
            batch.pos[i]       = p0 + (llama_pos) i;
            batch.n_seq_id[i]  = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i]    = all || i + 1 == toks.size();
        }
        batch.n_tokens = (int) toks.size();
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "error: llama_decode failed\n");
            exit(1);
        }
        llama_batch_free(batch);
    }

    std::vector<float> probe(llama_context * ctx, const std::vector<llama_token> & probes) const {
        decode(ctx, probes, true);
        std::vector<float> res;
        for (size_t i = 0; i < probes.size(); ++i) {
            const float * lg = llama_get_logits_ith(ctx, (int) i);
            res.insert(res.end(), lg, lg + n_vocab);
        }
        return res;
    }
};

struct divergence {
    double kld_mean   = 0.0;
    double top1       = 0.0;
    double max_dlogit = 0.0;
};

// KL(p_ref || p) per probe token, mean; top-1 agreement; largest logit difference
static divergence compare(const std::vector<float> & ref, const std::vector<float> & cur, int n_vocab) {
    divergence d;
    const size_t n = ref.size()/n_vocab;
    for (size_t t = 0; t < n; ++t) {
        const float * a = ref.data() + t*n_vocab;
        const float * b = cur.data() + t*n_vocab;
        const float ma = *std::max_element(a, a + n_vocab);
        const float mb = *std::max_element(b, b + n_vocab);
        double sa = 0.0, sb = 0.0;
        for (int i = 0; i < n_vocab; ++i) {
            sa += std::exp((double) a[i] - ma);
            sb += std::exp((double) b[i] - mb);
        }
        const double la = std::log(sa), lb = std::log(sb);
        double kl = 0.0;
        for (int i = 0; i < n_vocab; ++i) {
            const double lpa = a[i] - ma - la;
            const double lpb = b[i] - mb - lb;
            kl += std::exp(lpa)*(lpa - lpb);
            d.max_dlogit = std::max(d.max_dlogit, (double) std::fabs(a[i] - b[i]));
        }
        d.kld_mean += kl/n;
        d.top1 += (std::max_element(a, a + n_vocab) - a) == (std::max_element(b, b + n_vocab) - b) ? 1.0/n : 0.0;
    }
    return d;
}

int main(int argc, char ** argv) {
    if (argc != 5 && argc != 8) {
        fprintf(stderr, "usage: %s MODEL.gguf TEXT TYPE_K TYPE_V [N D P]\n", argv[0]);
        return 2;
    }
    const int n_tok   = argc == 8 ? atoi(argv[5]) : 384;
    const int n_shift = argc == 8 ? atoi(argv[6]) : 512;
    const int n_probe = argc == 8 ? atoi(argv[7]) : 64;
    if (n_tok < 2 || n_shift < 1 || n_tok + n_shift + n_probe > 1024 || n_probe < 1) {
        fprintf(stderr, "error: need N >= 2, D >= 1, P >= 1 and N + D + P <= 1024\n");
        return 2;
    }

    llama_log_set([](ggml_log_level level, const char * text, void *) {
        if (level >= GGML_LOG_LEVEL_WARN) {
            fputs(text, stderr);
        }
    }, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    runner r;
    r.model = llama_model_load_from_file(argv[1], mp);
    if (!r.model) {
        fprintf(stderr, "error: cannot load %s\n", argv[1]);
        return 1;
    }
    r.type_k  = parse_type(argv[3]);
    r.type_v  = parse_type(argv[4]);
    const llama_vocab * vocab = llama_model_get_vocab(r.model);
    r.n_vocab = llama_vocab_n_tokens(vocab);

    std::ifstream in(argv[2]);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    std::vector<llama_token> all(text.size() + 16);
    const int n_all = llama_tokenize(vocab, text.c_str(), (int) text.size(), all.data(), (int) all.size(), true, false);
    if (n_all < 2*n_tok + n_probe) {
        fprintf(stderr, "error: %s has %d tokens, need %d\n", argv[2], n_all, 2*n_tok + n_probe);
        return 1;
    }
    const std::vector<llama_token> prompt(all.begin(), all.begin() + n_tok);
    const std::vector<llama_token> probes(all.begin() + n_tok, all.begin() + n_tok + n_probe);
    std::vector<llama_token> other(1, prompt[0]);
    other.insert(other.end(), all.begin() + n_tok + n_probe + 1, all.begin() + 2*n_tok + n_probe);

    // shift and base, under test and f16
    runner ref = r;
    ref.type_k = GGML_TYPE_F16;
    ref.type_v = GGML_TYPE_F16;
    auto run = [&](const runner & rr, int shift) {
        llama_context * ctx = rr.new_context();
        llama_memory_t mem = llama_get_memory(ctx);
        rr.decode(ctx, prompt, false);
        if (shift > 0) {
            if (!llama_memory_can_shift(mem)) {
                fprintf(stderr, "error: this context cannot shift\n");
                exit(1);
            }
            llama_memory_seq_add(mem, 0, 1, -1, shift);
        }
        std::vector<float> res = rr.probe(ctx, probes);
        llama_free(ctx);
        return res;
    };
    const std::vector<float> lg_shift     = run(r,   n_shift);
    const std::vector<float> lg_shift_ref = run(ref, n_shift);
    const std::vector<float> lg_base      = run(r,   0);
    const std::vector<float> lg_base_ref  = run(ref, 0);

    // state
    llama_context * ctx = r.new_context();
    r.decode(ctx, prompt, false);
    std::vector<uint8_t> state(llama_state_seq_get_size(ctx, 0));
    if (llama_state_seq_get_data(ctx, state.data(), state.size(), 0) != state.size()) {
        fprintf(stderr, "error: llama_state_seq_get_data failed\n");
        return 1;
    }
    const std::vector<float> lg_saved = r.probe(ctx, probes);
    llama_free(ctx);

    ctx = r.new_context();
    if (llama_state_seq_set_data(ctx, state.data(), state.size(), 0) != state.size()) {
        fprintf(stderr, "error: llama_state_seq_set_data failed\n");
        return 1;
    }
    const std::vector<float> lg_restored = r.probe(ctx, probes);
    llama_free(ctx);

    // reuse
    auto reuse = [&](bool data) {
        llama_context * c = r.new_context();
        r.decode(c, other, false);
        llama_memory_clear(llama_get_memory(c), data);
        r.decode(c, prompt, false);
        std::vector<float> res = r.probe(c, probes);
        llama_free(c);
        return res;
    };
    const std::vector<float> lg_cleared = reuse(true);
    const std::vector<float> lg_emptied = reuse(false);

    const divergence shift = compare(lg_shift_ref, lg_shift, r.n_vocab);
    const divergence base  = compare(lg_base_ref,  lg_base,  r.n_vocab);
    const divergence moved = compare(lg_base_ref,  lg_shift_ref, r.n_vocab);
    const divergence st    = compare(lg_saved, lg_restored, r.n_vocab);
    const divergence clr   = compare(lg_base, lg_cleared, r.n_vocab);
    const divergence kept  = compare(lg_base, lg_emptied, r.n_vocab);
    const divergence keptf = compare(lg_base_ref, lg_emptied, r.n_vocab);

    printf("{\"type_k\": \"%s\", \"type_v\": \"%s\", \"n_tokens\": %d, \"n_shift\": %d, \"n_probe\": %d, "
           "\"shift_kld\": %.6g, \"shift_top1\": %.4f, \"base_kld\": %.6g, \"base_top1\": %.4f, "
           "\"f16_shift_moved_kld\": %.6g, "
           "\"state_kld\": %.6g, \"state_top1\": %.4f, \"state_max_dlogit\": %.6g, "
           "\"cleared_max_dlogit\": %.6g, \"emptied_max_dlogit\": %.6g, \"emptied_kld\": %.6g}\n",
           argv[3], argv[4], n_tok, n_shift, n_probe,
           shift.kld_mean, shift.top1, base.kld_mean, base.top1, moved.kld_mean,
           st.kld_mean, st.top1, st.max_dlogit,
           clr.max_dlogit, kept.max_dlogit, keptf.kld_mean);

    llama_model_free(r.model);
    llama_backend_free();
    return 0;
}
