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
 * band with right bound 0 (key s visible to query t iff s <= t). Scale 1/sqrt(D) in fp32.
 * Softmax statistics: cuDNN's Stats is max + ln(sum exp) of the scaled scores, natural log, fp32,
 * dims (B, H, T, 1) with strides (H*T, T, 1, 1): exactly our lse (B, H, T). So cuDNN writes our
 * lse buffer and its backward reads it, and either forward can feed either backward.
 *
 * Documents packed in a row (doc_start) go to our kernels: cuDNN expresses documents only as a
 * ragged batch (one batch entry per document, offsets and lengths per entry), whose batch count
 * and longest length the graph must know when it is built, while we get doc_start as a device
 * array on the stream; reading it back would stall the schedule at every layer.
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
mt_attention_impl g_last[2] = {MT_ATTENTION_AUTO, MT_ATTENTION_AUTO};

mt_attention_impl impl_from_env() {
    const char *e = getenv("MT_ATTENTION");
    if (!e || !*e || strcmp(e, "auto") == 0) return MT_ATTENTION_AUTO; /* the default: see the header */
    if (strcmp(e, "own") == 0) return MT_ATTENTION_OWN;
    if (strcmp(e, "cudnn") == 0) return MT_ATTENTION_CUDNN;
    fprintf(stderr, "megatrain: MT_ATTENTION=%s: expected own, cudnn or auto\n", e);
    exit(1);
}

} // namespace

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

namespace fe = cudnn_frontend;

/* The frontend's dynamic loading resolves every cuDNN symbol in this handle. */
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

namespace {

constexpr long kMinVersion = 90000; /* bf16 causal GQA SDPA forward and backward on Hopper */
constexpr int kMaxDevices = 64;

enum : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct plan_key {
    int backward, device, B, T, H, G, D;
    bool operator<(const plan_key &o) const {
        return std::tie(backward, device, B, T, H, G, D) <
               std::tie(o.backward, o.device, o.B, o.T, o.H, o.G, o.D);
    }
};

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

/* A (b, n, t, d) tensor over our token-major rows (B*T, n, D). */
std::shared_ptr<fe::graph::Tensor_attributes> rows_tensor(fe::graph::Graph &g, const char *name,
                                                          int64_t uid, int64_t B, int64_t T,
                                                          int64_t n, int64_t D) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({B, n, T, D})
                        .set_stride({T * n * D, D, n * D, 1}));
}
void rows_output(const std::shared_ptr<fe::graph::Tensor_attributes> &t, int64_t uid, int64_t B,
                 int64_t T, int64_t n, int64_t D) {
    t->set_output(true).set_uid(uid).set_dim({B, n, T, D}).set_stride({T * n * D, D, n * D, 1});
}
/* The SDPA graph of k, not yet built; for the device's architecture, or for sm_version (e.g. 90)
 * when not 0 (validation without a device). */
