/* Causal grouped-query attention through cuDNN's fused flash attention (SDPA), forward and
 * backward, as the alternative to attention.cu's kernels; the choice rule is in attention_cudnn.h.
 *
 * Why the cudnn-frontend C++ graph API (header-only, third_party/cudnn-frontend, installed by
 * scripts/cudnn-frontend.sh) and not the backend descriptor API from C: an SDPA graph in backend
 * descriptors is ~20 pointwise/matmul/reduction nodes per direction that cuDNN pattern-matches
 * into its fused engine, and their exact form changes between versions; the frontend's sdpa() and
 * sdpa_backward() nodes are that graph, maintained by NVIDIA.
 *
 * cuDNN is loaded at run time (the frontend's NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING: every cuDNN
 * call goes through dlsym on our dlopen of libcudnn.so.9), so megatrain links and runs on machines
 * without cuDNN; there, and for cases cuDNN does not support, the caller runs our kernels.
 *
 * Layout, without copies: our token-major rows q (B*T, H, D) are cuDNN's BSHD, i.e. dims
 * (B, H, T, D) with strides (T*H*D, D, H*D, 1); k, v, dk, dv likewise with G heads; out, dout, dq
 * as q. GQA: cuDNN maps query head h to kv head h / (H/G), as we do. Causal: the top-left diagonal
 * band with right bound 0 (key s visible to query t iff s <= t). Scale 1/sqrt(D) in fp32, or the
 * call's (mt_attention_opts.scale: Gemma's query_pre_attn_scalar); a window W (gpt-oss, Gemma's
 * sliding layers) is the band's left bound W (key s kept iff s + W > t). gpt-oss's sinks join the
 * forward's softmax as cuDNN's sink token (its Stats then hold them, as our lse does); the backward
 * needs no sinks (P = exp(s - lse)), and the sinks' gradient is attention.cu's. Every option is
 * behind MT_EXPERIMENTAL_ATTENTION until test_cuda_attention passes on a GPU (attention_cudnn.h).
 * Softmax statistics: cuDNN's Stats is max + ln(sum exp) of the scaled scores, natural log, fp32,
 * dims (B, H, T, 1) with strides (H*T, T, 1, 1): exactly our lse (B, H, T). So cuDNN writes our
 * lse buffer and its backward reads it, and either forward can feed either backward.
 *
 * Documents packed in a row (doc_start) go to cuDNN unless MT_ATTENTION_DOCS=own or
 * MT_ATTENTION=own (the header gives the H200's numbers), as a ragged batch: sequence i is the i-th
 * document in token order (attention_docs.h), and since documents tile the rows the ragged offsets
 * are the cumulative lengths, i.e. cuDNN's packed THD layout over our token-major rows: q, out,
 * dout, dq at offset tok_off[i]*H*D elements with the BSHD strides above; k, v, dk, dv at
 * tok_off[i]*G*D; the padding mask with seq_len_q = seq_len_kv = the document's length (INT32,
 * (S,1,1,1)) and the causal band inside it. Stats in THD form is token-major, (S, H, s_max, 1) with
 * strides (H*s_max, 1, H, 1) at offset tok_off[i]*H (the layout TransformerEngine feeds cuDNN), so
 * a small transpose kernel moves it to and from our (B, H, T) lse, which keeps either forward able
 * to feed either backward. cuDNN never reads doc_start: the lengths and offsets come from the host
 * copy the engine notes when it uploads doc_start (mt_backend.note_documents), uploaded on the op's
 * stream once per step and call shape. The graph depends on S (sequences) and s_max (their padded
 * length), which vary per step: both are rounded up to powers of two (attention_docs.h), sequences
 * past the documents have length 0, so a graph serves every step whose counts fall in its bucket.
 * Cost: at most log2(T) * log2(B*T) graphs over a run (a build is ~0.1-1 s), and a grid of S * H *
 * s_max/tile CTAs of which those past a sequence's end exit at once (with S <= 2n and s_max <=
 * 2*longest). The backward's workspace is sized by the tokens (max_total_seq_len = B*T), not by
 * S*s_max. Rows of one document each (every doc_start 0) take the plain graph.
 *
 * A graph (validated, with its execution plan) is built once per (direction, B, T, H, G, D, device)
 * and cached, like matmul.cu's plans; one that cuDNN cannot build is remembered as unsupported. The
 * workspace (the backward's fp32 dQ accumulator, ~B*T*H*D*4 bytes, and what else cuDNN asks for:
 * the bench prints it) comes from the stream-ordered pool on the op's stream, as our backward's
 * scratch does, so MT_CUDA_POOL_HEADROOM must cover it as it covers ours. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_cudnn.h"

namespace {

mt_attention_impl g_impl = MT_ATTENTION_AUTO;
bool g_impl_read = false;
mt_attention_impl g_docs_impl = MT_ATTENTION_CUDNN;
bool g_docs_impl_read = false;
mt_attention_impl g_last[2] = {MT_ATTENTION_AUTO, MT_ATTENTION_AUTO};
/* the latest call's ragged batch when it ran cuDNN's variable-length graph (n 0 otherwise) */
struct last_docs {
    int n, S, s_max;
} g_last_docs[2];

mt_attention_impl impl_from_env() {
    const char *e = getenv("MT_ATTENTION");
    if (!e || !*e || strcmp(e, "auto") == 0) return MT_ATTENTION_AUTO; /* the default: see the header */
    if (strcmp(e, "own") == 0) return MT_ATTENTION_OWN;
    if (strcmp(e, "cudnn") == 0) return MT_ATTENTION_CUDNN;
    fprintf(stderr, "megatrain: MT_ATTENTION=%s: expected own, cudnn or auto\n", e);
    exit(1);
}

