// Fused multi-tensor AdamW: one launch updates every tensor of a parameter
// group. `tensors` holds 5 u64 per tensor (param f32*, grad T*, exp_avg f32*,
// exp_avg_sq f32*, length) and `chunks` 2 u64 per block (tensor index, first
// element); a block updates up to `chunk_len` elements of one tensor.
// Decoupled weight decay: p -= lr*wd*p, then the Adam step with bias
// corrections bc1 = 1 - beta1^t, bc2 = 1 - beta2^t (computed on the host).
// Gradients are multiplied by `grad_scale` first (1/loss_scale to unscale).

struct AdamHyper {
    float lr, beta1, beta2, eps, weight_decay, bc1, bc2, grad_scale;
};

template <class G>
__device__ void adamw_multi(const u64* __restrict__ tensors, const u64* __restrict__ chunks, i64 chunk_len,
                            AdamHyper h) {
    u64 ti = chunks[2 * blockIdx.x], start = chunks[2 * blockIdx.x + 1];
    const u64* t = tensors + 5 * ti;
    float* p = (float*)t[0];
    const G* g = (const G*)t[1];
    float* m = (float*)t[2];
    float* v = (float*)t[3];
    u64 len = t[4], end = min((i64)len, (i64)start + chunk_len);
    float inv_bc2_sqrt = rsqrtf(h.bc2);
    for (u64 i = start + threadIdx.x; i < (u64)end; i += blockDim.x) {
        float gi = to_float(g[i]) * h.grad_scale;
        float mi = h.beta1 * m[i] + (1.0f - h.beta1) * gi;
        float vi = h.beta2 * v[i] + (1.0f - h.beta2) * gi * gi;
        float pi = p[i] * (1.0f - h.lr * h.weight_decay);
        pi -= h.lr * (mi / h.bc1) / (sqrtf(vi) * inv_bc2_sqrt + h.eps);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
    }
}

#define ADAMW_DTYPE(G, S)                                                                               \
    extern "C" __global__ void adamw_##S(const u64* tensors, const u64* chunks, i64 chunk_len, AdamHyper h) { \
        adamw_multi<G>(tensors, chunks, chunk_len, h);                                                  \
    }
ADAMW_DTYPE(float, f32)
ADAMW_DTYPE(half_t, f16)
ADAMW_DTYPE(bf16_t, bf16)
