/* The planner's step-time estimate (engine/step_time.h) and what --gpu-layers auto does with it
 * (issue 10), the FLOPs of MoE layers on active parameters and what `plan` prints of the time per
 * piece (issue 14), each against hand arithmetic.
 *
 * The Qwen2.5-7B shape at 16 x 4096 (N = 65536 tokens), bf16, on the cuda backend's rates (600
 * TFLOP/s, PCIe 55.2 GB/s up, 55.3 down, 46.2 each way at once). By hand:
 *   layer 233,057,792 params; embed 152064 x 3584 = 544,997,376; head that + the final norm 3584.
 *   U = layer / rate, U_h = head / rate: its host update; P = 2 layer / 55.2e9, P_h = 2 head /
 *   55.2e9: its upload. F = (2N (2 C HD + 2 C GD + 3 C F) + 4 N (T/2) H D) / 600e12
 *     = (2 x 65536 x 233,046,016 + 65536 x 4 x 2048 x 28 x 128) / 6e14 = 54.1 ms a layer;
 *   the head's forward F_h = 2 N C V / 6e14 = 119.1 ms; the forward L F + F_h = 1.634 s.
 * The next forward starts s = U_e + U after the backward (the host has updated the embed and the
 * first streamed layer), then computes the k tier layers; the host updates layer k + i by
 * s + i U. When U > F (the host is slower per layer) the head is what the forward waits for: it
 * is updated at s + (L - k - 1) U + U_h and loaded P_h later, while the forward with an instant
 * host reaches it at s + L F (+ P with no tier: the first layer's upload is not hidden), so
 *   wait(k) = max(0, (L - k - 1) U + U_h + P_h - L F - [k = 0] P);
 * when U < F the layers keep the forward busy and the same holds with (L - 1) U for k = 0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/flops.h"
#include "engine/planner.h"
#include "engine/step_time.h"
#include "optim/state.h"
#include "model/config.h"
#include "model/params.h"
#include "util/testutil.h"

#define OUT_SIZE 65536
#define GIB 1073741824.0

static mt_cli_env env;

static int setup(void **state) {
    *state = &env; /* for mt_cli_env_teardown */
    return mt_cli_env_init(&env, "train_llama");
}

static void load(mt_param_table *t, const char *rel) {
    char *path = mt_fixture_path(rel);
    mt_config cfg;
    if (mt_config_load(&cfg, path) != MT_OK) fail_msg("%s", mt_error_message());
    free(path);
    mt_param_table_init(t, &cfg);
}

static mt_backend planned_gpu(double budget) {
    return (mt_backend){.name = "cuda", .dtype = MT_BF16, .mem_budget = (int64_t)budget,
                        .memory = mt_backend_cuda_memory()};
}

static mt_plan_request h200_request(mt_state_format f, double host_rate) {
    return (mt_plan_request){.batch = 16, .T = 4096, .micro_batch = MT_AUTO, .offload = MT_AUTO,
                             .saved_layers = MT_AUTO, .resident = MT_AUTO, .n_slots = 2,
                             .host_available = 125.0 * GIB, .state = f, .gpu_layers = MT_AUTO,
                             .host_adamw = host_rate};
}

/* The 7B's hand numbers (the header) at host AdamW `rate`. */
typedef struct {
    double U, U_h, P, P_h, F, F_h, L;
} hand7b;

static hand7b hand_7b(double rate) {
    const double layer = 233057792.0, head = 544997376.0 + 3584, N = 65536;
    hand7b h = {.L = 28};
    h.U = layer / rate;
    h.U_h = head / rate;
    h.P = 2 * layer / 55.2e9;
    h.P_h = 2 * head / 55.2e9;
    h.F = (2 * N * 233046016.0 + N * 4 * 2048 * 28 * 128) / 6e14;
    h.F_h = 2 * N * 3584 * 152064.0 / 6e14;
    return h;
}

static double hand_wait(const hand7b *h, int k) {
    double w = (h->L - k - 1) * h->U + h->U_h + h->P_h - h->L * h->F - (k == 0 ? h->P : 0);
    return w > 0 ? w : 0;
}