mt_attention_impl docs_impl_from_env() {
    const char *e = getenv("MT_ATTENTION_DOCS");
    /* auto, the default, is cuDNN: faster at every packed shape measured (the header) */
    if (!e || !*e || strcmp(e, "cudnn") == 0 || strcmp(e, "auto") == 0) return MT_ATTENTION_CUDNN;
    if (strcmp(e, "own") == 0) return MT_ATTENTION_OWN;
    fprintf(stderr, "megatrain: MT_ATTENTION_DOCS=%s: expected own, cudnn or auto\n", e);
    exit(1);
}

} // namespace

extern "C" void mt_cuda_attention_set_docs_impl(mt_attention_impl impl) {
    g_docs_impl = impl == MT_ATTENTION_OWN ? MT_ATTENTION_OWN : MT_ATTENTION_CUDNN; /* auto: cuDNN */
    g_docs_impl_read = true;
}

extern "C" mt_attention_impl mt_cuda_attention_get_docs_impl(void) {
    if (!g_docs_impl_read) {
        g_docs_impl = docs_impl_from_env();
        g_docs_impl_read = true;
    }
    return g_docs_impl;
}

extern "C" int mt_cuda_attention_last_docs(int backward, int *S, int *s_max) {
    const last_docs &l = g_last_docs[backward ? 1 : 0];
    if (S) *S = l.S;
    if (s_max) *s_max = l.s_max;
    return l.n;
}

extern "C" void mt_cuda_attention_set_impl(mt_attention_impl impl) {
    g_impl = impl;
    g_impl_read = true;
}

extern "C" mt_attention_impl mt_cuda_attention_get_impl(void) {
    if (!g_impl_read) {
        g_impl = impl_from_env();
        g_impl_read = true;
    }
    return g_impl;
}

extern "C" mt_attention_impl mt_cuda_attention_last(int backward) { return g_last[backward ? 1 : 0]; }

static int g_experimental = -1; /* -1: MT_EXPERIMENTAL_ATTENTION not read yet */

extern "C" int mt_cuda_attention_experimental(void) {
    if (g_experimental < 0) {
        const char *e = getenv("MT_EXPERIMENTAL_ATTENTION");
        g_experimental = e && *e && strcmp(e, "0") != 0 ? 1 : 0;
    }
    return g_experimental;
}

extern "C" void mt_cuda_attention_set_experimental(int on) { g_experimental = on ? 1 : 0; }

#if MT_HAVE_CUDNN

#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cstring> /* the frontend's shim uses std::strlen without it */
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backend/attention_docs.h"

namespace fe = cudnn_frontend;

/* The frontend's dynamic loading resolves every cuDNN symbol in this handle. */
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

namespace {

constexpr long kMinVersion = 90000; /* bf16 causal GQA SDPA forward and backward on Hopper */
constexpr int kMaxDevices = 64;

enum : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeqQ, kSeqKV, kQOff, kKVOff, kStOff, kSink };

/* S = 0: the plain graph over B rows of T; S > 0: the variable-length graph of S sequences padded
 * to s_max over B*T tokens, with ragged offsets in int64 when off64 (else int32). */
struct plan_key {
    int backward, device, B, T, H, G, D;
    int S = 0, s_max = 0, off64 = 0;
    /* the call's options (mt_attention_opts): the scale as its float's bits (0: 1/sqrt(D)) and
     * the window W (0: none; else key s visible to query t iff t-W < s <= t) */
    uint32_t scale_bits = 0;
    int window = 0;
    /* the forward's sinks: (1, H, 1, 1) fp32 logits in the softmax's max and sum, so in Stats as in
     * our lse; the backward needs none (P = exp(s - lse) holds them), its dsinks are attention.cu's */
    int sinks = 0;
    bool operator<(const plan_key &o) const {
        return std::tie(backward, device, B, T, H, G, D, S, s_max, off64, scale_bits, window, sinks) <
               std::tie(o.backward, o.device, o.B, o.T, o.H, o.G, o.D, o.S, o.s_max, o.off64,
                        o.scale_bits, o.window, o.sinks);
    }
};

/* A scale (0: 1/sqrt(D)) and window into k. A window W >= T hides no key: no window. */
void set_key_options(float scale, int window, int T, plan_key *k) {
    if (scale != 0) memcpy(&k->scale_bits, &scale, sizeof k->scale_bits);
    k->window = window > 0 && window < T ? window : 0;
}

/* The options of a call into k (k->backward set); false while MT_EXPERIMENTAL_ATTENTION is off
 * and the call asks for any. */
bool key_options(const mt_attention_opts *o, int T, plan_key *k) {
    if (!o) return true;
    if (!mt_attention_opts_plain(o) && !mt_cuda_attention_experimental()) return false;
    set_key_options(o->scale, o->window, T, k);
    k->sinks = o->sinks && !k->backward;
    return true;
}

/* (H) bf16 -> fp32: the sinks as cuDNN's sink tensor reads them. */
__global__ void sinks_to_f32_kernel(float *dst, const bf16 *src, int H) {
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h < H) dst[h] = __bfloat162float(src[h]);
}

struct plan {
    std::shared_ptr<fe::graph::Graph> graph; /* null: cuDNN cannot run this shape */
    int64_t workspace = 0;
};

std::mutex g_mu; /* guards everything below; held through each call (an enqueue) */
int g_loaded = 0; /* 0 untried, 1 usable, -1 not */
long g_version = 0;
std::string g_why = "cuDNN not loaded yet";
cudnnHandle_t g_handle[kMaxDevices];
/* Never destroyed, like the handles: at exit the CUDA runtime may be torn down before static
 * destructors would free the plans' kernels. */
std::map<plan_key, plan> &g_plans = *new std::map<plan_key, plan>;
bool g_noted = false;
long long g_last_workspace[2] = {-1, -1};

