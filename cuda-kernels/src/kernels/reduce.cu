// Reductions over one dimension of a contiguous tensor viewed as
// [outer, len, inner]: sum, product, max, min (`ReduceOp`), argmax/argmin, the
// running sum/product (cumsum, cumprod), and top-k/sort of lines. With inner == 1 a warp reduces a
// row (blocks of 8 warps); otherwise a thread walks one (outer, inner) column,
// so neighbouring threads read neighbouring addresses. Accumulation is in f32
// in a fixed order: results do not depend on the schedule.

// Whether (a, ia) beats (b, ib) for argmax (`largest`) or argmin: NaN wins
// either way (max and min propagate NaN); between equal values the lower
// index wins.
__device__ __forceinline__ bool arg_better(float a, i64 ia, float b, i64 ib, int largest) {
    bool an = a != a, bn = b != b;
    if (an || bn) return an && (!bn || ia < ib);
    return (largest ? a > b : a < b) || (a == b && ia < ib);
}

// One identity and one combine per op of `ReduceOp` (src/op_codes.rs); the
// switches are generated from the op list, so an op without its functions
// here is a compile error. max/min propagate NaN.
__device__ __forceinline__ float reduce_init_SUM() { return 0.0f; }
__device__ __forceinline__ float reduce_SUM(float a, float b) { return a + b; }
__device__ __forceinline__ float reduce_init_PROD() { return 1.0f; }
__device__ __forceinline__ float reduce_PROD(float a, float b) { return a * b; }
__device__ __forceinline__ float reduce_init_MAX() { return NEG_INF; }
__device__ __forceinline__ float reduce_MAX(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
__device__ __forceinline__ float reduce_init_MIN() { return POS_INF; }
__device__ __forceinline__ float reduce_MIN(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }

#define REDUCE_INIT_CASE(NAME) \
    case REDUCE_##NAME:        \
        return reduce_init_##NAME();
__device__ __forceinline__ float reduce_init(int op) {
    switch (op) { TESSERA_REDUCE_OPS(REDUCE_INIT_CASE) }
    // Unreachable: the launch wrapper passes only `ReduceOp` codes.
    return __int_as_float(0x7fc00000);
}
#define REDUCE_COMBINE_CASE(NAME) \
    case REDUCE_##NAME:           \
        return reduce_##NAME(a, b);
__device__ __forceinline__ float reduce_combine(int op, float a, float b) {
    switch (op) { TESSERA_REDUCE_OPS(REDUCE_COMBINE_CASE) }
    return __int_as_float(0x7fc00000);
}

template <class T>
__device__ void reduce_rows(int op, const T* __restrict__ x, T* __restrict__ y, i64 outer, i64 len, i64 inner) {
    int lane = threadIdx.x & 31;
    if (inner == 1) {
        i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
        bool valid = row < outer;
        float acc = reduce_init(op);
        if (valid)
            for (i64 r = lane; r < len; r += 32) acc = reduce_combine(op, acc, to_float(x[row * len + r]));
        if (op == REDUCE_SUM) acc = warp_sum(acc);
        else
            for (int o = 16; o > 0; o >>= 1) acc = reduce_combine(op, acc, __shfl_xor_sync(FULL_MASK, acc, o));
        if (valid && lane == 0) y[row] = from_float<T>(acc);
        return;
    }
    for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < outer * inner; c += (i64)gridDim.x * blockDim.x) {
        i64 o = c / inner, i = c - o * inner;
        const T* p = x + o * len * inner + i;
        float acc = reduce_init(op);
        for (i64 r = 0; r < len; ++r) acc = reduce_combine(op, acc, to_float(p[r * inner]));
        y[c] = from_float<T>(acc);
    }
}

