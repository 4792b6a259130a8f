// kv_dump: dump the per-layer attention inputs of a llama.cpp model (post-RoPE Q and K, pre-RoPE K, V)
// as raw little-endian f32 files, for offline KV-cache quantization studies (scripts/key_quant_study.py).
//
// The text is tokenized like llama-perplexity does it: the whole file at once (with BOS), then cut in
// chunks of n_ctx tokens whose first token is replaced by BOS; every chunk is evaluated as a fresh
// sequence in a single ubatch (n_batch = n_ubatch = n_ctx) with an f16 KV cache, so no Hadamard rotation
// is inserted in the graph and the dumped tensors are exactly what the model computes before the cache.
//
// Tensors (graph names as in src/models/gemma3.cpp, src/models/llama.cpp, src/llama-graph.cpp; one file per
// layer and chunk):
//   Qcur-<il>        op ROPE     -> q_<il>_c<chunk>.f32      [n_tokens][n_head][head_dim]   (before the 1/sqrt(d) scale)
//   Kcur-<il>        op ROPE     -> k_<il>_c<chunk>.f32      [n_tokens][n_head_kv][head_dim]
//   Kcur_normed-<il> (k-norm)    -> kpre_<il>_c<chunk>.f32   [n_tokens][n_head_kv][head_dim] (pre-RoPE)
//   Kcur-<il>        MUL_MAT/ADD -> kpre_<il>_c<chunk>.f32   (pre-RoPE, models without a k-norm, e.g. llama)
//   Vcur-<il>        MUL_MAT/ADD -> v_<il>_c<chunk>.f32      [n_tokens][n_head_kv][head_dim]
// plus tokens_c<chunk>.i32 and meta.txt (n_ctx, chunks, n_layer, n_head, n_head_kv, dims, arch, rope_type
// (0 = NORM: pairs (2i, 2i+1), 2 = NEOX: pairs (i, i + d/2)), rope_freq_base, rope_freq_scale, n_swa, head_dim).
//
// Build (from the repo root, against the CPU build of the patched llama.cpp):
//   B=build/cpu-0bf587e88990
//   g++ -O2 -std=c++17 scripts/kv_dump.cpp -o /tmp/keystudy/kv_dump \
//       -I vendor/llama.cpp/include -I vendor/llama.cpp/ggml/include \
//       -L $B/bin -lllama -lggml -lggml-base -Wl,-rpath,$(pwd)/$B/bin
// Run:
//   /tmp/keystudy/kv_dump ~/.cache/polyforge/models/gemma-3-270m-q4_k_m.gguf gates/data/llama-docs.txt \
//       1024 4 /tmp/keystudy/dump
//   /tmp/smolstudy/kv_dump ~/.cache/polyforge/models/SmolLM2-135M-Instruct.Q4_1.gguf gates/data/llama-docs.txt \
//       1024 4 /tmp/smolstudy/dump        (llama arch: NORM RoPE, no k-norm, GQA)
// args: model text n_ctx n_chunks outdir [n_threads]

#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

struct dump_state {
    std::string outdir;
    int chunk = 0;
    int n_written = 0;
};

static bool name_is(const char * name, const char * prefix, int * il) {
    const size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0 || name[n] != '-') {
        return false;
    }
    char * end = nullptr;
    const long v = strtol(name + n + 1, &end, 10);
    if (end == name + n + 1 || *end != '\0') {
        return false;
    }
    *il = (int) v;
    return true;
}

// which file (if any) a graph node goes to
static std::string target(const ggml_tensor * t) {
    int il = -1;
    const char * name = t->name;
    if (name_is(name, "Qcur", &il) && t->op == GGML_OP_ROPE) {
        return "q_" + std::to_string(il);
    }
    if (name_is(name, "Kcur", &il) && t->op == GGML_OP_ROPE) {
        return "k_" + std::to_string(il);
    }
    if (name_is(name, "Kcur_normed", &il) && t->op != GGML_OP_RESHAPE && t->op != GGML_OP_VIEW) {
        return "kpre_" + std::to_string(il);
    }
    // the projection itself (no k-norm): kept as kraw_, renamed to kpre_ at the end where no k-norm was seen
    if (name_is(name, "Kcur", &il) && (t->op == GGML_OP_MUL_MAT || t->op == GGML_OP_ADD)) {
        return "kraw_" + std::to_string(il);
    }
    if (name_is(name, "Vcur", &il) && (t->op == GGML_OP_MUL_MAT || t->op == GGML_OP_ADD)) {
        return "v_" + std::to_string(il);
    }
    return "";
}

static bool dump_cb(ggml_tensor * t, bool ask, void * user_data) {
    auto * st = (dump_state *) user_data;
    const std::string base = target(t);
    if (ask) {
        return !base.empty();
    }
    if (base.empty()) {
        return true;
    }
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) {
        fprintf(stderr, "kv_dump: %s is not contiguous f32 (type %s), skipped\n", t->name, ggml_type_name(t->type));
        return true;
    }
    std::vector<float> buf(ggml_nelements(t));
    ggml_backend_tensor_get(t, buf.data(), 0, ggml_nbytes(t));
    const std::string path = st->outdir + "/" + base + "_c" + std::to_string(st->chunk) + ".f32";
    FILE * f = fopen(path.c_str(), "wb");
    if (!f) {
        fprintf(stderr, "kv_dump: cannot write %s\n", path.c_str());
        exit(1);
    }
    fwrite(buf.data(), sizeof(float), buf.size(), f);
    fclose(f);
    if (st->chunk == 0) {
        fprintf(stderr, "kv_dump: %-16s op %-10s ne [%lld %lld %lld %lld] -> %s\n", t->name, ggml_op_name(t->op),
                (long long) t->ne[0], (long long) t->ne[1], (long long) t->ne[2], (long long) t->ne[3], path.c_str());
    }
    st->n_written++;
    return true;
}

