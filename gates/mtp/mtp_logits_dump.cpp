// Dump llama.cpp's logits for token sequences, for the MTP fixture check.
// Reads one sequence per stdin line (space-separated token ids). For each it prints
// one JSON line: {"final_logits": [...], "greedy": [...]} where final_logits are the
// raw logits after the last prompt token and greedy is an argmax continuation of
// N_GEN tokens (decoded one at a time through the KV cache).
//
// build: g++ -O2 -std=c++17 gates/mtp/mtp_logits_dump.cpp -Ivendor/llama.cpp/include \
//          -Ivendor/llama.cpp/ggml/include -L$BIN -lllama -Wl,-rpath,$BIN -o $OUT
// usage: [MTP_DUMP_F32_KV=1] mtp_logits_dump MODEL.gguf N_GEN < prompts.txt
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf N_GEN < prompts\n", argv[0]);
        return 1;
    }
    const int n_gen = atoi(argv[2]);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 1024;
    cp.n_batch = 1024;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    if (getenv("MTP_DUMP_F32_KV")) {  // f32 K/V cache, no flash attention: isolates weight/op precision
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "ctx failed\n"); return 1; }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    std::string line;
    while (std::getline(std::cin, line)) {
        std::vector<llama_token> toks;
        std::istringstream is(line);
        int t;
        while (is >> t) toks.push_back(t);
        if (toks.empty()) continue;
        llama_memory_clear(llama_get_memory(ctx), true);
        if (llama_decode(ctx, llama_batch_get_one(toks.data(), (int) toks.size())) != 0) {
            fprintf(stderr, "decode failed\n");
            return 1;
        }
        const float * lg = llama_get_logits_ith(ctx, -1);
        printf("{\"final_logits\": [");
        for (int i = 0; i < n_vocab; ++i) printf(i ? ",%.6g" : "%.6g", lg[i]);
        printf("], \"greedy\": [");
        for (int g = 0; g < n_gen; ++g) {
            const float * l = llama_get_logits_ith(ctx, -1);
            llama_token best = 0;
            for (int i = 1; i < n_vocab; ++i) if (l[i] > l[best]) best = i;
            printf(g ? ",%d" : "%d", best);
            if (llama_decode(ctx, llama_batch_get_one(&best, 1)) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
        }
        printf("]}\n");
        fflush(stdout);
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