static mt_engine_opts opts_7b(mt_state_format f, int k) {
    return (mt_engine_opts){.batch = 16, .micro_batch = 16, .T = 4096, .n_slots = 2, .state = f,
                            .gpu_layers = k};
}

/* The forward's wait for the host, as simulated, against the closed form of the header: compact
 * at 3.8 Gparam/s (the measured median in training) waits 0.30 s with no tier, and 5 tier layers
 * are the fewest that bring it under 3% of the forward (4 leave 58 ms of 49). */
static void test_wait_by_hand(void **state) {
    (void)state;
    mt_param_table t;
    load(&t, "../../bench/configs/qwen2.5-7b.json");
    assert_true(t.layer_size == 233057792 && mt_group_size(&t, 28) == 544997376 + 3584);
    mt_backend_memory m = mt_backend_cuda_memory();
    hand7b h = hand_7b(3.8e9);
    for (int k = 0; k <= 8; k++) {
        mt_engine_opts o = opts_7b(MT_STATE_COMPACT, k);
        mt_step_time st;
        mt_step_time_of(&t, MT_BF16, &o, &m, 3.8e9, &st);
        double want = hand_wait(&h, k);
        fprintf(stderr, "7B compact, %d tier layers: wait %.4f s (by hand %.4f), start %.4f, forward %.4f\n",
                k, st.wait_s, want, st.start_s, st.forward_s);
        assert_true(fabs(st.wait_s - want) < 1e-9);
        assert_true(fabs(st.start_s - (544997376.0 + 233057792.0) / 3.8e9) < 1e-12);
        assert_true(fabs(st.forward_s - (h.L * h.F + h.F_h)) < 1e-9);
        assert_int_equal(mt_step_time_waits(&st), want > 0.03 * (h.L * h.F + h.F_h));
    }
    assert_true(hand_wait(&h, 0) > 0.29 && hand_wait(&h, 0) < 0.30);
    assert_true(hand_wait(&h, 4) > 0.049 && hand_wait(&h, 5) == 0);
    /* full at 4.5 Gparam/s: U = 51.8 ms < F, the layers keep the forward busy; the head's update
     * arrives 15.6 ms after the forward's layers, under 3% of it */
    hand7b f = hand_7b(4.5e9);
    mt_engine_opts o = opts_7b(MT_STATE_FULL, 0);
    mt_step_time st;
    mt_step_time_of(&t, MT_BF16, &o, &m, 4.5e9, &st);
    double want = (f.L - 1) * f.U + f.U_h + f.P_h - f.P - f.L * f.F;
    fprintf(stderr, "7B full, no tier: wait %.4f s (by hand %.4f)\n", st.wait_s, want);
    assert_true(fabs(st.wait_s - want) < 1e-9);
    assert_false(mt_step_time_waits(&st));
    mt_param_table_free(&t);
}

/* --gpu-layers auto on the H200 (139 GiB, 125 GiB host): compact at 3.8 Gparam/s takes the 5 layers
 * the closed form says (the host needs none), and prints why; full at 4.5 keeps up and takes none.
 * Fails on the old planner, whose auto took the fewest the host RAM needed: 0 for both. */