int main(int argc, char ** argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s model.gguf text.txt n_ctx n_chunks outdir [n_threads]\n", argv[0]);
        return 1;
    }
    const char * model_path = argv[1];
    const char * text_path  = argv[2];
    const int    n_ctx      = atoi(argv[3]);
    const int    n_chunks   = atoi(argv[4]);
    dump_state   st;
    st.outdir               = argv[5];
    const int    n_threads  = argc > 6 ? atoi(argv[6]) : 2;

    std::ifstream in(text_path, std::ios::binary);
    if (!in) {
        fprintf(stderr, "cannot read %s\n", text_path);
        return 1;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();

    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", model_path);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx             = n_ctx;
    cp.n_batch           = n_ctx;
    cp.n_ubatch          = n_ctx;
    cp.n_seq_max         = 1;
    cp.n_threads         = n_threads;
    cp.n_threads_batch   = n_threads;
    cp.type_k            = GGML_TYPE_F16;
    cp.type_v            = GGML_TYPE_F16;
    cp.cb_eval           = dump_cb;
    cp.cb_eval_user_data = &st;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot create context\n");
        return 1;
    }

    const bool add_bos = llama_vocab_get_add_bos(vocab);
    const int n_max = (int) text.size() + 16;
    std::vector<llama_token> toks(n_max);
    const int n_tok = llama_tokenize(vocab, text.c_str(), (int) text.size(), toks.data(), n_max, add_bos, false);
    if (n_tok < 0) {
        fprintf(stderr, "tokenize failed\n");
        return 1;
    }
    toks.resize(n_tok);
    fprintf(stderr, "kv_dump: %d tokens in %s, add_bos %d\n", n_tok, text_path, add_bos);
    if (n_tok < n_ctx * n_chunks) {
        fprintf(stderr, "text too short for %d chunks of %d\n", n_chunks, n_ctx);
        return 1;
    }

    for (int c = 0; c < n_chunks; ++c) {
        st.chunk = c;
        std::vector<llama_token> chunk(toks.begin() + (size_t) c * n_ctx, toks.begin() + (size_t) (c + 1) * n_ctx);
        if (add_bos) {
            chunk[0] = llama_vocab_bos(vocab);
        }
        llama_memory_clear(llama_get_memory(ctx), true);
        if (llama_decode(ctx, llama_batch_get_one(chunk.data(), (int32_t) chunk.size())) != 0) {
            fprintf(stderr, "decode failed on chunk %d\n", c);
            return 1;
        }
        const std::string tpath = st.outdir + "/tokens_c" + std::to_string(c) + ".i32";
        FILE * f = fopen(tpath.c_str(), "wb");
        fwrite(chunk.data(), sizeof(llama_token), chunk.size(), f);
        fclose(f);
        fprintf(stderr, "kv_dump: chunk %d done, %d files so far\n", c, st.n_written);
    }

    // pre-RoPE keys: the k-normed ones where the model has a k-norm, else the projection
    int n_kraw = 0;
    for (int il = 0; il < llama_model_n_layer(model); ++il) {
        for (int c = 0; c < n_chunks; ++c) {
            const std::string sfx  = std::to_string(il) + "_c" + std::to_string(c) + ".f32";
            const std::string raw  = st.outdir + "/kraw_" + sfx;
            const std::string pre  = st.outdir + "/kpre_" + sfx;
            if (FILE * f = fopen(pre.c_str(), "rb")) {
                fclose(f);
                std::remove(raw.c_str());
            } else if (std::rename(raw.c_str(), pre.c_str()) == 0) {
                n_kraw++;
            }
        }
    }
    if (n_kraw) {
        fprintf(stderr, "kv_dump: no k-norm: %d pre-RoPE key files are the projection (Kcur MUL_MAT/ADD)\n", n_kraw);
    }

    {
        char arch[128] = "unknown";
        llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch));
        auto meta_f = [&](const std::string & key, const char * dflt) {
            static char buf[128];
            if (llama_model_meta_val_str(model, key.c_str(), buf, sizeof(buf)) < 0) {
                snprintf(buf, sizeof(buf), "%s", dflt);
            }
            return std::string(buf);
        };
        const std::string a        = arch;
        const std::string base     = meta_f(a + ".rope.freq_base", "10000");
        const std::string base_swa = meta_f(a + ".rope.freq_base_swa", "0");
        const std::string kl       = meta_f(a + ".attention.key_length",
                                            std::to_string(llama_model_n_embd(model) / llama_model_n_head(model)).c_str());
        const std::string mpath = st.outdir + "/meta.txt";
        FILE * f = fopen(mpath.c_str(), "w");
        fprintf(f, "model %s\ntext %s\nn_ctx %d\nn_chunks %d\nn_layer %d\nn_head %d\nn_head_kv %d\nn_embd %d\n",
                model_path, text_path, n_ctx, n_chunks, llama_model_n_layer(model), llama_model_n_head(model),
                llama_model_n_head_kv(model), llama_model_n_embd(model));
        fprintf(f, "arch %s\nrope_type %d\nrope_freq_base %s\nrope_freq_base_swa %s\nrope_freq_scale %g\nn_swa %d\nhead_dim %s\n",
                arch, (int) llama_model_rope_type(model), base.c_str(), base_swa.c_str(),
                llama_model_rope_freq_scale_train(model), llama_model_n_swa(model), kl.c_str());
        fclose(f);
    }

    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