/* Document starts the engine uploaded (note_documents), by their device address: the host copy
 * that sizes and lays out the ragged batch of every call on rows of that array. */
struct noted_docs {
    int B = 0, T = 0;
    std::vector<int32_t> host;
    uint64_t generation = 0;
};
std::map<const int32_t *, noted_docs> &g_noted_docs = *new std::map<const int32_t *, noted_docs>;
uint64_t g_docs_generation = 0;
bool g_docs_unnoted_said = false;

/* A call's ragged batch on the device, one per (doc_start address, B, T, H, G, D): seq_len (S)
 * int32, then the offsets of q-like, kv-like and stats tensors (S + 1 each, int32 or int64). */
struct docs_key {
    const int32_t *doc_start;
    int B, T, H, G, D;
    bool operator<(const docs_key &o) const {
        return std::tie(doc_start, B, T, H, G, D) < std::tie(o.doc_start, o.B, o.T, o.H, o.G, o.D);
    }
};
struct docs_layout {
    uint64_t generation = 0; /* of the noted documents it was made from; 0: never */
    mt_attention_docs_shape sh = {0, 0, 0, 0};
    int off64 = 0;
    size_t capacity = 0; /* bytes of dev */
    void *dev = nullptr;
    void *seq = nullptr, *q_off = nullptr, *kv_off = nullptr, *st_off = nullptr;
    std::vector<unsigned char> staging;
};
std::map<docs_key, docs_layout> &g_docs_layouts = *new std::map<docs_key, docs_layout>;

/* Tries once: dlopen, version, and the frontend's CUDA runtime (the one we link). */
bool load_locked() {
    if (g_loaded) return g_loaded > 0;
    g_loaded = -1;
    void *h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libcudnn.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        g_why = std::string("libcudnn.so.9 not loadable (") + (e ? e : "?") +
                "); put cuDNN 9's lib folder on LD_LIBRARY_PATH";
        return false;
    }
    fe::cudnn_dlhandle = h;
    /* The frontend dlopens libcudart.so.12 before .13 unless told; name the major we are built
     * with, so that it shares our runtime. */
    char cudart[32];
    snprintf(cudart, sizeof cudart, "libcudart.so.%d", CUDART_VERSION / 1000);
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart, 0);
    try {
        g_version = (long)fe::detail::get_backend_version();
    } catch (const std::exception &ex) {
        g_why = std::string("cuDNN found but unusable: ") + ex.what();
        return false;
    }
    if (g_version < kMinVersion) {
        g_why = "cuDNN " + std::to_string(g_version) + " is older than 9.0 (flash attention needs it)";
        return false;
    }
    g_why = "";
    g_loaded = 1;
    return true;
}

/* The handle of the current device, made on first use; null when that fails. */
cudnnHandle_t handle_locked(int device) {
    if (device < 0 || device >= kMaxDevices) {
        g_why = "device " + std::to_string(device) + " is past the cuDNN handles kept";
        return nullptr;
    }
    if (!g_handle[device]) {
        cudnnHandle_t h = nullptr;
        cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
        try {
            st = fe::detail::create_handle(&h);
        } catch (const std::exception &ex) {
            g_why = std::string("cudnnCreate: ") + ex.what();
            return nullptr;
        }
        if (st != CUDNN_STATUS_SUCCESS) {
            g_why = "cudnnCreate failed with status " + std::to_string((int)st);
            return nullptr;
        }
        g_handle[device] = h;
    }
    return g_handle[device];
}

/* A (b, n, t, d) tensor over our token-major rows (B*T, n, D): b rows of t tokens; or, with a
 * ragged offset (off), b sequences of at most t tokens at off's element offsets (THD). */
std::shared_ptr<fe::graph::Tensor_attributes> rows_tensor(
    fe::graph::Graph &g, const char *name, int64_t uid, int64_t B, int64_t T, int64_t n, int64_t D,
    const std::shared_ptr<fe::graph::Tensor_attributes> &off = nullptr) {
    auto t = g.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({B, n, T, D})
                          .set_stride({T * n * D, D, n * D, 1}));
    if (off) t->set_ragged_offset(off);
    return t;
}
void rows_output(const std::shared_ptr<fe::graph::Tensor_attributes> &t, int64_t uid, int64_t B,
                 int64_t T, int64_t n, int64_t D,
                 const std::shared_ptr<fe::graph::Tensor_attributes> &off = nullptr) {
    t->set_output(true).set_uid(uid).set_dim({B, n, T, D}).set_stride({T * n * D, D, n * D, 1});
    if (off) t->set_ragged_offset(off);
}
/* Stats: our lse (B, H, T, 1) for the plain graph; token-major (S, H, s_max, 1) at the ragged
 * offsets st_off (THD) for the variable-length one. */
void stats_layout(fe::graph::Tensor_attributes &t, int64_t b, int64_t H, int64_t T,
                  const std::shared_ptr<fe::graph::Tensor_attributes> &st_off) {
    t.set_uid(kStats).set_dim({b, H, T, 1}).set_data_type(fe::DataType_t::FLOAT);
    if (st_off) t.set_stride({H * T, 1, H, 1}).set_ragged_offset(st_off);
    else t.set_stride({H * T, T, 1, 1});
}
/* A (n, 1, 1, 1) int tensor: sequence lengths or ragged offsets. */
std::shared_ptr<fe::graph::Tensor_attributes> index_tensor(fe::graph::Graph &g, const char *name,
                                                           int64_t uid, int64_t n,
                                                           fe::DataType_t type) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({n, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(type));
}
/* The SDPA graph of k, not yet built; for the device's architecture, or for sm_version (e.g. 90)
 * when not 0 (validation without a device). */