std::shared_ptr<fe::graph::Graph> make_graph(const plan_key &k, int sm_version) {
    const int64_t B = k.B, T = k.T, H = k.H, G = k.G, D = k.D;
    const float scale = 1.0f / sqrtf((float)k.D);
    auto g = std::make_shared<fe::graph::Graph>();
    if (sm_version) g->set_sm_version(sm_version); /* before the nodes: they copy the context */
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto Q = rows_tensor(*g, "Q", kQ, B, T, H, D);
    auto K = rows_tensor(*g, "K", kK, B, T, G, D);
    auto V = rows_tensor(*g, "V", kV, B, T, G, D);
    if (!k.backward) {
        auto opts = fe::graph::SDPA_attributes()
                        .set_name("mt_attention_fwd")
                        .set_generate_stats(true)
                        .set_attn_scale(scale)
                        .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                        .set_diagonal_band_right_bound(0);
        auto [O, Stats] = g->sdpa(Q, K, V, opts);
        rows_output(O, kO, B, T, H, D);
        Stats->set_output(true)
            .set_uid(kStats)
            .set_dim({B, H, T, 1})
            .set_stride({H * T, T, 1, 1})
            .set_data_type(fe::DataType_t::FLOAT);
    } else {
        auto O = rows_tensor(*g, "O", kO, B, T, H, D);
        auto dO = rows_tensor(*g, "dO", kDO, B, T, H, D);
        auto Stats = g->tensor(fe::graph::Tensor_attributes()
                                   .set_name("Stats")
                                   .set_uid(kStats)
                                   .set_dim({B, H, T, 1})
                                   .set_stride({H * T, T, 1, 1})
                                   .set_data_type(fe::DataType_t::FLOAT));
        auto opts = fe::graph::SDPA_backward_attributes()
                        .set_name("mt_attention_bwd")
                        .set_attn_scale(scale)
                        .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                        .set_diagonal_band_right_bound(0)
                        .set_deterministic_algorithm(false); /* dQ by atomics, as ours */
        auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opts);
        rows_output(dQ, kDQ, B, T, H, D);
        rows_output(dK, kDK, B, T, G, D);
        rows_output(dV, kDV, B, T, G, D);
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
    if (!p.graph)
        fprintf(stderr,
                "megatrain: cuDNN has no %s attention plan for B=%d T=%d H=%d G=%d D=%d (%s); "
                "using the built-in kernel for this shape\n",
                k.backward ? "backward" : "forward", k.B, k.T, k.H, k.G, k.D,
                why.empty() ? "no reason given" : why.c_str());
    return g_plans.emplace(k, std::move(p)).first->second;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Whether this call goes to cuDNN by the choice in force, before asking cuDNN. */
bool wanted(int backward, const int32_t *doc_start, int T, int D,
            std::initializer_list<const void *> ptrs) {
    mt_attention_impl impl = mt_cuda_attention_get_impl();
    if (impl == MT_ATTENTION_OWN || doc_start || D % 8 != 0) return false;
    if (impl == MT_ATTENTION_AUTO && backward && T < MT_CUDNN_BWD_MIN_T) return false;
    for (const void *p : ptrs)
        if (!aligned16(p)) return false;
    return true;
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
    if (why.empty()) return true;
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

extern "C" int mt_cuda_attention_cudnn_validate(int backward, int B, int T, int H, int G, int D,
                                                int sm_version, char *why, size_t why_size) {
    std::lock_guard<std::mutex> lock(g_mu);
    std::string msg;
    int ok = -1;
    if (!load_locked()) {
        msg = g_why;
    } else {
        try {
            plan_key k = {backward ? 1 : 0, 0, B, T, H, G, D};
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

bool mt_cuda_attention_cudnn_forward(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                     const bf16 *v, const int32_t *doc_start, int B, int T, int H,
                                     int G, int D, cudaStream_t s) {
    g_last[0] = MT_ATTENTION_OWN;
    if (!wanted(0, doc_start, T, D, {out, lse, q, k, v})) return false;
    std::lock_guard<std::mutex> lock(g_mu);
    plan_key key = {0, 0, B, T, H, G, D};
    cudnnHandle_t h = nullptr;
    plan *p = usable_plan_locked(key, &h);
    if (!p) return false;
    std::unordered_map<fe::graph::Tensor_attributes::uid_t, void *> pack = {
        {kQ, (void *)q}, {kK, (void *)k}, {kV, (void *)v}, {kO, out}, {kStats, lse}};
    if (!run_locked(*p, key, h, pack, s)) return false;
    g_last[0] = MT_ATTENTION_CUDNN;
    return true;
}

bool mt_cuda_attention_cudnn_backward(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout,
                                      const bf16 *out, const float *lse, const bf16 *q,
                                      const bf16 *k, const bf16 *v, const int32_t *doc_start,
                                      int B, int T, int H, int G, int D, cudaStream_t s) {
    g_last[1] = MT_ATTENTION_OWN;
    if (!wanted(1, doc_start, T, D, {dq, dk, dv, dout, out, lse, q, k, v})) return false;
    std::lock_guard<std::mutex> lock(g_mu);
    plan_key key = {1, 0, B, T, H, G, D};
    cudnnHandle_t h = nullptr;
    plan *p = usable_plan_locked(key, &h);
    if (!p) return false;
    std::unordered_map<fe::graph::Tensor_attributes::uid_t, void *> pack = {
        {kQ, (void *)q},     {kK, (void *)k},     {kV, (void *)v},
        {kO, (void *)out},   {kDO, (void *)dout}, {kStats, (void *)lse},
        {kDQ, dq},           {kDK, dk},           {kDV, dv}};
    if (!run_locked(*p, key, h, pack, s)) return false;
    g_last[1] = MT_ATTENTION_CUDNN;
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

extern "C" int mt_cuda_attention_cudnn_validate(int, int, int, int, int, int, int, char *why,
                                                size_t why_size) {
    if (why && why_size) snprintf(why, why_size, "built without cuDNN");
    return -1;
}

bool mt_cuda_attention_cudnn_forward(bf16 *, float *, const bf16 *, const bf16 *, const bf16 *,
                                     const int32_t *, int, int, int, int, int, cudaStream_t) {
    static bool noted = false;
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
                                      const int32_t *, int, int, int, int, int, cudaStream_t) {
    g_last[1] = MT_ATTENTION_OWN;
    return false;
}

#endif