static void test_auto_tier_for_speed(void **state) {
    (void)state;
    mt_param_table t;
    load(&t, "../../bench/configs/qwen2.5-7b.json");
    mt_backend be = planned_gpu(139.0 * GIB);
    mt_plan_request rq = h200_request(MT_STATE_COMPACT, 3.8e9);
    mt_plan p;
    assert_int_equal(mt_plan_resolve(&t, &be, &rq, &p), MT_OK);
    assert_int_equal(mt_plan_check(&p), MT_OK);
    fprintf(stderr, "7B compact auto: %d tier layers (host needs %d), wait %.3f s, saved %d\n",
            p.eo.gpu_layers, p.tier_host, p.time.wait_s, p.eo.saved_layers);
    assert_int_equal(p.tier_host, 0);
    assert_int_equal(p.eo.gpu_layers, 5);
    assert_false(p.tier_capped);
    assert_int_equal(p.time.bound, MT_BOUND_COMPUTE);
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    mt_plan_print(&p, out);
    fclose(out);
    fprintf(stderr, "%s", buf);
    assert_non_null(strstr(buf, "gpu tier:    5 layers (6.55 GiB): with none the host update (2.00 s) "
                                "would hold the next forward (1.63 s) back 0.30 s; with 5 the host "
                                "starts 5 layers ahead"));
    free(buf);

    rq = h200_request(MT_STATE_FULL, 4.5e9);
    assert_int_equal(mt_plan_resolve(&t, &be, &rq, &p), MT_OK);
    assert_int_equal(mt_plan_check(&p), MT_OK);
    assert_int_equal(p.eo.gpu_layers, 0);
    assert_int_equal(p.time.bound, MT_BOUND_COMPUTE);
    mt_param_table_free(&t);
}

/* A host slow enough (1 Gparam/s: 23 tier layers would stop the wait) in 80 GiB of GPU memory:
 * auto takes the most that fit beside the plan of step 1 (15; one more does not fit with the
 * pool's headroom kept), the plan fits, and the step is bound by the host update. An explicit
 * --gpu-layers still wins, as does --gpu-layers 0; on the cpu backend no tier and no estimate. */
static void test_capped_explicit_cpu(void **state) {
    (void)state;
    mt_param_table t;
    load(&t, "../../bench/configs/qwen2.5-7b.json");
    mt_backend be = planned_gpu(80.0 * GIB);
    mt_plan_request rq = h200_request(MT_STATE_COMPACT, 1e9);
    mt_plan p;
    assert_int_equal(mt_plan_resolve(&t, &be, &rq, &p), MT_OK);
    assert_int_equal(mt_plan_check(&p), MT_OK);
    fprintf(stderr, "7B compact at 1 Gparam/s: %d tier layers, capped %d, wait %.3f s, micro %d\n",
            p.eo.gpu_layers, p.tier_capped, p.time.wait_s, p.eo.micro_batch);
    assert_true(p.tier_capped);
    assert_true(p.eo.gpu_layers > 5 && p.eo.gpu_layers < 23);
    assert_int_equal(p.time.bound, MT_BOUND_HOST);
    /* one more layer, at the same micro-batch with nothing saved, exceeds the budget less the pool's
     * headroom (8.5 B a q element + 256 MiB: 2.11 GiB at 65536 tokens x 3584) */
    mt_engine_opts o = p.eo;
    o.gpu_layers++;
    o.saved_layers = o.saved_attention = 0;
    mt_engine_plan m;
    mt_engine_plan_of(&t, MT_BF16, &o, &m);
    double pool = 8.5 * 65536 * 3584 + 256.0 * (1 << 20);
    assert_true(m.dev_total + (double)be.memory.scratch + pool > 80.0 * GIB);

    for (int k = 0; k <= 2; k += 2) {
        rq.gpu_layers = k;
        assert_int_equal(mt_plan_resolve(&t, &be, &rq, &p), MT_OK);
        assert_int_equal(p.eo.gpu_layers, k);
        char *buf = NULL;
        size_t len = 0;
        FILE *out = open_memstream(&buf, &len);
        mt_plan_print(&p, out);
        fclose(out);
        assert_null(strstr(buf, "gpu tier:")); /* no reasoning for a tier the user chose */
        assert_non_null(strstr(buf, "bound: the host update"));
        free(buf);
    }

    mt_backend cpu = {.name = "cpu", .dtype = MT_F32, .memory = {.host_ram = 1}};
    rq = h200_request(MT_STATE_COMPACT, 1e9);
    assert_int_equal(mt_plan_resolve(&t, &cpu, &rq, &p), MT_OK);
    assert_int_equal(p.eo.gpu_layers, 0);
    assert_false(p.timed);
    mt_param_table_free(&t);
}

