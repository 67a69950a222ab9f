// Fused LayerNorm over the last dimension of [rows, cols]: forward (saving
// mean and rstd), backward dx (one block per row) and dgamma/dbeta with a
// deterministic two-stage reduction (partial sums per row chunk, then a sum
// over chunks). gamma/beta may be null (treated as 1 and 0).

template <class T>
__device__ void ln_fwd(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                       T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, i64 cols, float eps) {
    __shared__ float scratch[32];
    i64 row = blockIdx.x;
    const T* xr = x + row * cols;
    float s = 0.0f;
    for (i64 c = threadIdx.x; c < cols; c += blockDim.x) s += to_float(xr[c]);
    float mu = block_sum(s, scratch) / (float)cols;
    float q = 0.0f;
    for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {
        float d = to_float(xr[c]) - mu;
        q += d * d;
    }
    float rs = rsqrtf(block_sum(q, scratch) / (float)cols + eps);
    for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = (to_float(xr[c]) - mu) * rs;
        if (gamma) v *= to_float(gamma[c]);
        if (beta) v += to_float(beta[c]);
        y[row * cols + c] = from_float<T>(v);
    }
    if (threadIdx.x == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

// dx = rstd * (g*dy - mean(g*dy) - xhat * mean(g*dy*xhat)).
template <class T>
__device__ void ln_bwd_dx(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ dy,
                          const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx, i64 cols) {
    __shared__ float scratch[32];
    i64 row = blockIdx.x;
    float mu = mean[row], rs = rstd[row];
    float a = 0.0f, b = 0.0f;
    for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {
        float gdy = to_float(dy[row * cols + c]) * (gamma ? to_float(gamma[c]) : 1.0f);
        float xh = (to_float(x[row * cols + c]) - mu) * rs;
        a += gdy * xh;
        b += gdy;
    }
    a = block_sum(a, scratch) / (float)cols;
    b = block_sum(b, scratch) / (float)cols;
    for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {
        float gdy = to_float(dy[row * cols + c]) * (gamma ? to_float(gamma[c]) : 1.0f);
        float xh = (to_float(x[row * cols + c]) - mu) * rs;
        dx[row * cols + c] = from_float<T>(rs * (gdy - b - xh * a));
    }
}

// Stage 1: block (32, 8) sums columns [32*bx, 32*bx+32) over the rows of
// chunk blockIdx.y into part_g/part_b[chunk, col].
template <class T>
__device__ void ln_bwd_partial(const T* __restrict__ x, const T* __restrict__ dy, const float* __restrict__ mean,
                               const float* __restrict__ rstd, float* __restrict__ part_g, float* __restrict__ part_b,
                               i64 rows, i64 cols, i64 rows_per_chunk) {
    __shared__ float sg[8][33], sb[8][33];
    i64 c = (i64)blockIdx.x * 32 + threadIdx.x;
    i64 r0 = (i64)blockIdx.y * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
    float g = 0.0f, b = 0.0f;
    if (c < cols)
        for (i64 r = r0 + threadIdx.y; r < r1; r += 8) {
            float d = to_float(dy[r * cols + c]);
            g += d * (to_float(x[r * cols + c]) - mean[r]) * rstd[r];
            b += d;
        }
    sg[threadIdx.y][threadIdx.x] = g;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        for (int k = 1; k < 8; ++k) {
            g += sg[k][threadIdx.x];
            b += sb[k][threadIdx.x];
        }
        part_g[blockIdx.y * cols + c] = g;
        part_b[blockIdx.y * cols + c] = b;
    }
}

// Stage 2: dgamma/dbeta[col] = sum over chunks, in chunk order.
template <class T>
__device__ void ln_bwd_final(const float* __restrict__ part_g, const float* __restrict__ part_b, T* __restrict__ dgamma,
                             T* __restrict__ dbeta, i64 chunks, i64 cols) {
    i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float g = 0.0f, b = 0.0f;
    for (i64 k = 0; k < chunks; ++k) {
        g += part_g[k * cols + c];
        b += part_b[k * cols + c];
    }
    dgamma[c] = from_float<T>(g);
    dbeta[c] = from_float<T>(b);
}

#define LN_DTYPE(T, S)                                                                                          \
    extern "C" __global__ void ln_fwd_##S(const T* x, const T* gamma, const T* beta, T* y, float* mean,          \
                                          float* rstd, i64 cols, float eps) {                                   \
        ln_fwd<T>(x, gamma, beta, y, mean, rstd, cols, eps);                                                    \
    }                                                                                                           \
    extern "C" __global__ void ln_bwd_dx_##S(const T* x, const T* gamma, const T* dy, const float* mean,         \
                                             const float* rstd, T* dx, i64 cols) {                              \
        ln_bwd_dx<T>(x, gamma, dy, mean, rstd, dx, cols);                                                       \
    }                                                                                                           \
    extern "C" __global__ void ln_bwd_partial_##S(const T* x, const T* dy, const float* mean, const float* rstd, \
                                                  float* pg, float* pb, i64 rows, i64 cols, i64 rpc) {          \
        ln_bwd_partial<T>(x, dy, mean, rstd, pg, pb, rows, cols, rpc);                                          \
    }                                                                                                           \
    extern "C" __global__ void ln_bwd_final_##S(const float* pg, const float* pb, T* dg, T* db, i64 chunks,      \
                                                i64 cols) {                                                     \
        ln_bwd_final<T>(pg, pb, dg, db, chunks, cols);                                                          \
    }
LN_DTYPE(float, f32)
LN_DTYPE(half_t, f16)
LN_DTYPE(bf16_t, bf16)