std::shared_ptr<fe::graph::Graph> make_graph(const plan_key &k, int sm_version) {
    const bool docs = k.S > 0;
    /* b "rows" of t tokens: the B rows, or the S sequences of at most s_max tokens */
    const int64_t b = docs ? k.S : k.B, t = docs ? k.s_max : k.T, H = k.H, G = k.G, D = k.D;
    float scale = 1.0f / sqrtf((float)k.D);
    if (k.scale_bits) memcpy(&scale, &k.scale_bits, sizeof scale);
    auto g = std::make_shared<fe::graph::Graph>();
    if (sm_version) g->set_sm_version(sm_version); /* before the nodes: they copy the context */
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    std::shared_ptr<fe::graph::Tensor_attributes> seq_q, seq_kv, q_off, kv_off, st_off;
    if (docs) {
        const fe::DataType_t ot = k.off64 ? fe::DataType_t::INT64 : fe::DataType_t::INT32;
        seq_q = index_tensor(*g, "seq_len_q", kSeqQ, b, fe::DataType_t::INT32);
        seq_kv = index_tensor(*g, "seq_len_kv", kSeqKV, b, fe::DataType_t::INT32);
        q_off = index_tensor(*g, "q_off", kQOff, b + 1, ot);
        kv_off = index_tensor(*g, "kv_off", kKVOff, b + 1, ot);
        st_off = index_tensor(*g, "stats_off", kStOff, b + 1, ot);
    }
    auto Q = rows_tensor(*g, "Q", kQ, b, t, H, D, q_off);
    auto K = rows_tensor(*g, "K", kK, b, t, G, D, kv_off);
    auto V = rows_tensor(*g, "V", kV, b, t, G, D, kv_off);
    if (!k.backward) {
        auto opts = fe::graph::SDPA_attributes()
                        .set_name("mt_attention_fwd")
                        .set_generate_stats(true)
                        .set_attn_scale(scale)
                        .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                        .set_diagonal_band_right_bound(0);
        /* cuDNN keeps key s for query t iff s + W > t: our window exactly */
        if (k.window > 0) opts.set_diagonal_band_left_bound(k.window);
        if (k.sinks)
            opts.set_sink_token(g->tensor(fe::graph::Tensor_attributes()
                                              .set_name("sink")
                                              .set_uid(kSink)
                                              .set_dim({1, H, 1, 1})
                                              .set_stride({H, 1, 1, 1})
                                              .set_data_type(fe::DataType_t::FLOAT)));
        if (docs) opts.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
        auto [O, Stats] = g->sdpa(Q, K, V, opts);
        rows_output(O, kO, b, t, H, D, q_off);
        Stats->set_output(true);
        stats_layout(*Stats, b, H, t, st_off);
    } else {
        auto O = rows_tensor(*g, "O", kO, b, t, H, D, q_off);
        auto dO = rows_tensor(*g, "dO", kDO, b, t, H, D, q_off);
        auto Stats = g->tensor(fe::graph::Tensor_attributes().set_name("Stats"));
        stats_layout(*Stats, b, H, t, st_off);
        auto opts = fe::graph::SDPA_backward_attributes()
                        .set_name("mt_attention_bwd")
                        .set_attn_scale(scale)
                        .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                        .set_diagonal_band_right_bound(0)
                        .set_deterministic_algorithm(false); /* dQ by atomics, as ours */
        if (k.window > 0) opts.set_diagonal_band_left_bound(k.window);
        if (docs) /* the workspace (fp32 dQ, GQA's full-head dK dV) sized by the tokens */
            opts.set_padding_mask(true)
                .set_seq_len_q(seq_q)
                .set_seq_len_kv(seq_kv)
                .set_max_total_seq_len_q((int64_t)k.B * k.T)
                .set_max_total_seq_len_kv((int64_t)k.B * k.T);
        auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opts);
        rows_output(dQ, kDQ, b, t, H, D, q_off);
        rows_output(dK, kDK, b, t, G, D, kv_off);
        rows_output(dV, kDV, b, t, G, D, kv_off);
    }
    return g;
}

