// Embedding lookup out[n, :] = weight[idx[n], :] and its backward
// grad_w[idx[n], :] += grad_out[n, :] (f32 accumulation with atomics: the
// order of additions for a repeated index is not fixed). Indices outside
// [0, V) give NaN rows forward and are skipped backward.

template <class T>
__device__ void emb_fwd(const T* __restrict__ w, const i64* __restrict__ idx, T* __restrict__ out, i64 n, i64 V,
                        i64 D) {
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n * D; e += (i64)gridDim.x * blockDim.x) {
        i64 r = e / D, d = e - r * D, k = idx[r];
        out[e] = (k >= 0 && k < V) ? w[k * D + d] : from_float<T>(__int_as_float(0x7fc00000));
    }
}

template <class T>
__device__ void emb_bwd(const T* __restrict__ gout, const i64* __restrict__ idx, float* __restrict__ gw, i64 n, i64 V,
                        i64 D) {
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n * D; e += (i64)gridDim.x * blockDim.x) {
        i64 r = e / D, d = e - r * D, k = idx[r];
        if (k >= 0 && k < V) atomicAdd(&gw[k * D + d], to_float(gout[e]));
    }
}

#define EMB_DTYPE(T, S)                                                                                        \
    extern "C" __global__ void emb_fwd_##S(const T* w, const i64* idx, T* out, i64 n, i64 V, i64 D) {           \
        emb_fwd<T>(w, idx, out, n, V, D);                                                                      \
    }                                                                                                          \
    extern "C" __global__ void emb_bwd_##S(const T* gout, const i64* idx, float* gw, i64 n, i64 V, i64 D) {     \
        emb_bwd<T>(gout, idx, gw, n, V, D);                                                                    \
    }
EMB_DTYPE(float, f32)
EMB_DTYPE(half_t, f16)
EMB_DTYPE(bf16_t, bf16)