/* The pieces of the 7B full step at 16 x 4096 with no tier and nothing saved, by hand: compute =
 * L (4 proj + 4.5 attn) + 3 head (forward, recompute, backward 2x and 2.5x) over 600 TFLOP/s; up
 * 2 passes x 28 layers + embed + head, bf16, + 8 N bytes of tokens; down every gradient, bf16;
 * PCIe the largest of up / 55.2e9, down / 55.3e9, both / (2 x 46.2e9); the host 7.6 Gparam at
 * 4.5 Gparam/s. And the smallest compute-bound batch: at one row fewer the forward waits. */
static void test_pieces_by_hand(void **state) {
    (void)state;
    mt_param_table t;
    load(&t, "../../bench/configs/qwen2.5-7b.json");
    mt_backend_memory m = mt_backend_cuda_memory();
    mt_engine_opts o = opts_7b(MT_STATE_FULL, 0);
    mt_step_time st;
    mt_step_time_of(&t, MT_BF16, &o, &m, 4.5e9, &st);
    const double N = 65536, proj = 2 * N * 233046016.0, attn = N * 4 * 2048 * 28 * 128,
                 head = 2 * N * 3584 * 152064.0, layer = 233057792.0, embed = 544997376.0;
    double flops = 28 * (4 * proj + 4.5 * attn) + 3 * head;
    assert_true(fabs(st.flops - flops) <= 1e-12 * flops);
    assert_true(fabs(st.compute_s - flops / 6e14) < 1e-9);
    double up = (2 * 28 * layer + embed + embed + 3584) * 2 + 8 * N;
    double down = (28 * layer + embed + embed + 3584) * 2;
    assert_true(st.h2d_bytes == up && st.d2h_bytes == down);
    double pcie = fmax(fmax(up / 55.2e9, down / 55.3e9), (up + down) / 92.4e9);
    assert_true(fabs(st.pcie_s - pcie) < 1e-12);
    assert_true(st.host_params == 7615616512.0);
    assert_true(fabs(st.host_s - 7615616512.0 / 4.5e9) < 1e-12);
    fprintf(stderr, "7B full: compute %.3f s, PCIe %.3f s (up %.2f GB, down %.2f GB), host %.3f s\n",
            st.compute_s, st.pcie_s, up / 1e9, down / 1e9, st.host_s);
    assert_int_equal(st.bound, MT_BOUND_COMPUTE);
    /* saved layers spare the recompute: 10 saved take 10 (proj + attn) off */
    o.saved_layers = 10;
    mt_step_time_of(&t, MT_BF16, &o, &m, 4.5e9, &st);
    assert_true(fabs(st.flops - (flops - 10 * (proj + attn))) <= 1e-12 * flops);
    /* resident weights cross once */
    o.resident = 1;
    mt_step_time_of(&t, MT_BF16, &o, &m, 4.5e9, &st);
    assert_true(st.h2d_bytes == up - 28 * layer * 2);

    o = opts_7b(MT_STATE_COMPACT, 0);
    int b = mt_step_time_compute_batch(&t, MT_BF16, &o, &m, 3.8e9);
    fprintf(stderr, "7B compact, no tier: compute-bound from --batch %d\n", b);
    assert_true(b > 16); /* at 16 it waits 0.30 s (test_wait_by_hand) */
    for (int B = b - 1; B <= b; B++) {
        o.batch = B;
        mt_step_time_of(&t, MT_BF16, &o, &m, 3.8e9, &st);
        assert_int_equal(mt_step_time_waits(&st) || st.pcie_s > st.compute_s, B < b);
    }
    mt_param_table_free(&t);
}

/* --update-on gpu (update_on_device): the host groups' update at the pace of their state crossing
 * PCIe both ways, tight's 4.03 B/param (mt_optim_bytes_per_param) at the duplex 46.2 GB/s, the
 * uplink also carrying the next forward's bf16 weights (2 B/param); the
 * state's bytes join the uploads and replace the gradients' downloads; the compute is unchanged.
 * Not with full (its gradients wait in the upload copy) nor without grads_on_device. */