/* The cached plan of k, built on first use; null graph when cuDNN cannot run it. */
plan &plan_locked(const plan_key &k, cudnnHandle_t h) {
    auto it = g_plans.find(k);
    if (it != g_plans.end()) return it->second;
    plan p;
    std::string why;
    try {
        p.graph = make_graph(k, 0);
        fe::error_t built = p.graph->build(h, {fe::HeurMode_t::A});
        fe::error_t err = built.is_good() ? p.graph->get_workspace_size(p.workspace) : built;
        if (err.is_bad()) {
            why = err.get_message();
            p.graph = nullptr;
        }
    } catch (const std::exception &ex) {
        p.graph = nullptr;
        why = ex.what();
    }
    if (!p.graph) {
        char docs[96] = "", opts[80] = "";
        if (k.S) snprintf(docs, sizeof docs, " as %d sequences of up to %d", k.S, k.s_max);
        if (k.scale_bits || k.window || k.sinks) {
            float scale;
            memcpy(&scale, &k.scale_bits, sizeof scale);
            snprintf(opts, sizeof opts, " scale=%g window=%d%s", k.scale_bits ? scale : 0.0f,
                     k.window, k.sinks ? " sinks" : "");
        }
        fprintf(stderr,
                "megatrain: cuDNN has no %s attention plan for B=%d T=%d H=%d G=%d D=%d%s%s (%s); "
                "using the built-in kernel for this shape\n",
                k.backward ? "backward" : "forward", k.B, k.T, k.H, k.G, k.D, opts, docs,
                why.empty() ? "no reason given" : why.c_str());
    }
    return g_plans.emplace(k, std::move(p)).first->second;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Whether this call goes to cuDNN by the choice in force, before asking cuDNN: rows without
 * documents (plain graph) or, unless MT_ATTENTION_DOCS=own, packed rows (variable-length graph,
 * which also needs D % 16 == 0: the frontend drops the token-sized backward workspace otherwise).
 * auto's short-row backward stays ours only where ours has tensor cores (D 64, 128): for any other
 * D ours is the fp32 fallback, 10-100x slower (Gemma 4's heads of 256 and 512, session 17). */
bool wanted(int backward, const int32_t *doc_start, int T, int D,
            std::initializer_list<const void *> ptrs) {
    mt_attention_impl impl = mt_cuda_attention_get_impl();
    if (impl == MT_ATTENTION_OWN || D % 8 != 0) return false;
    if (doc_start) {
        if (mt_cuda_attention_get_docs_impl() != MT_ATTENTION_CUDNN || D % 16 != 0) return false;
    } else if (impl == MT_ATTENTION_AUTO && backward && T < MT_CUDNN_BWD_MIN_T &&
               (D == 64 || D == 128 || !mt_cuda_attention_experimental())) {
        return false;
    }
    for (const void *p : ptrs)
        if (!aligned16(p)) return false;
    return true;
}

/* The noted documents holding rows doc_start .. doc_start + B*T, or null (with a note, once). */
const int32_t *find_noted_locked(const int32_t *doc_start, int B, int T, uint64_t *generation) {
    auto it = g_noted_docs.upper_bound(doc_start);
    if (it != g_noted_docs.begin()) {
        --it;
        const noted_docs &n = it->second;
        ptrdiff_t at = doc_start - it->first;
        if (n.T == T && at >= 0 && at % T == 0 && at / T + B <= n.B) {
            *generation = n.generation;
            return n.host.data() + at;
        }
    }
    return nullptr;
}

/* find_noted_locked, with a note (once) when there are none. */
const int32_t *noted_rows_locked(const int32_t *doc_start, int B, int T, uint64_t *generation) {
    const int32_t *rows = find_noted_locked(doc_start, B, T, generation);
    if (rows) return rows;
    if (!g_docs_unnoted_said)
        fprintf(stderr, "megatrain: packed rows whose document starts were not noted to the backend "
                        "(note_documents); their attention uses the built-in kernel\n");
    g_docs_unnoted_said = true;
    return nullptr;
}

/* MT_CUDNN_DOCS_BUCKETS=exact: graphs of exactly the documents (attention_docs.h). */
bool exact_shapes() {
    static const bool exact = [] {
        const char *e = getenv("MT_CUDNN_DOCS_BUCKETS");
        if (!e || !*e || strcmp(e, "pow2") == 0) return false;
        if (strcmp(e, "exact") == 0) return true;
        fprintf(stderr, "megatrain: MT_CUDNN_DOCS_BUCKETS=%s: expected pow2 or exact\n", e);
        exit(1);
    }();
    return exact;
}

/* The ragged batch of this call on the device, made (and uploaded on s) when the noted documents
 * changed since the last call of this shape; null when there is none. */
docs_layout *docs_layout_locked(const int32_t *doc_start, int B, int T, int H, int G, int D,
                                cudaStream_t s) {
    uint64_t generation = 0;
    const int32_t *rows = noted_rows_locked(doc_start, B, T, &generation);
    if (!rows) return nullptr;
    docs_layout &l = g_docs_layouts[docs_key{doc_start, B, T, H, G, D}];
    if (l.generation == generation) return &l;
    l.sh = exact_shapes() ? mt_attention_docs_shape_exact(rows, B, T)
                          : mt_attention_docs_shape_of(rows, B, T);
    if (l.sh.S < 0) return nullptr;
    const int S = l.sh.S;
    const int64_t N = (int64_t)B * T;
    l.off64 = N * H * D > INT32_MAX;
    const size_t ow = l.off64 ? 8 : 4, al = 16;
    auto up = [al](size_t x) { return (x + al - 1) / al * al; };
    const size_t seq_b = up((size_t)S * 4), off_b = up((size_t)(S + 1) * ow);
    const size_t bytes = seq_b + 3 * off_b;
    std::vector<int32_t> len(S);
    std::vector<int64_t> tok(S + 1);
    if (mt_attention_docs_layout(rows, B, T, S, len.data(), tok.data()) != l.sh.n) return nullptr;
    l.staging.assign(bytes, 0);
    unsigned char *h = l.staging.data();
    memcpy(h, len.data(), (size_t)S * 4);
    const int64_t mult[3] = {(int64_t)H * D, (int64_t)G * D, (int64_t)H}; /* q, kv, stats */
    for (int a = 0; a < 3; a++) {
        unsigned char *o = h + seq_b + a * off_b;
        for (int i = 0; i <= S; i++) {
            int64_t v = tok[i] * mult[a];
            if (l.off64) memcpy(o + 8 * (size_t)i, &v, 8);
            else {
                int32_t v32 = (int32_t)v;
                memcpy(o + 4 * (size_t)i, &v32, 4);
            }
        }
    }
    if (l.capacity < bytes) { /* stream-ordered: calls before this one still read the old one */
        if (l.dev) CUDA_CHECK(cudaFreeAsync(l.dev, s));
        CUDA_CHECK(cudaMallocAsync(&l.dev, bytes, s));
        l.capacity = bytes;
    }
    /* from pageable memory: staged before the call returns, then ordered on s after the calls
     * that read the previous contents */
    CUDA_CHECK(cudaMemcpyAsync(l.dev, h, bytes, cudaMemcpyHostToDevice, s));
    unsigned char *d = (unsigned char *)l.dev;
    l.seq = d, l.q_off = d + seq_b, l.kv_off = d + seq_b + off_b, l.st_off = d + seq_b + 2 * off_b;
    l.generation = generation;
    return &l;
}

/* lse (B, H, T) <-> token-major stats (B*T, H), one (H, T) <-> (T, H) matrix per row, through
 * 32 x 32 tiles of shared memory. to_tokens: lse -> stats; else stats -> lse. */
__global__ void lse_transpose_kernel(float *dst, const float *src, int T, int H, int to_tokens) {
    __shared__ float tile[32][33];
    const int b = blockIdx.z;
    const int r0 = blockIdx.y * 32, c0 = blockIdx.x * 32; /* over the source's (rows, cols) */
    const int rows = to_tokens ? H : T, cols = to_tokens ? T : H;
    const float *in = src + (size_t)b * T * H;
    float *out = dst + (size_t)b * T * H;
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        int r = r0 + i, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[i][threadIdx.x] = in[(size_t)r * cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        int c = c0 + i, r = r0 + threadIdx.x; /* out is (cols, rows) */
        if (r < rows && c < cols) out[(size_t)c * rows + r] = tile[threadIdx.x][i];
    }
}

void lse_transpose(float *dst, const float *src, int B, int T, int H, int to_tokens,
                   cudaStream_t s) {
    const int rows = to_tokens ? H : T, cols = to_tokens ? T : H;
    dim3 grid((unsigned)((cols + 31) / 32), (unsigned)((rows + 31) / 32), (unsigned)B);
    lse_transpose_kernel<<<grid, dim3(32, 8), 0, s>>>(dst, src, T, H, to_tokens);
    CUDA_LAUNCH_CHECK();
}

/* Loads cuDNN and returns the cached plan for k on the current device, or null. Locked. */
plan *usable_plan_locked(plan_key &k, cudnnHandle_t *h) {
    if (load_locked()) {
        if (cudaGetDevice(&k.device) != cudaSuccess) g_why = "cudaGetDevice failed";
        else *h = handle_locked(k.device);
    }
    if (!*h) {
        if (!g_noted)
            fprintf(stderr, "megatrain: %s; attention uses the built-in kernel\n", g_why.c_str());
        g_noted = true;
        g_loaded = -1; /* no handle: not usable in this process */
        return nullptr;
    }
    plan &p = plan_locked(k, *h);
    return p.graph ? &p : nullptr;
}

/* Runs p on s with its workspace from the stream-ordered pool; false (after a note) when cuDNN
 * refused at execution, and then the plan is dropped for good. */
bool run_locked(plan &p, const plan_key &k, cudnnHandle_t h,
                std::unordered_map<fe::graph::Tensor_attributes::uid_t, void *> &pack,
                cudaStream_t s) {
    void *ws = nullptr;
    if (p.workspace > 0) CUDA_CHECK(cudaMallocAsync(&ws, (size_t)p.workspace, s));
    std::string why;
    try {
        if (fe::detail::set_stream(h, s) != CUDNN_STATUS_SUCCESS) {
            why = "cudnnSetStream failed";
        } else {
            fe::error_t err = p.graph->execute(h, pack, ws);
            if (err.is_bad()) why = err.get_message();
        }
    } catch (const std::exception &ex) {
        why = ex.what();
    }
    if (ws) CUDA_CHECK(cudaFreeAsync(ws, s));
    if (why.empty()) {
        g_last_workspace[k.backward] = p.workspace;
        return true;
    }
    fprintf(stderr,
            "megatrain: cuDNN %s attention failed for B=%d T=%d H=%d G=%d D=%d (%s); using the "
            "built-in kernel for this shape from now on\n",
            k.backward ? "backward" : "forward", k.B, k.T, k.H, k.G, k.D, why.c_str());
    p.graph = nullptr;
    return false;
}

} // namespace

extern "C" int mt_cuda_cudnn_status(const char **why, long *version) {
    std::lock_guard<std::mutex> lock(g_mu);
    bool ok = load_locked();
    int device = 0;
    if (ok && cudaGetDevice(&device) == cudaSuccess && !handle_locked(device)) { /* no GPU: no handle */
        g_loaded = -1;
        ok = false;
    }
    cudaGetLastError(); /* cudaGetDevice's error, when there is no device, is not sticky: clear it */
    if (why) *why = g_why.c_str();
    if (version) *version = ok ? g_version : 0;
    return ok ? 1 : 0;
}

extern "C" long long mt_cuda_attention_cudnn_workspace(int backward, int B, int T, int H, int G,
                                                       int D) {
    std::lock_guard<std::mutex> lock(g_mu);
    plan_key k = {backward ? 1 : 0, 0, B, T, H, G, D};
    if (cudaGetDevice(&k.device) != cudaSuccess) return -1;
    auto it = g_plans.find(k);
    return it != g_plans.end() && it->second.graph ? (long long)it->second.workspace : -1;
}

/* The graph of key k validated (no plan built): 1 valid, 0 not (why says it), -1 no cuDNN. */
static int validate_key(const plan_key &k, int sm_version, char *why, size_t why_size) {
    std::lock_guard<std::mutex> lock(g_mu);
    std::string msg;
    int ok = -1;
    if (!load_locked()) {
        msg = g_why;
    } else {
        try {
            fe::error_t err = make_graph(k, sm_version)->validate();
            ok = err.is_good() ? 1 : 0;
            msg = err.get_message();
        } catch (const std::exception &ex) {
            ok = 0;
            msg = ex.what();
        }
    }
    if (why && why_size) snprintf(why, why_size, "%s", msg.c_str());
    return ok;
}

extern "C" int mt_cuda_attention_cudnn_validate(int backward, int B, int T, int H, int G, int D,
                                                int sm_version, char *why, size_t why_size) {
    plan_key k = {backward ? 1 : 0, 0, B, T, H, G, D};
    return validate_key(k, sm_version, why, why_size);
}

extern "C" int mt_cuda_attention_cudnn_validate_opts(int backward, int B, int T, int H, int G,
                                                     int D, float scale, int window, int sinks,
                                                     int sm_version, char *why, size_t why_size) {
    plan_key k = {backward ? 1 : 0, 0, B, T, H, G, D};
    set_key_options(scale, window, T, &k);
    k.sinks = sinks && !backward;
    return validate_key(k, sm_version, why, why_size);
}

extern "C" int mt_cuda_attention_cudnn_plan_count(void) {
    std::lock_guard<std::mutex> lock(g_mu);
    return (int)g_plans.size();
}

extern "C" long long mt_cuda_attention_cudnn_last_workspace(int backward) {
    std::lock_guard<std::mutex> lock(g_mu);
    return g_last_workspace[backward ? 1 : 0];
}

extern "C" int mt_cuda_attention_cudnn_validate_docs_opts(int backward, int S, int s_max, int B, int T,
                                                          int H, int G, int D, float scale, int window,
                                                          int sinks, int sm_version, char *why,
                                                          size_t why_size) {
    plan_key k = {backward ? 1 : 0, 0, B, T, H, G, D};
    k.S = S, k.s_max = s_max, k.off64 = (int64_t)B * T * H * D > INT32_MAX;
    set_key_options(scale, window, T, &k);
    k.sinks = sinks && !backward;
    return validate_key(k, sm_version, why, why_size);
}

extern "C" int mt_cuda_attention_cudnn_validate_docs(int backward, int S, int s_max, int B, int T,
                                                     int H, int G, int D, int sm_version,
                                                     char *why, size_t why_size) {
    return mt_cuda_attention_cudnn_validate_docs_opts(backward, S, s_max, B, T, H, G, D, 0, 0, 0,
                                                      sm_version, why, why_size);
}

extern "C" void mt_cuda_attention_note_documents(const int32_t *doc_start,
                                                 const int32_t *host_doc_start, int B, int T) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!host_doc_start) {
        g_noted_docs.erase(doc_start);
        return;
    }
    noted_docs &n = g_noted_docs[doc_start];
    n.B = B, n.T = T;
    n.host.assign(host_doc_start, host_doc_start + (size_t)B * T);
    n.generation = ++g_docs_generation;
}

