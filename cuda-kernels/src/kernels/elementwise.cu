// Elementwise kernels: unary, binary and `where` over strided, broadcast
// inputs (a stride of 0 broadcasts), with contiguous fast paths; casts
// between f32/f16/bf16; fill. The op is a runtime code (uniform over the
// launch, so the switch costs no divergence) to keep the kernel count small.

#define EW_MAX_DIMS 8

// Output is contiguous with `shape`; input k is read at sum(idx[d]*stride[k][d]).
struct StridedArgs {
    i64 ndim;
    i64 shape[EW_MAX_DIMS];
    i64 stride[3][EW_MAX_DIMS];
};

__device__ __forceinline__ void strided_offsets(const StridedArgs& s, i64 i, int nin, i64* off) {
    for (int k = 0; k < 3; ++k) off[k] = 0;
    for (int d = (int)s.ndim - 1; d >= 0; --d) {
        i64 n = s.shape[d], q = i / n, r = i - q * n;
        for (int k = 0; k < nin; ++k) off[k] += r * s.stride[k][d];
        i = q;
    }
}

__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}

// Codes match `UnaryOp` in src/ops/elementwise.rs.
__device__ __forceinline__ float unary_op(int op, float x) {
    switch (op) {
        case 0: return x;
        case 1: return -x;
        case 2: return fabsf(x);
        case 3: return expf(x);
        case 4: return logf(x);
        case 5: return sqrtf(x);
        case 6: return rsqrtf(x);
        case 7: return x > 0.0f ? x : (x == x ? 0.0f : x);
        case 8: return 1.0f / (1.0f + expf(-x));
        case 9: return tanhf(x);
        case 10: return gelu_erf(x);
        case 11: return gelu_tanh(x);
        case 12: return x / (1.0f + expf(-x));
        case 13: return sinf(x);
        case 14: return cosf(x);
        case 15: return 1.0f / x;
        default: return x * x;
    }
}

// Codes match `BinaryOp` in src/ops/elementwise.rs. max/min propagate NaN.
__device__ __forceinline__ float binary_op(int op, float a, float b) {
    switch (op) {
        case 0: return a + b;
        case 1: return a - b;
        case 2: return a * b;
        case 3: return a / b;
        case 4: return (a != a || b != b) ? a + b : fmaxf(a, b);
        case 5: return (a != a || b != b) ? a + b : fminf(a, b);
        default: return powf(a, b);
    }
}

#define GRID_STRIDE(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

template <class T>
__device__ void unary_contig(int op, i64 n, const T* __restrict__ x, T* __restrict__ y) {
    GRID_STRIDE(i, n) y[i] = from_float<T>(unary_op(op, to_float(x[i])));
}
template <class T>
__device__ void unary_strided(int op, i64 n, const StridedArgs& s, const T* __restrict__ x, T* __restrict__ y) {
    GRID_STRIDE(i, n) {
        i64 off[3];
        strided_offsets(s, i, 1, off);
        y[i] = from_float<T>(unary_op(op, to_float(x[off[0]])));
    }
}
template <class T>
__device__ void binary_contig(int op, i64 n, const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y) {
    GRID_STRIDE(i, n) y[i] = from_float<T>(binary_op(op, to_float(a[i]), to_float(b[i])));
}
template <class T>
__device__ void binary_strided(int op, i64 n, const StridedArgs& s, const T* __restrict__ a, const T* __restrict__ b,
                               T* __restrict__ y) {
    GRID_STRIDE(i, n) {
        i64 off[3];
        strided_offsets(s, i, 2, off);
        y[i] = from_float<T>(binary_op(op, to_float(a[off[0]]), to_float(b[off[1]])));
    }
}
template <class T>
__device__ void where_strided(i64 n, const StridedArgs& s, const unsigned char* __restrict__ c,
                              const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y) {
    GRID_STRIDE(i, n) {
        i64 off[3];
        strided_offsets(s, i, 3, off);
        y[i] = c[off[0]] ? a[off[1]] : b[off[2]];
    }
}
template <class I, class O>
__device__ void cast_contig(i64 n, const I* __restrict__ x, O* __restrict__ y) {
    GRID_STRIDE(i, n) y[i] = from_float<O>(to_float(x[i]));
}
template <class T>
__device__ void fill_contig(i64 n, float v, T* __restrict__ y) {
    T t = from_float<T>(v);
    GRID_STRIDE(i, n) y[i] = t;
}

#define EW_DTYPE(T, S)                                                                                         \
    extern "C" __global__ void unary_contig_##S(int op, i64 n, const T* x, T* y) { unary_contig<T>(op, n, x, y); } \
    extern "C" __global__ void unary_strided_##S(int op, i64 n, StridedArgs s, const T* x, T* y) {              \
        unary_strided<T>(op, n, s, x, y);                                                                      \
    }                                                                                                          \
    extern "C" __global__ void binary_contig_##S(int op, i64 n, const T* a, const T* b, T* y) {                 \
        binary_contig<T>(op, n, a, b, y);                                                                      \
    }                                                                                                          \
    extern "C" __global__ void binary_strided_##S(int op, i64 n, StridedArgs s, const T* a, const T* b, T* y) { \
        binary_strided<T>(op, n, s, a, b, y);                                                                  \
    }                                                                                                          \
    extern "C" __global__ void where_strided_##S(i64 n, StridedArgs s, const unsigned char* c, const T* a,      \
                                                 const T* b, T* y) {                                           \
        where_strided<T>(n, s, c, a, b, y);                                                                    \
    }                                                                                                          \
    extern "C" __global__ void fill_##S(i64 n, float v, T* y) { fill_contig<T>(n, v, y); }

EW_DTYPE(float, f32)
EW_DTYPE(half_t, f16)
EW_DTYPE(bf16_t, bf16)

#define EW_CAST(I, SI, O, SO) \
    extern "C" __global__ void cast_##SI##_##SO(i64 n, const I* x, O* y) { cast_contig<I, O>(n, x, y); }
EW_CAST(float, f32, half_t, f16)
EW_CAST(float, f32, bf16_t, bf16)
EW_CAST(half_t, f16, float, f32)
EW_CAST(bf16_t, bf16, float, f32)
EW_CAST(half_t, f16, bf16_t, bf16)
EW_CAST(bf16_t, bf16, half_t, f16)