template <class T>
__device__ void arg_extreme_rows(int largest, const T* __restrict__ x, i64* __restrict__ y, i64 outer, i64 len, i64 inner) {
    int lane = threadIdx.x & 31;
    if (inner == 1) {
        i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
        bool valid = row < outer;
        float best = NEG_INF;
        i64 bi = len;
        if (valid)
            for (i64 r = lane; r < len; r += 32) {
                float v = to_float(x[row * len + r]);
                if (bi == len || arg_better(v, r, best, bi, largest)) {
                    best = v;
                    bi = r;
                }
            }
        for (int o = 16; o > 0; o >>= 1) {
            float v = __shfl_xor_sync(FULL_MASK, best, o);
            i64 vi = __shfl_xor_sync(FULL_MASK, bi, o);
            if (vi != len && (bi == len || arg_better(v, vi, best, bi, largest))) {
                best = v;
                bi = vi;
            }
        }
        if (valid && lane == 0) y[row] = bi;
        return;
    }
    for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < outer * inner; c += (i64)gridDim.x * blockDim.x) {
        i64 o = c / inner, i = c - o * inner;
        const T* p = x + o * len * inner + i;
        float best = to_float(p[0]);
        i64 bi = 0;
        for (i64 r = 1; r < len; ++r) {
            float v = to_float(p[r * inner]);
            if (arg_better(v, r, best, bi, largest)) {
                best = v;
                bi = r;
            }
        }
        y[c] = bi;
    }
}

// The running reduction (`op` SUM: cumsum, PROD: cumprod) along len: one
// thread per (outer, inner) lane, in index order in f32, each prefix
// rounded to T (the CPU's order and rounding).
template <class T>
__device__ void scan_lanes(int op, const T* __restrict__ x, T* __restrict__ y, i64 outer, i64 len, i64 inner) {
    for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < outer * inner; c += (i64)gridDim.x * blockDim.x) {
        i64 o = c / inner, i = c - o * inner, base = o * len * inner + i;
        float acc = reduce_init(op);
        for (i64 r = 0; r < len; ++r) {
            acc = reduce_combine(op, acc, to_float(x[base + r * inner]));
            y[base + r * inner] = from_float<T>(acc);
        }
    }
}

// a > b in the total order where NaN is above every number (and equal to
// NaN); -0 and 0 are equal.
__device__ __forceinline__ bool total_gt(float a, float b) {
    if (a != a) return b == b;
    if (b != b) return false;
    return a > b;
}

// The first k of each contiguous line of n in the order (value descending
// when `largest`, else ascending; then position): one thread per line keeps
// its best k sorted in the outputs, scanning positions in order, so ties
// stay in position order. O(n*k) per line, as the CPU's small-k path.
template <class T>
__device__ void topk_lines(const T* __restrict__ x, T* __restrict__ vals, i64* __restrict__ idx, i64 lines, i64 n,
                           i64 k, int largest) {
    for (i64 l = (i64)blockIdx.x * blockDim.x + threadIdx.x; l < lines; l += (i64)gridDim.x * blockDim.x) {
        const T* src = x + l * n;
        T* ov = vals + l * k;
        i64* oi = idx + l * k;
        i64 filled = 0;
        for (i64 i = 0; i < n; ++i) {
            float v = to_float(src[i]);
            i64 p = filled;
            while (p > 0 && (largest ? total_gt(v, to_float(ov[p - 1])) : total_gt(to_float(ov[p - 1]), v))) --p;
            if (p >= k) continue;
            for (i64 j = (filled < k ? filled : k - 1); j > p; --j) {
                ov[j] = ov[j - 1];
                oi[j] = oi[j - 1];
            }
            ov[p] = src[i];
            oi[p] = i;
            if (filled < k) ++filled;
        }
    }
}

#define REDUCE_DTYPE(T, S)                                                                                   \
    extern "C" __global__ void reduce_##S(int op, const T* x, T* y, i64 outer, i64 len, i64 inner) {         \
        reduce_rows<T>(op, x, y, outer, len, inner);                                                         \
    }                                                                                                        \
    extern "C" __global__ void arg_extreme_##S(int largest, const T* x, i64* y, i64 outer, i64 len, i64 inner) { \
        arg_extreme_rows<T>(largest, x, y, outer, len, inner);                                               \
    }                                                                                                        \
    extern "C" __global__ void scan_##S(int op, const T* x, T* y, i64 outer, i64 len, i64 inner) {           \
        scan_lanes<T>(op, x, y, outer, len, inner);                                                          \
    }                                                                                                        \
    extern "C" __global__ void topk_##S(const T* x, T* vals, i64* idx, i64 lines, i64 n, i64 k, int largest) { \
        topk_lines<T>(x, vals, idx, lines, n, k, largest);                                                   \
    }
REDUCE_DTYPE(float, f32)
REDUCE_DTYPE(half_t, f16)
REDUCE_DTYPE(bf16_t, bf16)