extern "C" void mt_cuda_attention_forget_documents(const void *p) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_noted_docs.erase((const int32_t *)p);
}

extern "C" const int32_t *mt_cuda_attention_noted_rows(const int32_t *doc_start, int B, int T) {
    std::lock_guard<std::mutex> lock(g_mu);
    uint64_t generation = 0;
    return find_noted_locked(doc_start, B, T, &generation);
}

namespace {

/* The variable-length plan of this call (its layout in *lay), or null: then the caller runs the
 * plain graph when every row is one document (*plain), or our kernels. Locked. */
plan *docs_plan_locked(const int32_t *doc_start, int B, int T, int H, int G, int D,
                       cudaStream_t s, plan_key *key, cudnnHandle_t *h, docs_layout **lay,
                       bool *plain) { /* key: the plain graph's, options included */
    *plain = false;
    docs_layout *l = docs_layout_locked(doc_start, B, T, H, G, D, s);
    if (!l) return nullptr;
    if (l->sh.n == B) { /* one document a row: the plain graph, no padding */
        *plain = true;
        return nullptr;
    }
    key->S = l->sh.S, key->s_max = l->sh.s_max, key->off64 = l->off64;
    *lay = l;
    return usable_plan_locked(*key, h);
}

} // namespace

bool mt_cuda_attention_cudnn_forward(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                     const bf16 *v, const int32_t *doc_start, int B, int T, int H,
                                     int G, int D, const mt_attention_opts *opts, cudaStream_t s) {
    g_last[0] = MT_ATTENTION_OWN;
    g_last_docs[0] = {0, 0, 0};
    plan_key key = {0, 0, B, T, H, G, D};
    if (!key_options(opts, T, &key)) return false;
    if (!wanted(0, doc_start, T, D, {out, lse, q, k, v})) return false;
    std::lock_guard<std::mutex> lock(g_mu);
    cudnnHandle_t h = nullptr;
    docs_layout *lay = nullptr;
    bool plain = !doc_start;
    plan *p = plain ? usable_plan_locked(key, &h)
                    : docs_plan_locked(doc_start, B, T, H, G, D, s, &key, &h, &lay, &plain);
    if (!p && plain && doc_start) p = usable_plan_locked(key, &h);
    if (!p) return false;
    std::unordered_map<fe::graph::Tensor_attributes::uid_t, void *> pack = {
        {kQ, (void *)q}, {kK, (void *)k}, {kV, (void *)v}, {kO, out}, {kStats, lse}};
    float *stats = nullptr;
    if (lay) { /* cuDNN's token-major stats in a temporary, moved to lse after */
        CUDA_CHECK(cudaMallocAsync((void **)&stats, (size_t)B * T * H * sizeof(float), s));
        pack[kStats] = stats;
        pack[kSeqQ] = lay->seq, pack[kSeqKV] = lay->seq;
        pack[kQOff] = lay->q_off, pack[kKVOff] = lay->kv_off, pack[kStOff] = lay->st_off;
    }
    float *sinks = nullptr;
    if (key.sinks) {
        CUDA_CHECK(cudaMallocAsync((void **)&sinks, (size_t)H * sizeof(float), s));
        sinks_to_f32_kernel<<<(H + 127) / 128, 128, 0, s>>>(sinks, (const bf16 *)opts->sinks, H);
        CUDA_LAUNCH_CHECK();
        pack[kSink] = sinks;
    }
    bool ran = run_locked(*p, key, h, pack, s);
    if (sinks) CUDA_CHECK(cudaFreeAsync(sinks, s));
    if (stats) {
        if (ran) lse_transpose(lse, stats, B, T, H, 0, s);
        CUDA_CHECK(cudaFreeAsync(stats, s));
    }
    if (!ran) return false;
    g_last[0] = MT_ATTENTION_CUDNN;
    if (lay) g_last_docs[0] = {lay->sh.n, lay->sh.S, lay->sh.s_max};
    return true;
}