static void test_streamed_update_by_hand(void **state) {
    (void)state;
    mt_param_table t;
    load(&t, "../../bench/configs/qwen2.5-7b.json");
    mt_backend_memory m = mt_backend_cuda_memory();
    mt_engine_opts o = opts_7b(MT_STATE_TIGHT, 0);
    o.grads_on_device = 1;
    mt_step_time host, st;
    mt_step_time_of(&t, MT_BF16, &o, &m, 3.4e9, &host);
    o.update_on_device = 1;
    mt_step_time_of(&t, MT_BF16, &o, &m, 3.4e9, &st);
    double per = mt_optim_bytes_per_param(MT_STATE_TIGHT), n = 7615616512.0;
    assert_true(st.streamed && !host.streamed && st.state_bytes == per);
    assert_true(st.host_params == n && fabs(st.host_s - n * (per + 2) / 46.2e9) < 1e-9);
    assert_true(fabs(st.h2d_bytes - (host.h2d_bytes + n * per)) < 1.0);
    assert_true(fabs(st.d2h_bytes - (host.d2h_bytes - n * 2 + n * per)) < 1.0);
    assert_true(st.compute_s == host.compute_s);
    assert_true(st.host_s < host.host_s && st.wait_s <= host.wait_s);
    fprintf(stderr, "7B tight at 16 x 4096: host update %.2f s (wait %.2f), streamed %.2f s (wait %.2f), "
            "PCIe %.2f -> %.2f s\n", host.host_s, host.wait_s, st.host_s, st.wait_s, host.pcie_s, st.pcie_s);
    o.grads_on_device = 0; /* no gradient on the GPU: nothing streams */
    mt_step_time_of(&t, MT_BF16, &o, &m, 3.4e9, &st);
    assert_false(st.streamed);
    o = opts_7b(MT_STATE_FULL, 0);
    o.grads_on_device = 1, o.update_on_device = 1;
    mt_step_time_of(&t, MT_BF16, &o, &m, 3.4e9, &st);
    assert_false(st.streamed);
    mt_param_table_free(&t);
}

/* MoE layers count the router and the k experts a token goes through, not all E, and not the
 * dense intermediate_size: Qwen3-30B-A3B (48 layers, C 2048, 32/4 heads of 128, 128 experts of
 * 768, top 8, V 151936). A layer's matmul parameters a token uses: q 2048 x 4096, k and v 2048 x
 * 512, o 4096 x 2048 = 18,874,368; router 128 x 2048 = 262,144; 8 experts x 3 x 2048 x 768 =
 * 37,748,736; in all 56,885,248. With every layer saved (no recompute) the step's projections are
 * 6 N (48 x 56,885,248 + V C): 6 N_active N less the embedding table and the norms, which 6NT
 * counts and no matmul computes (3,353,032,704 - 151936 x 2048 - 48 x 4352 - 2048). The 16-layer
 * Mixtral shape's MLP: router 8 x 4096 and 2 experts of 3 x 4096 x 14336 (the old count took one
 * dense MLP of intermediate_size: half, no router). */
static void test_moe_flops(void **state) {
    (void)state;
    mt_param_table t;
    load(&t, "../../bench/configs/qwen3-30b-a3b.json");
    const mt_config *c = &t.cfg;
    assert_true(t.n_real == 30532122624LL);
    assert_true(mt_config_active_param_count(c) == 3353032704LL);
    const double N = 65536, T = 4096, attn = N * 4 * (T / 2) * 32 * 128;
    double got = mt_flops_executed(c, N, (int)T, 48, 0);
    double want = 6 * N * (48 * 56885248.0 + 151936.0 * 2048) + 48 * 3.5 * attn;
    fprintf(stderr, "Qwen3-30B-A3B executed %.6e, by hand %.6e\n", got, want);
    assert_true(fabs(got - want) <= 1e-12 * want);
    /* LoRA (a frozen base): no weight-gradient products, so the backward counts once */
    double frozen = mt_flops_executed_frozen(c, N, (int)T, 48, 0);
    double want_frozen = 4 * N * (48 * 56885248.0 + 151936.0 * 2048) + 48 * 3.5 * attn;
    assert_true(fabs(frozen - want_frozen) <= 1e-12 * want_frozen);
    assert_true(3353032704.0 - 151936.0 * 2048 - 48 * 4352 - 2048 == 48 * 56885248.0 + 151936.0 * 2048);
    assert_true(mt_flops_layer_mlp(c, 0, N) == 2 * N * (262144.0 + 37748736.0));
    mt_param_table_free(&t);

    load(&t, "../../bench/configs/mixtral-8x7b-16l.json");
    assert_true(mt_flops_layer_mlp(&t.cfg, 3, N) == 2 * N * (8 * 4096.0 + 2 * 3 * 4096.0 * 14336));
    /* 10 of 16 recomputed: each adds its forward again */
    double one = mt_flops_layer_projections(&t.cfg, 0, N, 1) + mt_flops_layer_attention_forward(&t.cfg, 0, N, 4096);
    assert_true(fabs(mt_flops_executed(&t.cfg, N, 4096, 6, 0) - mt_flops_executed(&t.cfg, N, 4096, 16, 0) -
                     10 * one) <= 1e-12 * one * 10);
    mt_param_table_free(&t);
}

