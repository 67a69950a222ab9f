// Flash-style attention over Q [BH, Lq, D], K/V [BH, Lk, D] (contiguous;
// BH = batch * heads), D <= DMAX (64 or 128). Forward keeps a running max and
// sum per query row (online softmax) over key tiles of 32 in shared memory,
// so the Lq x Lk score matrix is never stored, and saves the row
// log-sum-exp. Backward recomputes the probabilities from it: one kernel for
// dQ (per query tile, looping over keys), one for dK/dV (per key tile, looping
// over queries), so no atomics and a schedule-independent result.
//
// Masks: causal (key j visible to query i when j <= i + Lk - Lq) and padding
// (keys j >= kv_len[b] hidden, b = bh / heads; kv_len may be null). A query
// row that sees no key gets O = 0 and lse = -inf.
//
// 128 threads: thread t works on row t/4 of the tile and on dims
// {t%4 + 4j}; a dot product is a partial sum plus two shuffles within the
// 4-lane group.

#define A_BC 32
#define A_THREADS 128
#define A_SUB 8

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(FULL_MASK, v, 1);
    v += __shfl_xor_sync(FULL_MASK, v, 2);
    return v;
}

__device__ __forceinline__ int visible_keys(const int* kv_len, int b, int Lk) {
    return kv_len ? max(0, min(kv_len[b], Lk)) : Lk;
}

__device__ __forceinline__ bool key_visible(int j, int i, int kv, int Lq, int Lk, int causal) {
    return j < kv && (!causal || j <= i + Lk - Lq);
}

// Copies rows [r0, r0+32) of a [rows, D] matrix into a [32][DMAX] f32 tile,
// zero past the edges.
template <class T, int DMAX>
__device__ __forceinline__ void load_rows(float (*dst)[DMAX], const T* __restrict__ src, int r0, int rows, int D) {
    for (int e = threadIdx.x; e < A_BC * DMAX; e += A_THREADS) {
        int r = e / DMAX, d = e % DMAX;
        dst[r][d] = (r0 + r < rows && d < D) ? to_float(src[(i64)(r0 + r) * D + d]) : 0.0f;
    }
}

// The next pair of tiles of every loop below: rows [r0, r0+32) of the
// [rows, D] matrices A and B into sa and sb, after a barrier so that no
// thread still reads the previous tiles. Every thread of the block calls it.
// Callers end with their own barrier before reading the tiles (dK/dV stages
// its per-row statistics in between).
template <class T, int DMAX>
__device__ __forceinline__ void next_tiles(float (*sa)[DMAX], const T* __restrict__ A, float (*sb)[DMAX],
                                           const T* __restrict__ B, int r0, int rows, int D) {
    __syncthreads();
    load_rows<T, DMAX>(sa, A, r0, rows, D);
    load_rows<T, DMAX>(sb, B, r0, rows, D);
}

template <class T, int DMAX>
__device__ void attn_fwd(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, T* __restrict__ O,
                         float* __restrict__ LSE, const int* __restrict__ kv_len, int H, int Lq, int Lk, int D,
                         float scale, int causal) {
    constexpr int CH = DMAX / 4;
    __shared__ float sK[A_BC][DMAX], sV[A_BC][DMAX];
    int bh = blockIdx.y, c = threadIdx.x & 3;
    int i = blockIdx.x * A_BC + (threadIdx.x >> 2);
    bool row_ok = i < Lq;
    int kv = visible_keys(kv_len, bh / H, Lk);
    int kend = causal ? max(0, min(kv, (int)blockIdx.x * A_BC + A_BC + Lk - Lq)) : kv;
    const T* q = Q + ((i64)bh * Lq + (row_ok ? i : 0)) * D;
    K += (i64)bh * Lk * D;
    V += (i64)bh * Lk * D;
    float qr[CH], acc[CH];
#pragma unroll
    for (int j = 0; j < CH; ++j) {
        int d = c + 4 * j;
        qr[j] = (row_ok && d < D) ? to_float(q[d]) * scale : 0.0f;
        acc[j] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int j0 = 0; j0 < kend; j0 += A_BC) {
        next_tiles<T, DMAX>(sK, K, sV, V, j0, Lk, D);
        __syncthreads();
        // Sub-tiles of A_SUB keys keep the score array in registers small.
#pragma unroll 1
        for (int j1 = 0; j1 < A_BC; j1 += A_SUB) {
            float s[A_SUB];
            float tmax = NEG_INF;
#pragma unroll
            for (int jj = 0; jj < A_SUB; ++jj) {
                float p = 0.0f;
#pragma unroll
                for (int j = 0; j < CH; ++j) p += qr[j] * sK[j1 + jj][c + 4 * j];
                p = quad_sum(p);
                s[jj] = key_visible(j0 + j1 + jj, i, kv, Lq, Lk, causal) ? p : NEG_INF;
                tmax = fmaxf(tmax, s[jj]);
            }
            float mnew = fmaxf(m, tmax);
            if (mnew == NEG_INF) continue;
            float corr = expf(m - mnew);
            l *= corr;
#pragma unroll
            for (int j = 0; j < CH; ++j) acc[j] *= corr;
#pragma unroll
            for (int jj = 0; jj < A_SUB; ++jj) {
                float p = expf(s[jj] - mnew);
                l += p;
#pragma unroll
                for (int j = 0; j < CH; ++j) acc[j] += p * sV[j1 + jj][c + 4 * j];
            }
            m = mnew;
        }
    }
    if (!row_ok) return;
    T* o = O + ((i64)bh * Lq + i) * D;
#pragma unroll
    for (int j = 0; j < CH; ++j) {
        int d = c + 4 * j;
        if (d < D) o[d] = from_float<T>(l > 0.0f ? acc[j] / l : 0.0f);
    }
    if (c == 0) LSE[(i64)bh * Lq + i] = l > 0.0f ? m + logf(l) : NEG_INF;
}

