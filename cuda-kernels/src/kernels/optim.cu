// Fused multi-tensor optimizer steps: one launch updates every tensor of a
// parameter group. `tensors` holds 5 u64 per tensor (param f32*, grad G*,
// state0 f32*, state1 f32* or 0, length) and `chunks` 2 u64 per block
// (tensor index, first element); a block updates up to `chunk_len` elements
// of one tensor. The element math is the CPU optimizers' (tessera-optim,
// PyTorch's `_single_tensor_*` rounding), in f32, so a step on the device
// equals the CPU step up to the compiler's fused multiply-adds. Gradients
// are multiplied by `grad_scale` first (1/loss_scale to unscale).

struct MultiTensor {
    float* p;
    const void* g;
    float* s0;
    float* s1;
    u64 len, end, start;
};

__device__ __forceinline__ MultiTensor multi_tensor(const u64* tensors, const u64* chunks, i64 chunk_len) {
    u64 ti = chunks[2 * blockIdx.x], start = chunks[2 * blockIdx.x + 1];
    const u64* t = tensors + 5 * ti;
    MultiTensor m;
    m.p = (float*)t[0];
    m.g = (const void*)t[1];
    m.s0 = (float*)t[2];
    m.s1 = (float*)t[3];
    m.len = t[4];
    m.start = start;
    m.end = min((i64)m.len, (i64)start + chunk_len);
    return m;
}

// Adam / AdamW. flags: 1 decoupled weight decay (AdamW: p *= decay),
// 2 coupled weight decay (Adam: g += wd*p), 4 maximize.
// step_size = lr/(1-beta1^t), bc2_sqrt = sqrt(1-beta2^t) (host, in f64).
struct AdamHyper {
    float step_size, bc2_sqrt, w1, beta2, w2, eps, decay, wd, grad_scale;
    int flags;
};

template <class G>
__device__ void adam_multi(const u64* __restrict__ tensors, const u64* __restrict__ chunks, i64 chunk_len,
                           AdamHyper h) {
    MultiTensor t = multi_tensor(tensors, chunks, chunk_len);
    const G* g = (const G*)t.g;
    float* m = t.s0;
    float* v = t.s1;
    for (u64 i = t.start + threadIdx.x; i < t.end; i += blockDim.x) {
        float x = t.p[i];
        float gi = to_float(g[i]) * h.grad_scale;
        if (h.flags & 4) gi = -gi;
        if (h.flags & 1) x = x * h.decay;
        if (h.flags & 2) gi += h.wd * x;
        // ATen's lerp(m, g, 1 - beta1).
        float mi = h.w1 < 0.5f ? m[i] + h.w1 * (gi - m[i]) : gi - (gi - m[i]) * (1.0f - h.w1);
        float vi = v[i] * h.beta2 + h.w2 * gi * gi;
        float denom = sqrtf(vi) / h.bc2_sqrt + h.eps;
        m[i] = mi;
        v[i] = vi;
        t.p[i] = x - h.step_size * mi / denom;
    }
}

// SGD. flags: 1 weight decay (g += wd*p), 2 maximize, 4 Nesterov,
// 8 momentum (state0 is the momentum buffer), 16 the buffer is fresh
// (it starts from the gradient).
struct SgdHyper {
    float lr, wd, mu, damp, grad_scale;
    int flags;
};

template <class G>
__device__ void sgd_multi(const u64* __restrict__ tensors, const u64* __restrict__ chunks, i64 chunk_len,
                          SgdHyper h) {
    MultiTensor t = multi_tensor(tensors, chunks, chunk_len);
    const G* g = (const G*)t.g;
    float* buf = t.s0;
    for (u64 i = t.start + threadIdx.x; i < t.end; i += blockDim.x) {
        float x = t.p[i];
        float d = to_float(g[i]) * h.grad_scale;
        if (h.flags & 2) d = -d;
        if (h.flags & 1) d = d + h.wd * x;
        if (h.flags & 8) {
            float nb = (h.flags & 16) ? d : h.mu * buf[i] + h.damp * d;
            buf[i] = nb;
            d = (h.flags & 4) ? d + h.mu * nb : nb;
        }
        t.p[i] = x - h.lr * d;
    }
}

// LAMB (timm `Lamb`, apex FusedLAMB), in two launches over the same
// tables. flags: 1 coupled weight decay (u += wd*x), 2 decoupled (x is first
// decayed to x + neg_lr_wd*x), 4 adapt (the trust ratio |x|/|u| per
// tensor), 8 clip the ratio at 1. `clip` divides the gradients (the global
// gradient-norm clipping, formed on the host); the other scalars are the
// CPU rule's, formed in f64 and rounded once.
struct LambHyper {
    float lr, beta1, beta2, beta3, one_minus_beta2, bc1, bc2_sqrt, eps, wd, neg_lr_wd, clip, grad_scale;
    int flags;
};

