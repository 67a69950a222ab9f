// Reductions over one dimension of a contiguous tensor viewed as
// [outer, len, inner]: sum, product, max, min (`ReduceOp`) and argmax. With inner == 1 a warp reduces a
// row (blocks of 8 warps); otherwise a thread walks one (outer, inner) column,
// so neighbouring threads read neighbouring addresses. Accumulation is in f32
// in a fixed order: results do not depend on the schedule.

// NaN wins (max propagates NaN); between equal values the lower index wins.
__device__ __forceinline__ bool arg_better(float a, i64 ia, float b, i64 ib) {
    bool an = a != a, bn = b != b;
    if (an || bn) return an && (!bn || ia < ib);
    return a > b || (a == b && ia < ib);
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
__device__ void argmax_rows(const T* __restrict__ x, i64* __restrict__ y, i64 outer, i64 len, i64 inner) {
    int lane = threadIdx.x & 31;
    if (inner == 1) {
        i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
        bool valid = row < outer;
        float best = NEG_INF;
        i64 bi = len;
        if (valid)
            for (i64 r = lane; r < len; r += 32) {
                float v = to_float(x[row * len + r]);
                if (bi == len || arg_better(v, r, best, bi)) {
                    best = v;
                    bi = r;
                }
            }
        for (int o = 16; o > 0; o >>= 1) {
            float v = __shfl_xor_sync(FULL_MASK, best, o);
            i64 vi = __shfl_xor_sync(FULL_MASK, bi, o);
            if (vi != len && (bi == len || arg_better(v, vi, best, bi))) {
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
            if (arg_better(v, r, best, bi)) {
                best = v;
                bi = r;
            }
        }
        y[c] = bi;
    }
}

#define REDUCE_DTYPE(T, S)                                                                                   \
    extern "C" __global__ void reduce_##S(int op, const T* x, T* y, i64 outer, i64 len, i64 inner) {         \
        reduce_rows<T>(op, x, y, outer, len, inner);                                                         \
    }                                                                                                        \
    extern "C" __global__ void argmax_##S(const T* x, i64* y, i64 outer, i64 len, i64 inner) {               \
        argmax_rows<T>(x, y, outer, len, inner);                                                             \
    }
REDUCE_DTYPE(float, f32)
REDUCE_DTYPE(half_t, f16)
REDUCE_DTYPE(bf16_t, bf16)