/* An MoE layer's time beyond its FLOPs (moe_pass_extra_s), Qwen3-30B-A3B (48 MoE layers, E 128,
 * k 8, C 2048, Fe 768) at 16 x 4096 with the backend's MoE numbers set to c = 3 us a call, grouped
 * data products at 250 TFLOP/s below 512 rows an expert, routing at 1.1 TB/s. By hand, a call of
 * n tokens: data D(n) = 2 n k 3 C Fe FLOPs; routing R(n) = n k (4C + 6Fe) / 1.1e12 s; the loop's
 * forward 3 E c + R, the grouped forward D (1/250e12 - 1/600e12) + 3 c + R; the backward adds the
 * weight gradients' 3 E c (per expert in both modes); a layer's step: forward x 2 (its recompute)
 * + backward, N / n calls of each; without recompute (every layer saved) forward + backward. */
static void test_moe_extra_by_hand(void **state) {
    (void)state;
    mt_param_table t;
    load(&t, "../../bench/configs/qwen3-30b-a3b.json");
    mt_backend_memory m = mt_backend_cuda_memory();
    m.moe_call_s = 3e-6, m.moe_grouped_rate = 250e12, m.moe_grouped_below = 512, m.moe_route_rate = 1.1e12;
    const double N = 65536, E = 128, k = 8, C = 2048, Fe = 768, c = 3e-6;
#define D_OF(n) (2.0 * (n) * k * 3 * C * Fe)
#define R_OF(n) ((n) * k * (4 * C + 6 * Fe) / 1.1e12)
    mt_engine_opts o = opts_7b(MT_STATE_TIGHT, 0);
    mt_step_time st;
    /* the whole micro-batch a call: 4096 rows an expert, the loop */
    mt_step_time_of(&t, MT_BF16, &o, &m, 3.4e9, &st);
    double fwd = 3 * E * c + R_OF(N), bwd = fwd + 3 * E * c, want = 48 * (2 * fwd + bwd);
    fprintf(stderr, "Qwen3 16 x 4096 untiled, loop: MoE extra %.4f s (by hand %.4f)\n", st.moe_s, want);
    assert_true(fabs(st.moe_s - want) <= 1e-9 * want);
    assert_true(fabs(st.compute_s - (st.flops / 6e14 + want)) <= 1e-9 * st.compute_s);
    /* every layer saved: no recompute */
    o.saved_layers = 48;
    mt_step_time_of(&t, MT_BF16, &o, &m, 3.4e9, &st);
    assert_true(fabs(st.moe_s - 48 * (fwd + bwd)) <= 1e-9 * want);
    /* micro-batch 1 in chunks of 2048: 128 rows an expert, grouped, 32 calls a pass */
    o.saved_layers = 0, o.micro_batch = 1, o.mlp_chunk = 2048;
    mt_step_time_of(&t, MT_BF16, &o, &m, 3.4e9, &st);
    fwd = D_OF(2048) * (1 / 250e12 - 1 / 6e14) + 3 * c + R_OF(2048), bwd = fwd + 3 * E * c;
    want = 48 * 32 * (2 * fwd + bwd);
    fprintf(stderr, "Qwen3 micro 1, chunks of 2048, grouped: MoE extra %.4f s (by hand %.4f)\n", st.moe_s, want);
    assert_true(fabs(st.moe_s - want) <= 1e-9 * want);
    /* the same calls, the loop (no grouped GEMM): 3 E c a forward call */
    m.moe_grouped_below = 0;
    mt_step_time_of(&t, MT_BF16, &o, &m, 3.4e9, &st);
    fwd = 3 * E * c + R_OF(2048), bwd = fwd + 3 * E * c, want = 48 * 32 * (2 * fwd + bwd);
    assert_true(fabs(st.moe_s - want) <= 1e-9 * want);
#undef D_OF
#undef R_OF
    mt_param_table_free(&t);
}