__device__ __forceinline__ float lamb_param(const LambHyper& h, float x) {
    return (h.flags & 2) ? x + h.neg_lr_wd * x : x;
}
__device__ __forceinline__ float lamb_update(const LambHyper& h, float x, float m, float v) {
    float denom = sqrtf(v) / h.bc2_sqrt + h.eps;
    float u = (m / h.bc1) / denom;
    return (h.flags & 1) ? u + h.wd * x : u;
}

// Pass 1: the moments, and each chunk's sums of x^2 and u^2 (a fixed tree
// over the block, so any thread order gives the same bits) into
// partials[2*chunk], partials[2*chunk + 1].
template <class G>
__device__ void lamb_moments(const u64* __restrict__ tensors, const u64* __restrict__ chunks, i64 chunk_len,
                             LambHyper h, float* __restrict__ partials) {
    __shared__ float scratch[32];
    MultiTensor t = multi_tensor(tensors, chunks, chunk_len);
    const G* g = (const G*)t.g;
    float* m = t.s0;
    float* v = t.s1;
    float w2 = 0.0f, u2 = 0.0f;
    for (u64 i = t.start + threadIdx.x; i < t.end; i += blockDim.x) {
        float gi = to_float(g[i]) * h.grad_scale;
        gi = gi / h.clip;
        float mi = m[i] * h.beta1 + h.beta3 * gi;
        float vi = v[i] * h.beta2 + h.one_minus_beta2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        if (h.flags & 4) {
            float x = lamb_param(h, t.p[i]);
            float u = lamb_update(h, x, mi, vi);
            w2 += x * x;
            u2 += u * u;
        }
    }
    w2 = block_sum(w2, scratch);
    u2 = block_sum(u2, scratch);
    if (threadIdx.x == 0) {
        partials[2 * blockIdx.x] = w2;
        partials[2 * blockIdx.x + 1] = u2;
    }
}

// Pass 2: thread 0 sums its tensor's chunk partials in chunk order (the
// chunks of a tensor are consecutive in the table) into the trust ratio r
// (1 when either norm is 0, or without adaptation); then x -= lr*(u*r).
template <class G>
__device__ void lamb_apply(const u64* __restrict__ tensors, const u64* __restrict__ chunks, i64 chunk_len,
                           LambHyper h, const float* __restrict__ partials) {
    __shared__ float ratio;
    MultiTensor t = multi_tensor(tensors, chunks, chunk_len);
    if (threadIdx.x == 0) {
        float r = 1.0f;
        if (h.flags & 4) {
            u64 first = blockIdx.x - t.start / (u64)chunk_len, n = (t.len + chunk_len - 1) / (u64)chunk_len;
            float w2 = 0.0f, u2 = 0.0f;
            for (u64 c = 0; c < n; ++c) {
                w2 += partials[2 * (first + c)];
                u2 += partials[2 * (first + c) + 1];
            }
            float wn = sqrtf(w2), un = sqrtf(u2);
            if (wn > 0.0f && un > 0.0f) r = wn / un;
            if (h.flags & 8) r = fminf(r, 1.0f);
        }
        ratio = r;
    }
    __syncthreads();
    float r = ratio;
    for (u64 i = t.start + threadIdx.x; i < t.end; i += blockDim.x) {
        float x = lamb_param(h, t.p[i]);
        t.p[i] = x - h.lr * (lamb_update(h, x, t.s0[i], t.s1[i]) * r);
    }
}

#define OPTIM_DTYPE(G, S)                                                                                   \
    extern "C" __global__ void adam_##S(const u64* tensors, const u64* chunks, i64 chunk_len, AdamHyper h) { \
        adam_multi<G>(tensors, chunks, chunk_len, h);                                                       \
    }                                                                                                       \
    extern "C" __global__ void sgd_##S(const u64* tensors, const u64* chunks, i64 chunk_len, SgdHyper h) {   \
        sgd_multi<G>(tensors, chunks, chunk_len, h);                                                        \
    }                                                                                                       \
    extern "C" __global__ void lamb_moments_##S(const u64* tensors, const u64* chunks, i64 chunk_len,         \
                                                LambHyper h, float* partials) {                             \
        lamb_moments<G>(tensors, chunks, chunk_len, h, partials);                                           \
    }                                                                                                       \
    extern "C" __global__ void lamb_apply_##S(const u64* tensors, const u64* chunks, i64 chunk_len,           \
                                              LambHyper h, const float* partials) {                         \
        lamb_apply<G>(tensors, chunks, chunk_len, h, partials);                                             \
    }
OPTIM_DTYPE(float, f32)
OPTIM_DTYPE(half_t, f16)
OPTIM_DTYPE(bf16_t, bf16)