// Dd[row] = sum_d dO[row, d] * O[row, d]; one warp per row.
template <class T>
__device__ void attn_bwd_dot(const T* __restrict__ O, const T* __restrict__ dO, float* __restrict__ Dd, i64 rows, int D) {
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    bool ok = row < rows;
    float s = 0.0f;
    if (ok)
        for (int d = threadIdx.x & 31; d < D; d += 32) s += to_float(O[row * D + d]) * to_float(dO[row * D + d]);
    s = warp_sum(s);
    if (ok && (threadIdx.x & 31) == 0) Dd[row] = s;
}

template <class T, int DMAX>
__device__ void attn_bwd_dq(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                            const T* __restrict__ dO, const float* __restrict__ LSE, const float* __restrict__ Dd,
                            T* __restrict__ dQ, const int* __restrict__ kv_len, int H, int Lq, int Lk, int D,
                            float scale, int causal) {
    constexpr int CH = DMAX / 4;
    __shared__ float sK[A_BC][DMAX], sV[A_BC][DMAX];
    int bh = blockIdx.y, c = threadIdx.x & 3;
    int i = blockIdx.x * A_BC + (threadIdx.x >> 2);
    bool row_ok = i < Lq;
    int kv = visible_keys(kv_len, bh / H, Lk);
    int kend = causal ? max(0, min(kv, (int)blockIdx.x * A_BC + A_BC + Lk - Lq)) : kv;
    i64 row = (i64)bh * Lq + (row_ok ? i : 0);
    K += (i64)bh * Lk * D;
    V += (i64)bh * Lk * D;
    float qr[CH], dor[CH], dq[CH];
#pragma unroll
    for (int j = 0; j < CH; ++j) {
        int d = c + 4 * j;
        bool ok = row_ok && d < D;
        qr[j] = ok ? to_float(Q[row * D + d]) : 0.0f;
        dor[j] = ok ? to_float(dO[row * D + d]) : 0.0f;
        dq[j] = 0.0f;
    }
    float lse = row_ok ? LSE[row] : NEG_INF, di = row_ok ? Dd[row] : 0.0f;
    for (int j0 = 0; j0 < kend; j0 += A_BC) {
        next_tiles<T, DMAX>(sK, K, sV, V, j0, Lk, D);
        __syncthreads();
#pragma unroll 4
        for (int jj = 0; jj < A_BC; ++jj) {
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int j = 0; j < CH; ++j) {
                s += qr[j] * sK[jj][c + 4 * j];
                dp += dor[j] * sV[jj][c + 4 * j];
            }
            s = quad_sum(s);
            dp = quad_sum(dp);
            bool ok = key_visible(j0 + jj, i, kv, Lq, Lk, causal) && lse != NEG_INF;
            float p = ok ? expf(s * scale - lse) : 0.0f;
            float ds = p * (dp - di);
#pragma unroll
            for (int j = 0; j < CH; ++j) dq[j] += ds * sK[jj][c + 4 * j];
        }
    }
    if (!row_ok) return;
#pragma unroll
    for (int j = 0; j < CH; ++j) {
        int d = c + 4 * j;
        if (d < D) dQ[row * D + d] = from_float<T>(dq[j] * scale);
    }
}