bool mt_cuda_attention_cudnn_backward(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout,
                                      const bf16 *out, const float *lse, const bf16 *q,
                                      const bf16 *k, const bf16 *v, const int32_t *doc_start,
                                      int B, int T, int H, int G, int D,
                                      const mt_attention_opts *opts, cudaStream_t s) {
    g_last[1] = MT_ATTENTION_OWN;
    g_last_docs[1] = {0, 0, 0};
    plan_key key = {1, 0, B, T, H, G, D};
    if (!key_options(opts, T, &key)) return false;
    if (!wanted(1, doc_start, T, D, {dq, dk, dv, dout, out, lse, q, k, v})) return false;
    std::lock_guard<std::mutex> lock(g_mu);
    cudnnHandle_t h = nullptr;
    docs_layout *lay = nullptr;
    bool plain = !doc_start;
    plan *p = plain ? usable_plan_locked(key, &h)
                    : docs_plan_locked(doc_start, B, T, H, G, D, s, &key, &h, &lay, &plain);
    if (!p && plain && doc_start) p = usable_plan_locked(key, &h);
    if (!p) return false;
    std::unordered_map<fe::graph::Tensor_attributes::uid_t, void *> pack = {
        {kQ, (void *)q},     {kK, (void *)k},     {kV, (void *)v},
        {kO, (void *)out},   {kDO, (void *)dout}, {kStats, (void *)lse},
        {kDQ, dq},           {kDK, dk},           {kDV, dv}};
    float *stats = nullptr;
    if (lay) { /* our lse as cuDNN's token-major stats, in a temporary */
        CUDA_CHECK(cudaMallocAsync((void **)&stats, (size_t)B * T * H * sizeof(float), s));
        lse_transpose(stats, lse, B, T, H, 1, s);
        pack[kStats] = stats;
        pack[kSeqQ] = lay->seq, pack[kSeqKV] = lay->seq;
        pack[kQOff] = lay->q_off, pack[kKVOff] = lay->kv_off, pack[kStOff] = lay->st_off;
    }
    bool ran = run_locked(*p, key, h, pack, s);
    if (stats) CUDA_CHECK(cudaFreeAsync(stats, s));
    if (!ran) return false;
    g_last[1] = MT_ATTENTION_CUDNN;
    if (lay) g_last_docs[1] = {lay->sh.n, lay->sh.S, lay->sh.s_max};
    return true;
}

