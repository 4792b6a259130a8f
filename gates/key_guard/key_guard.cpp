// The key guard of a quantized K cache: what it estimates, whether it warns, and that it changes nothing.
//
// For each K type (V f16, flash attention on), one context decodes the first N tokens of a text as one
// ubatch, with logits for every token, then P more tokens one at a time: the first ubatch is the one
// the guard estimates on. The estimates are read from llama's log (one line over the model's caches),
// the warning from llama_key_guard_warning(). The same decode in a context made with
// LLAMA_ATTN_K_GUARD_DISABLE=1 must give the same logits bit for bit.
// A type written TYPE:noscale runs with LLAMA_ATTN_K_SCALE_DISABLE=1 (upstream's plain rotation).
//
// build: c++ -O2 -std=c++17 key_guard.cpp -I$ROOT/vendor/llama.cpp/include
//          -I$ROOT/vendor/llama.cpp/ggml/include -L$BIN -lllama -lggml -lggml-base -Wl,-rpath,$BIN
// usage: key_guard MODEL.gguf TEXT TYPE_K[,TYPE_K...] [N P]   -> one JSON object on stdout
#include "llama.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static std::string g_log;

static void log_cb(ggml_log_level level, const char * text, void * /*user*/) {
    if (level != GGML_LOG_LEVEL_DEBUG) {
        g_log += text;
    }
}

static ggml_type parse_type(const std::string & name) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * tn = ggml_type_name((ggml_type) t);
        if (tn && name == tn) {
            return (ggml_type) t;
        }
    }
    fprintf(stderr, "error: unknown KV type %s\n", name.c_str());
    exit(2);
}

struct run_result {
    std::vector<float> logits;
    std::string warning;
    double kl      = 0.0; // the estimates, summed over the caches
    double kl_q8_0 = 0.0;
    int    n_lines = 0;
};

static run_result run(llama_model * model, const std::vector<llama_token> & toks, int n_first, ggml_type type_k) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = 1024;
    cp.n_batch         = 512;
    cp.n_ubatch        = 512;
    cp.type_k          = type_k;
    cp.type_v          = GGML_TYPE_F16;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    cp.n_threads       = 2;
    cp.n_threads_batch = 2;

    g_log.clear();
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "error: cannot create a context with K %s\n", ggml_type_name(type_k));
        exit(1);
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    run_result res;
    llama_batch batch = llama_batch_init((int) toks.size(), 0, 1);
    for (int i0 = 0; i0 < (int) toks.size(); ) {
        const int n = i0 == 0 ? n_first : 1;
        batch.n_tokens = n;
        for (int i = 0; i < n; ++i) {
            batch.token[i]     = toks[i0 + i];
            batch.pos[i]       = i0 + i;
            batch.n_seq_id[i]  = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i]    = true;
        }
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "error: llama_decode failed\n");
            exit(1);
        }
        for (int i = 0; i < n; ++i) {
            const float * lg = llama_get_logits_ith(ctx, i);
            res.logits.insert(res.logits.end(), lg, lg + n_vocab);
        }
        i0 += n;
    }
    llama_batch_free(batch);

    res.warning = llama_key_guard_warning(ctx);

    // "key_guard_judge: TYPE keys cost the attention weights X nats summed over L layers, q8_0 keys Y"
    std::istringstream lines(g_log);
    for (std::string line; std::getline(lines, line); ) {
        const size_t at = line.find("keys cost the attention weights ");
        if (at == std::string::npos || line.find("summed over") == std::string::npos || line.find("key_guard_judge: ") == std::string::npos) {
            continue;
        }
        double kl = 0.0, kl8 = 0.0;
        int n_layer = 0;
        char type_name[32];
        if (sscanf(line.c_str() + line.find("key_guard_judge: "), "key_guard_judge: %31s keys cost the attention weights %lf nats summed over %d layers, q8_0 keys %lf",
                   type_name, &kl, &n_layer, &kl8) == 4) {
            res.kl      += kl;
            res.kl_q8_0 += kl8;
            res.n_lines += 1;
        }
    }

    llama_free(ctx);
    return res;
}

static std::string json_str(const std::string & s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
        }
        out += c;
    }
    return out + "\"";
}

int main(int argc, char ** argv) {
    if (argc != 4 && argc != 6) {
        fprintf(stderr, "usage: %s MODEL.gguf TEXT TYPE_K[,TYPE_K...] [N P]\n", argv[0]);
        return 2;
    }
    const int n_first = argc == 6 ? atoi(argv[4]) : 256;
    const int n_next  = argc == 6 ? atoi(argv[5]) : 4;

    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "error: cannot load %s\n", argv[1]);
        return 1;
    }

    std::ifstream fin(argv[2]);
    std::stringstream ss;
    ss << fin.rdbuf();
    const std::string text = ss.str();
    std::vector<llama_token> all(text.size() + 16);
    const int n_all = llama_tokenize(llama_model_get_vocab(model), text.c_str(), (int) text.size(), all.data(), (int) all.size(), true, false);
    if (n_all < n_first + n_next) {
        fprintf(stderr, "error: the text has %d tokens, fewer than %d\n", n_all, n_first + n_next);
        return 1;
    }
    const std::vector<llama_token> toks(all.begin(), all.begin() + n_first + n_next);

    std::string out = "{";
    std::stringstream types(argv[3]);
    bool first = true;
    for (std::string spec; std::getline(types, spec, ','); ) {
        const size_t colon = spec.find(':');
        const std::string name = spec.substr(0, colon);
        const bool noscale = colon != std::string::npos && spec.substr(colon + 1) == "noscale";
        const ggml_type type_k = parse_type(name);

        setenv("LLAMA_ATTN_K_SCALE_DISABLE", noscale ? "1" : "0", 1);
        setenv("LLAMA_ATTN_K_GUARD_DISABLE", "0", 1);
        const run_result on = run(model, toks, n_first, type_k);
        setenv("LLAMA_ATTN_K_GUARD_DISABLE", "1", 1);
        const run_result off = run(model, toks, n_first, type_k);

        double max_dlogit = on.logits.size() == off.logits.size() ? 0.0 : INFINITY;
        for (size_t i = 0; i < on.logits.size() && i < off.logits.size(); ++i) {
            max_dlogit = std::max(max_dlogit, (double) std::fabs(on.logits[i] - off.logits[i]));
        }
        char buf[512];
        snprintf(buf, sizeof(buf), "%s\"%s\": {\"kl\": %.6g, \"kl_q8_0\": %.6g, \"estimates\": %d, \"estimates_disabled\": %d, "
                 "\"warned\": %s, \"max_dlogit\": %.9g, \"warning\": ", first ? "" : ", ", spec.c_str(), on.kl, on.kl_q8_0,
                 on.n_lines, off.n_lines, on.warning.empty() ? "false" : "true", max_dlogit);
        out += buf + json_str(on.warning) + "}";
        first = false;
    }
    out += "}";
    printf("%s\n", out.c_str());

    llama_model_free(model);
    llama_backend_free();
    return 0;
}
