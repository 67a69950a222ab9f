// Row softmax / log_softmax (one warp per row, 8 rows per block) and
// cross-entropy forward/backward over [rows, cols] logits.

// Max and log-sum-exp of a row, in every lane of the warp.
template <class T>
__device__ __forceinline__ void row_stats(const T* __restrict__ x, i64 cols, bool valid, float* mx, float* lse) {
    int lane = threadIdx.x & 31;
    float m = NEG_INF;
    if (valid)
        for (i64 c = lane; c < cols; c += 32) m = fmaxf(m, to_float(x[c]));
    m = warp_max(m);
    float s = 0.0f;
    if (valid && m != NEG_INF)
        for (i64 c = lane; c < cols; c += 32) s += expf(to_float(x[c]) - m);
    s = warp_sum(s);
    *mx = m;
    *lse = m == NEG_INF ? NEG_INF : m + logf(s);
}

template <class T>
__device__ void softmax_rows(const T* __restrict__ x, T* __restrict__ y, i64 rows, i64 cols, int log) {
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    bool valid = row < rows;
    float m, lse;
    row_stats(x + (valid ? row * cols : 0), cols, valid, &m, &lse);
    if (!valid) return;
    for (i64 c = threadIdx.x & 31; c < cols; c += 32) {
        float v = to_float(x[row * cols + c]) - lse;
        y[row * cols + c] = from_float<T>(log ? v : expf(v));
    }
}

// loss[r] = (1 - eps)*(lse - x[r, t[r]]) + eps*(lse - mean(x[r])) (label
// smoothing eps; the second term only when eps > 0); rows whose target is
// `ignore` get loss 0, out-of-range targets NaN. Saves lse for the backward.
template <class T>
__device__ void ce_fwd(const T* __restrict__ x, const i64* __restrict__ t, float* __restrict__ loss,
                       float* __restrict__ lse_out, i64 rows, i64 cols, i64 ignore, float eps) {
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    bool valid = row < rows;
    float m, lse;
    const T* xr = x + (valid ? row * cols : 0);
    row_stats(xr, cols, valid, &m, &lse);
    float sum = 0.0f;
    if (valid && eps > 0.0f)
        for (i64 c = threadIdx.x & 31; c < cols; c += 32) sum += to_float(xr[c]);
    sum = warp_sum(sum);
    if (!valid || (threadIdx.x & 31) != 0) return;
    i64 tg = t[row];
    lse_out[row] = lse;
    if (tg == ignore) loss[row] = 0.0f;
    else if (tg < 0 || tg >= cols) loss[row] = __int_as_float(0x7fc00000);
    else {
        float nll = lse - to_float(xr[tg]);
        loss[row] = eps > 0.0f ? (1.0f - eps) * nll + eps * (lse - sum / (float)cols) : nll;
    }
}

// dx[r, c] = g[r] * (softmax(x[r])[c] - eps/C - (1 - eps)*[c == t[r]]);
// ignored rows get 0.
template <class T>
__device__ void ce_bwd(const T* __restrict__ x, const i64* __restrict__ t, const float* __restrict__ lse,
                       const float* __restrict__ g, T* __restrict__ dx, i64 rows, i64 cols, i64 ignore, float eps) {
    float smooth = eps / (float)cols;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < rows * cols; i += (i64)gridDim.x * blockDim.x) {
        i64 r = i / cols, c = i - r * cols, tg = t[r];
        float d = 0.0f;
        if (tg != ignore) {
            d = g[r] * (expf(to_float(x[i]) - lse[r]) - smooth);
            if (c == tg) d -= g[r] * (1.0f - eps);
        }
        dx[i] = from_float<T>(d);
    }
}

#define SOFTMAX_DTYPE(T, S)                                                                                   \
    extern "C" __global__ void softmax_##S(const T* x, T* y, i64 rows, i64 cols, int log) {                   \
        softmax_rows<T>(x, y, rows, cols, log);                                                               \
    }                                                                                                         \
    extern "C" __global__ void ce_fwd_##S(const T* x, const i64* t, float* loss, float* lse, i64 rows, i64 cols, \
                                          i64 ignore, float eps) {                                            \
        ce_fwd<T>(x, t, loss, lse, rows, cols, ignore, eps);                                                  \
    }                                                                                                         \
    extern "C" __global__ void ce_bwd_##S(const T* x, const i64* t, const float* lse, const float* g, T* dx,    \
                                          i64 rows, i64 cols, i64 ignore, float eps) {                        \
        ce_bwd<T>(x, t, lse, g, dx, rows, cols, ignore, eps);                                                 \
    }
SOFTMAX_DTYPE(float, f32)
SOFTMAX_DTYPE(half_t, f16)
SOFTMAX_DTYPE(bf16_t, bf16)
