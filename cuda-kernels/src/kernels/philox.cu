// Philox4x32-10 random numbers, counter based: word w of the stream for
// `seed` is lane w%4 of philox(counter = (w/4 as u64, 0), key = seed). The
// same (seed, offset) gives the same numbers as `crate::philox` on the CPU.

struct Philox4 {
    unsigned v[4];
};

__device__ __forceinline__ Philox4 philox4x32_10(unsigned c0, unsigned c1, unsigned c2, unsigned c3, unsigned k0,
                                                 unsigned k1) {
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        unsigned hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        unsigned hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        unsigned n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    Philox4 out;
    out.v[0] = c0;
    out.v[1] = c1;
    out.v[2] = c2;
    out.v[3] = c3;
    return out;
}

__device__ __forceinline__ Philox4 philox_block(u64 seed, u64 block) {
    return philox4x32_10((unsigned)block, (unsigned)(block >> 32), 0u, 0u, (unsigned)seed, (unsigned)(seed >> 32));
}

// Top 24 bits as a float in [0, 1).
__device__ __forceinline__ float u32_to_unit(unsigned x) { return (float)(x >> 8) * 5.9604644775390625e-8f; }

// Thread t makes the four words of counter block offset/4 + t and writes those
// that fall in [offset, offset + n).
template <class T>
__device__ void philox_uniform(i64 n, u64 seed, u64 offset, float low, float high, T* __restrict__ y) {
    if (n <= 0) return;
    u64 first = offset >> 2, last = (offset + (u64)n - 1) >> 2;
    for (u64 b = first + (u64)blockIdx.x * blockDim.x + threadIdx.x; b <= last; b += (u64)gridDim.x * blockDim.x) {
        Philox4 r = philox_block(seed, b);
        for (int l = 0; l < 4; ++l) {
            u64 w = 4 * b + l;
            if (w >= offset && w < offset + (u64)n) y[w - offset] = from_float<T>(low + (high - low) * u32_to_unit(r.v[l]));
        }
    }
}

// Box-Muller on word pairs (2p, 2p+1): cos for the even word, sin for the odd.
template <class T>
__device__ void philox_normal(i64 n, u64 seed, u64 offset, float mean, float stdv, T* __restrict__ y) {
    if (n <= 0) return;
    u64 first = offset >> 2, last = (offset + (u64)n - 1) >> 2;
    for (u64 b = first + (u64)blockIdx.x * blockDim.x + threadIdx.x; b <= last; b += (u64)gridDim.x * blockDim.x) {
        Philox4 r = philox_block(seed, b);
        for (int p = 0; p < 2; ++p) {
            float u1 = (float)((r.v[2 * p] >> 8) + 1) * 5.9604644775390625e-8f;
            float u2 = u32_to_unit(r.v[2 * p + 1]);
            float rad = sqrtf(-2.0f * logf(u1)), th = 6.2831853071795865f * u2;
            float z[2] = {rad * cosf(th), rad * sinf(th)};
            for (int l = 0; l < 2; ++l) {
                u64 w = 4 * b + 2 * p + l;
                if (w >= offset && w < offset + (u64)n) y[w - offset] = from_float<T>(mean + stdv * z[l]);
            }
        }
    }
}

#define PHILOX_DTYPE(T, S)                                                                                   \
    extern "C" __global__ void philox_uniform_##S(i64 n, u64 seed, u64 offset, float lo, float hi, T* y) {    \
        philox_uniform<T>(n, seed, offset, lo, hi, y);                                                       \
    }                                                                                                        \
    extern "C" __global__ void philox_normal_##S(i64 n, u64 seed, u64 offset, float mean, float stdv, T* y) { \
        philox_normal<T>(n, seed, offset, mean, stdv, y);                                                    \
    }
PHILOX_DTYPE(float, f32)
PHILOX_DTYPE(half_t, f16)
PHILOX_DTYPE(bf16_t, bf16)
