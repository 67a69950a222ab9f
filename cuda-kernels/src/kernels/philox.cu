// Philox4x32-10 random numbers, counter based, on tessera-tensor's stream:
// block b of the stream for `seed` is philox(counter = (b as u64, 0), key =
// seed), and word w is lane w%4 of block w/4. Uniforms read one word per
// element, normals one block per pair of elements. The same (seed, offset)
// gives the same numbers as the CPU generator (`crate::philox`, and
// tessera-tensor's `rand`/`randn`).
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

// The significand bits (with the implicit one) of T: a uniform with that
// many random bits is exactly representable in T and never rounds to 1.
template <class T>
struct UnitBits {
    static constexpr int value = 24;
};
template <>
struct UnitBits<half_t> {
    static constexpr int value = 11;
};
template <>
struct UnitBits<bf16_t> {
    static constexpr int value = 8;
};

// The top UnitBits<T> bits of x as a float in [0, 1) (exact in T).
template <class T>
__device__ __forceinline__ float unit_bits(unsigned x) {
    constexpr int d = UnitBits<T>::value;
    return (float)(x >> (32 - d)) * (1.0f / (float)(1u << d));
}

// A 53-bit uniform double in [0, 1) from two words, `hi` first.
__device__ __forceinline__ double unit53(unsigned hi, unsigned lo) {
    return (double)((((u64)hi << 32) | lo) >> 11) * 1.1102230246251565404236316680908203125e-16;
}

// v rounded to float by round-to-odd: truncate, then set the last bit when
// inexact. Rounding that to a narrower type (at least two bits fewer, as f16
// and bf16 are) then gives v correctly rounded to it, as a direct conversion
// from double would: no double-rounding error.
__device__ __forceinline__ float to_float_odd(double v) {
    float f = (float)v;
    if ((double)f == v || v != v) return f;
    unsigned b = __float_as_uint(f);
    if (fabs((double)f) > fabs(v)) b -= 1;
    return __uint_as_float(b | 1u);
}

template <class T>
__device__ __forceinline__ T from_double(double v) {
    return from_float<T>(to_float_odd(v));
}
template <>
__device__ __forceinline__ float from_double<float>(double v) {
    return (float)v;
}

// Thread t makes the four words of counter block offset/4 + t and writes those
// that fall in [offset, offset + n): low + (high - low) * u in f32 with u as
// in unit_bits (exactly u for [0, 1)).
template <class T>
__device__ void philox_uniform(i64 n, u64 seed, u64 offset, float low, float high, T* __restrict__ y) {
    if (n <= 0) return;
    u64 first = offset >> 2, last = (offset + (u64)n - 1) >> 2;
    for (u64 b = first + (u64)blockIdx.x * blockDim.x + threadIdx.x; b <= last; b += (u64)gridDim.x * blockDim.x) {
        Philox4 r = philox_block(seed, b);
        for (int l = 0; l < 4; ++l) {
            u64 w = 4 * b + l;
            if (w >= offset && w < offset + (u64)n) y[w - offset] = from_float<T>(low + (high - low) * unit_bits<T>(r.v[l]));
        }
    }
}

// Elements 2p and 2p+1 come from block `block + p`: Box-Muller in double on
// the 53-bit uniforms u1 = 1 - (words 0, 1) and u2 = (words 2, 3), cos for
// the even element and sin for the odd one, then mean + std * z rounded once
// to T. The _rn intrinsics keep the compiler from fusing into an FMA, which
// the CPU reference does not do.
template <class T>
__device__ void philox_normal(i64 n, u64 seed, u64 block, double mean, double stdv, T* __restrict__ y) {
    i64 pairs = (n + 1) / 2;
    for (i64 p = (i64)blockIdx.x * blockDim.x + threadIdx.x; p < pairs; p += (i64)gridDim.x * blockDim.x) {
        Philox4 r = philox_block(seed, block + (u64)p);
        double u1 = 1.0 - unit53(r.v[0], r.v[1]);
        double u2 = unit53(r.v[2], r.v[3]);
        double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
        y[2 * p] = from_double<T>(__dadd_rn(mean, __dmul_rn(stdv, rad * cos(th))));
        if (2 * p + 1 < n) y[2 * p + 1] = from_double<T>(__dadd_rn(mean, __dmul_rn(stdv, rad * sin(th))));
    }
}

#define PHILOX_DTYPE(T, S)                                                                                   \
    extern "C" __global__ void philox_uniform_##S(i64 n, u64 seed, u64 offset, float lo, float hi, T* y) {    \
        philox_uniform<T>(n, seed, offset, lo, hi, y);                                                       \
    }                                                                                                        \
    extern "C" __global__ void philox_normal_##S(i64 n, u64 seed, u64 block, double mean, double stdv, T* y) { \
        philox_normal<T>(n, seed, block, mean, stdv, y);                                                      \
    }
PHILOX_DTYPE(float, f32)
PHILOX_DTYPE(half_t, f16)
PHILOX_DTYPE(bf16_t, bf16)
