/* The gated delta rule's FLOP count (backend.h), for the planner. Per chunk of L tokens and value
 * head, as cpu/gated_delta*.c (and a CUDA port of the same form) run it:
 *   forward:  K K^T, Q K^T            4 L^2 Dk
 *             Tm U = R, O's P U       4 L^2 Dv      (Tm, P: full (L, L) products)
 *             K S0, Q S0, K^T U       6 L Dk Dv
 *             the triangular inverse  L (L^2 - 1) / 3
 *   backward: the forward's recompute without Q S0 and K^T U (4 L^2 Dk + 2 L^2 Dv + 2 L Dk Dv
 *             + the inverse), then P^T dO, Tm^T dU, dR U^T, dO U^T (8 L^2 Dv), (dP)K, (dP)^T Q,
 *             (M + M^T) K (6 L^2 Dk), K dSn, dO S0^T, dX S0^T, U dSn^T, Q^T dO, K^T dX (12 L Dk Dv)
 *             = 10 L^2 Dk + 10 L^2 Dv + 14 L Dk Dv + L (L^2 - 1) / 3.
 * At L = 64, Dk = Dv = 128 that is 165 kFLOP a token and value head forward (the plain token
 * recurrence: 4 Dk Dv = 65.5 kFLOP, in matrix-vector products), 395 kFLOP backward. */
#include "backend.h"

static void chunk_flops(double L, double Dk, double Dv, double *fwd, double *bwd) {
    double inv = L * (L * L - 1.0) / 3.0;
    *fwd = 4 * L * L * Dk + 4 * L * L * Dv + 6 * L * Dk * Dv + inv;
    *bwd = 10 * L * L * Dk + 10 * L * L * Dv + 14 * L * Dk * Dv + inv;
}

void mt_gated_delta_flops(int B, int T, int Hv, int Dk, int Dv, double *fwd, double *bwd) {
    double f = 0.0, b = 0.0, cf, cb;
    int full = T / MT_GATED_DELTA_CHUNK, rest = T % MT_GATED_DELTA_CHUNK;
    chunk_flops(MT_GATED_DELTA_CHUNK, Dk, Dv, &cf, &cb);
    f += full * cf, b += full * cb;
    if (rest) {
        chunk_flops(rest, Dk, Dv, &cf, &cb);
        f += cf, b += cb;
    }
    *fwd = f * B * Hv;
    *bwd = b * B * Hv;
}
