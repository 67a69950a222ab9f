// Elementwise kernels: unary, binary and `where` over strided, broadcast
// inputs (a stride of 0 broadcasts), with contiguous fast paths; casts
// between f32/f16/bf16; fill; a strided copy of any element size. The op is a runtime code (uniform over the
// launch, so the switch costs no divergence) to keep the kernel count small;
// the codes come from the generated op header (src/op_codes.rs).

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

// One function per op of `UnaryOp` / `BinaryOp` (src/op_codes.rs); the
// switches below are generated from the op list, so an op without its
// function here is a compile error, and no code falls through to another op.
__device__ __forceinline__ float unary_IDENTITY(float x) { return x; }
__device__ __forceinline__ float unary_NEG(float x) { return -x; }
__device__ __forceinline__ float unary_ABS(float x) { return fabsf(x); }
__device__ __forceinline__ float unary_SIGN(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f); }
__device__ __forceinline__ float unary_SQUARE(float x) { return x * x; }
__device__ __forceinline__ float unary_RELU(float x) { return x > 0.0f ? x : (x == x ? 0.0f : x); }
__device__ __forceinline__ float unary_FLOOR(float x) { return floorf(x); }
__device__ __forceinline__ float unary_CEIL(float x) { return ceilf(x); }
__device__ __forceinline__ float unary_ROUND(float x) { return rintf(x); }
__device__ __forceinline__ float unary_EXP(float x) { return expf(x); }
__device__ __forceinline__ float unary_LOG(float x) { return logf(x); }
__device__ __forceinline__ float unary_LOG1P(float x) { return log1pf(x); }
__device__ __forceinline__ float unary_EXPM1(float x) { return expm1f(x); }
__device__ __forceinline__ float unary_SQRT(float x) { return sqrtf(x); }
__device__ __forceinline__ float unary_RSQRT(float x) { return rsqrtf(x); }
__device__ __forceinline__ float unary_RECIP(float x) { return 1.0f / x; }
__device__ __forceinline__ float unary_SIN(float x) { return sinf(x); }
__device__ __forceinline__ float unary_COS(float x) { return cosf(x); }
__device__ __forceinline__ float unary_TANH(float x) { return tanhf(x); }
__device__ __forceinline__ float unary_SIGMOID(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float unary_GELU_ERF(float x) { return gelu_erf(x); }
__device__ __forceinline__ float unary_GELU_TANH(float x) { return gelu_tanh(x); }
__device__ __forceinline__ float unary_SILU(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float unary_ERF(float x) { return erff(x); }

#define UNARY_CASE(NAME) \
    case UNARY_##NAME:   \
        return unary_##NAME(x);
__device__ __forceinline__ float unary_op(int op, float x) {
    switch (op) { TESSERA_UNARY_OPS(UNARY_CASE) }
    // Unreachable: the launch wrappers pass only `UnaryOp` codes.
    return __int_as_float(0x7fc00000);
}

// max/min propagate NaN.
__device__ __forceinline__ float binary_ADD(float a, float b) { return a + b; }
__device__ __forceinline__ float binary_SUB(float a, float b) { return a - b; }
__device__ __forceinline__ float binary_MUL(float a, float b) { return a * b; }
__device__ __forceinline__ float binary_DIV(float a, float b) { return a / b; }
__device__ __forceinline__ float binary_MAXIMUM(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
__device__ __forceinline__ float binary_MINIMUM(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }
__device__ __forceinline__ float binary_POW(float a, float b) { return powf(a, b); }
// The fused derivative rules: (g, x) or (g, y), written as the CPU kernels
// write them so both round alike.
__device__ __forceinline__ float binary_GELU_ERF_BACKWARD(float g, float x) {
    float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    float pdf = expf(-0.5f * x * x) * 0.39894228040143268f;
    return g * (cdf + x * pdf);
}
__device__ __forceinline__ float binary_GELU_TANH_BACKWARD(float g, float x) {
    float k = 0.79788456080286536f;
    float inner = k * (x + 0.044715f * x * x * x);
    float t = tanhf(inner);
    float dinner = k * (1.0f + 3.0f * 0.044715f * x * x);
    return g * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner);
}
__device__ __forceinline__ float binary_SILU_BACKWARD(float g, float x) {
    float s = 1.0f / (1.0f + expf(-x));
    return g * (s * (1.0f + x * (1.0f - s)));
}
__device__ __forceinline__ float binary_SIGMOID_BACKWARD(float g, float y) { return g * (y * (1.0f - y)); }
__device__ __forceinline__ float binary_TANH_BACKWARD(float g, float y) { return g * (1.0f - y * y); }
__device__ __forceinline__ float binary_RELU_BACKWARD(float g, float y) { return y > 0.0f ? g : 0.0f; }
__device__ __forceinline__ float binary_ABS_BACKWARD(float g, float x) {
    return x > 0.0f ? g : (x < 0.0f ? -g : 0.0f);
}

#define BINARY_CASE(NAME) \
    case BINARY_##NAME:   \
        return binary_##NAME(a, b);
__device__ __forceinline__ float binary_op(int op, float a, float b) {
    switch (op) { TESSERA_BINARY_OPS(BINARY_CASE) }
    // Unreachable: the launch wrappers pass only `BinaryOp` codes.
    return __int_as_float(0x7fc00000);
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

// y[off1(i)] = x[off0(i)]: a copy between any two layouts of one shape
// (the destination must not overlap itself). By element size, so every
// dtype has it: the gradient of a view, `cat`, `contiguous` of integers.
template <class T>
__device__ void copy_strided(i64 n, const StridedArgs& s, const T* __restrict__ x, T* __restrict__ y) {
    GRID_STRIDE(i, n) {
        i64 off[3];
        strided_offsets(s, i, 2, off);
        y[off[1]] = x[off[0]];
    }
}
#define EW_COPY(T, B) \
    extern "C" __global__ void copy_strided_##B(i64 n, StridedArgs s, const T* x, T* y) { copy_strided<T>(n, s, x, y); }
EW_COPY(unsigned char, b1)
EW_COPY(unsigned short, b2)
EW_COPY(unsigned int, b4)
EW_COPY(u64, b8)

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