/* Qwen3.6-35B-A3B at 16 x 4096: its 30 Gated DeltaNet layers' recurrence at delta_rule_rate, by
 * hand. Per layer the chunked rule's forward is N * Hv * (4 n Dk + n (Dv + Dk) + 2 n Dv + 6 Dk Dv)
 * with n = 64, Hv 32, Dk = Dv = 128: 65536 * 32 * 163840 = 3.4360e11 FLOPs; beyond the GEMMs' rate
 * it costs that x (1/5e12 - 1/6e14) each pass: forward, recompute (nothing saved), and 2.5x in the
 * backward; the 10 attention layers none. */
static void test_deltanet_extra_by_hand(void **state) {
    (void)state;
    mt_param_table t;
    load(&t, "../../configs/qwen3.6-35b-a3b.json");
    mt_backend_memory m = mt_backend_cuda_memory();
    m.delta_rule_rate = 5e12;
    mt_engine_opts o = opts_7b(MT_STATE_TIGHT, 0);
    mt_step_time st;
    mt_step_time_of(&t, MT_BF16, &o, &m, 3.4e9, &st);
    const double core = 65536.0 * 32 * 163840, per = core * (1 / 5e12 - 1 / 6e14);
    assert_true(core == mt_flops_deltanet_core_forward(&t.cfg, 65536));
    double want = 30 * per * (1 + 1 + 2.5);
    fprintf(stderr, "Qwen3.6-35B-A3B 16 x 4096: DeltaNet extra %.4f s (by hand %.4f)\n", st.delta_s, want);
    assert_true(fabs(st.delta_s - want) <= 1e-9 * want);
    assert_int_equal(st.mixer_layers[MT_MIXER_GATED_DELTANET], 30);
    assert_int_equal(st.mixer_layers[MT_MIXER_ATTENTION], 10);
    assert_true(st.mixer_forward_s[MT_MIXER_GATED_DELTANET] > st.mixer_forward_s[MT_MIXER_ATTENTION]);
    /* without a rate of its own the rule runs at flops_rate: no extra */
    m.delta_rule_rate = 0;
    mt_step_time_of(&t, MT_BF16, &o, &m, 3.4e9, &st);
    assert_true(st.delta_s == 0);
    mt_param_table_free(&t);
}

/* `plan` for Qwen3-30B-A3B at 16 x 4096 on the H200 (139 GiB, 125 GiB host; MT_HOST_ADAMW=3.8):
 * full does not fit the host and names a --state that does; compact fits, and its lines say by
 * hand: a layer 623,120,896 params = 1.16 GiB in bf16, 97% of it experts (603,979,776), its
 * forward (2 N 56,885,248 + 4 N 2048 x 32 x 128) / 6e14 = 16 ms, its update 623,120,896 / 3.8e9 =
 * 164 ms; the forward waits for the host (it is bound by the host update). The 16-layer Mixtral:
 * full does not fit either, compact does. */