#else /* built without cuDNN: every call runs our kernels */

extern "C" int mt_cuda_cudnn_status(const char **why, long *version) {
    if (why) *why = "built without cuDNN (no cudnn.h or no third_party/cudnn-frontend when it was "
                    "configured; run scripts/cudnn-frontend.sh and configure again)";
    if (version) *version = 0;
    return 0;
}

extern "C" long long mt_cuda_attention_cudnn_workspace(int, int, int, int, int, int) { return -1; }

extern "C" long long mt_cuda_attention_cudnn_last_workspace(int) { return -1; }

extern "C" int mt_cuda_attention_cudnn_plan_count(void) { return 0; }

extern "C" int mt_cuda_attention_cudnn_validate_opts(int, int, int, int, int, int, float, int, int,
                                                     int, char *why, size_t why_size) {
    if (why && why_size) snprintf(why, why_size, "built without cuDNN");
    return -1;
}

extern "C" int mt_cuda_attention_cudnn_validate_docs(int, int, int, int, int, int, int, int, int,
                                                     char *why, size_t why_size) {
    if (why && why_size) snprintf(why, why_size, "built without cuDNN");
    return -1;
}
extern "C" int mt_cuda_attention_cudnn_validate_docs_opts(int, int, int, int, int, int, int, int, float,
                                                          int, int, int, char *why, size_t why_size) {
    if (why && why_size) snprintf(why, why_size, "built without cuDNN");
    return -1;
}

extern "C" void mt_cuda_attention_note_documents(const int32_t *, const int32_t *, int, int) {}

extern "C" void mt_cuda_attention_forget_documents(const void *) {}

extern "C" const int32_t *mt_cuda_attention_noted_rows(const int32_t *, int, int) { return NULL; }

extern "C" int mt_cuda_attention_cudnn_validate(int, int, int, int, int, int, int, char *why,
                                                size_t why_size) {
    if (why && why_size) snprintf(why, why_size, "built without cuDNN");
    return -1;
}

bool mt_cuda_attention_cudnn_forward(bf16 *, float *, const bf16 *, const bf16 *, const bf16 *,
                                     const int32_t *, int, int, int, int, int,
                                     const mt_attention_opts *, cudaStream_t) {
    static bool noted = false;
    g_last_docs[0] = {0, 0, 0};
    if (mt_cuda_attention_get_impl() == MT_ATTENTION_CUDNN && !noted) {
        fprintf(stderr, "megatrain: MT_ATTENTION=cudnn, but this build has no cuDNN; attention uses "
                        "the built-in kernel\n");
        noted = true;
    }
    g_last[0] = MT_ATTENTION_OWN;
    return false;
}

bool mt_cuda_attention_cudnn_backward(bf16 *, bf16 *, bf16 *, const bf16 *, const bf16 *,
                                      const float *, const bf16 *, const bf16 *, const bf16 *,
                                      const int32_t *, int, int, int, int, int,
                                      const mt_attention_opts *, cudaStream_t) {
    g_last[1] = MT_ATTENTION_OWN;
    g_last_docs[1] = {0, 0, 0};
    return false;
}

#endif