template <class T, int DMAX>
__device__ void attn_bwd_dkdv(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                              const T* __restrict__ dO, const float* __restrict__ LSE, const float* __restrict__ Dd,
                              T* __restrict__ dK, T* __restrict__ dV, const int* __restrict__ kv_len, int H, int Lq,
                              int Lk, int D, float scale, int causal) {
    constexpr int CH = DMAX / 4;
    __shared__ float sQ[A_BC][DMAX], sdO[A_BC][DMAX], sL[A_BC], sD[A_BC];
    int bh = blockIdx.y, c = threadIdx.x & 3;
    int j = blockIdx.x * A_BC + (threadIdx.x >> 2);
    bool key_ok = j < Lk;
    int kv = visible_keys(kv_len, bh / H, Lk);
    i64 krow = (i64)bh * Lk + (key_ok ? j : 0);
    Q += (i64)bh * Lq * D;
    dO += (i64)bh * Lq * D;
    float kr[CH], vr[CH], dk[CH], dv[CH];
#pragma unroll
    for (int e = 0; e < CH; ++e) {
        int d = c + 4 * e;
        bool ok = key_ok && d < D;
        kr[e] = ok ? to_float(K[krow * D + d]) : 0.0f;
        vr[e] = ok ? to_float(V[krow * D + d]) : 0.0f;
        dk[e] = 0.0f;
        dv[e] = 0.0f;
    }
    // Under the causal mask the first query that sees key blockIdx.x*32 is
    // that key minus (Lk - Lq).
    int istart = causal ? max(0, (int)blockIdx.x * A_BC - (Lk - Lq)) / A_BC * A_BC : 0;
    for (int i0 = istart; i0 < Lq; i0 += A_BC) {
        next_tiles<T, DMAX>(sQ, Q, sdO, dO, i0, Lq, D);
        if (threadIdx.x < A_BC) {
            bool ok = i0 + (int)threadIdx.x < Lq;
            sL[threadIdx.x] = ok ? LSE[(i64)bh * Lq + i0 + threadIdx.x] : NEG_INF;
            sD[threadIdx.x] = ok ? Dd[(i64)bh * Lq + i0 + threadIdx.x] : 0.0f;
        }
        __syncthreads();
#pragma unroll 4
        for (int ii = 0; ii < A_BC; ++ii) {
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int e = 0; e < CH; ++e) {
                s += kr[e] * sQ[ii][c + 4 * e];
                dp += vr[e] * sdO[ii][c + 4 * e];
            }
            s = quad_sum(s);
            dp = quad_sum(dp);
            float lse = sL[ii];
            bool ok = key_ok && lse != NEG_INF && key_visible(j, i0 + ii, kv, Lq, Lk, causal);
            float p = ok ? expf(s * scale - lse) : 0.0f;
            float ds = p * (dp - sD[ii]);
#pragma unroll
            for (int e = 0; e < CH; ++e) {
                dv[e] += p * sdO[ii][c + 4 * e];
                dk[e] += ds * sQ[ii][c + 4 * e];
            }
        }
    }
    if (!key_ok) return;
#pragma unroll
    for (int e = 0; e < CH; ++e) {
        int d = c + 4 * e;
        if (d < D) {
            dK[krow * D + d] = from_float<T>(dk[e] * scale);
            dV[krow * D + d] = from_float<T>(dv[e]);
        }
    }
}

#define ATTN_VARIANT(T, S, DM)                                                                                   \
    extern "C" __global__ void __launch_bounds__(A_THREADS)                                                      \
        attn_fwd_##S##_d##DM(const T* Q, const T* K, const T* V, T* O, float* LSE, const int* kv_len, int H,     \
                             int Lq, int Lk, int D, float scale, int causal) {                                   \
        attn_fwd<T, DM>(Q, K, V, O, LSE, kv_len, H, Lq, Lk, D, scale, causal);                                   \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(A_THREADS)                                                      \
        attn_bwd_dq_##S##_d##DM(const T* Q, const T* K, const T* V, const T* dO, const float* LSE,               \
                                const float* Dd, T* dQ, const int* kv_len, int H, int Lq, int Lk, int D,          \
                                float scale, int causal) {                                                       \
        attn_bwd_dq<T, DM>(Q, K, V, dO, LSE, Dd, dQ, kv_len, H, Lq, Lk, D, scale, causal);                       \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(A_THREADS)                                                      \
        attn_bwd_dkdv_##S##_d##DM(const T* Q, const T* K, const T* V, const T* dO, const float* LSE,             \
                                  const float* Dd, T* dK, T* dV, const int* kv_len, int H, int Lq, int Lk, int D, \
                                  float scale, int causal) {                                                     \
        attn_bwd_dkdv<T, DM>(Q, K, V, dO, LSE, Dd, dK, dV, kv_len, H, Lq, Lk, D, scale, causal);                 \
    }
#define ATTN_DTYPE(T, S)                                                                        \
    ATTN_VARIANT(T, S, 64)                                                                      \
    ATTN_VARIANT(T, S, 128)                                                                     \
    extern "C" __global__ void attn_bwd_dot_##S(const T* O, const T* dO, float* Dd, i64 rows, int D) { \
        attn_bwd_dot<T>(O, dO, Dd, rows, D);                                                    \
    }
ATTN_DTYPE(float, f32)
ATTN_DTYPE(half_t, f16)
ATTN_DTYPE(bf16_t, bf16)