static void test_plan_moe_cli(void **state) {
    (void)state;
    static char out[OUT_SIZE];
    setenv("MT_HOST_ADAMW", "3.8", 1);
    unsetenv("MT_MOE_GEMM"); /* the default, auto, whatever the caller's environment says */
    char *cfg = mt_fixture_path("../../bench/configs/qwen3-30b-a3b.json");
    const char *flags = "--batch 16 --seq 4096 --device cuda --gpu-mem 139G --host-mem 125G";
    int rc = mt_cli_run(&env, out, sizeof out, "plan --init '%s' %s --state full", cfg, flags);
    fprintf(stderr, "%s", out);
    mt_cli_expect(rc, 1, out, "host RAM: training needs 398.09 GiB");
    mt_cli_expect(rc, 1, out, "--state compact with");
    rc = mt_cli_run(&env, out, sizeof out, "plan --init '%s' %s --state compact", cfg, flags);
    fprintf(stderr, "%s", out);
    mt_cli_expect(rc, 0, out, "fits");
    char want[256];
    const double N = 65536, layer = 623120896.0;
    /* this plan runs the layer in chunks of 1024 tokens (64 rows an expert: grouped under the
     * default MT_MOE_GEMM=auto); the forward adds, over 64 calls, test_moe_extra_by_hand's grouped
     * forward with the cuda backend's numbers (3 us, 250 TFLOP/s, 1.1 TB/s) */
    mt_cli_expect(rc, 0, out, "tiles:       layer in chunks of 1024 of its 4096 tokens");
    double extra = 64 * (2.0 * 1024 * 8 * 3 * 2048 * 768 * (1 / 250e12 - 1 / 6e14) + 9e-6 +
                         1024 * 8 * (4 * 2048 + 6 * 768) / 1.1e12);
    snprintf(want, sizeof want, "per layer:   %.2f GiB of weights up twice a step, forward %.0f ms, host "
             "update %.0f ms; an MoE layer's experts are %.0f%% of its bytes, a token computes with 8 of 128",
             layer * 2 / GIB, ((2 * N * 56885248.0 + 4 * N * 2048 * 32 * 128) / 6e14 + extra) * 1e3,
             layer / 3.8e9 * 1e3, 100 * 603979776.0 / layer);
    assert_string_equal(want, "per layer:   1.16 GiB of weights up twice a step, forward 34 ms, host update "
                              "164 ms; an MoE layer's experts are 97% of its bytes, a token computes with 8 of 128");
    mt_cli_expect(rc, 0, out, want);
    mt_cli_expect(rc, 0, out, "active experts only");
    mt_cli_expect(rc, 0, out, "bound: the host update");
    mt_cli_expect(rc, 0, out, "at 3.8 Gparam/s: MT_HOST_ADAMW");
    free(cfg);

    cfg = mt_fixture_path("../../bench/configs/mixtral-8x7b-16l.json");
    rc = mt_cli_run(&env, out, sizeof out, "plan --init '%s' %s --state full", cfg, flags);
    mt_cli_expect(rc, 1, out, "--state compact with");
    rc = mt_cli_run(&env, out, sizeof out, "plan --init '%s' %s --state compact", cfg, flags);
    fprintf(stderr, "%s", out);
    mt_cli_expect(rc, 0, out, "fits");
    mt_cli_expect(rc, 0, out, "a token computes with 2 of 8");
    free(cfg);

    setenv("MT_HOST_ADAMW", "fast", 1);
    rc = mt_cli_run(&env, out, sizeof out, "plan --model '%s' --device cuda --gpu-mem 8G", env.fixture);
    mt_cli_expect(rc, 1, out, "MT_HOST_ADAMW: 'fast' is not a rate");
    unsetenv("MT_HOST_ADAMW");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wait_by_hand),       cmocka_unit_test(test_auto_tier_for_speed),
        cmocka_unit_test(test_capped_explicit_cpu), cmocka_unit_test(test_pieces_by_hand),
        cmocka_unit_test(test_moe_flops),          cmocka_unit_test(test_plan_moe_cli),
        cmocka_unit_test(test_moe_extra_by_hand), cmocka_unit_test(test_deltanet_extra_by_hand),
        cmocka_unit_test(test_streamed_update_by_hand),
    };
    return cmocka_run_group_tests(tests, setup, mt_cli_env_teardown);
}
