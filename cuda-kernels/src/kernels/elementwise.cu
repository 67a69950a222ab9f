// Elementwise kernels: unary, binary, comparisons, clamp and `where` over
// strided, broadcast inputs (a stride of 0 broadcasts), with contiguous fast paths; casts
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

// The predicates of `CompareOp`, on values widened to f32 (exact for every
// float input dtype, bool included, so the comparison is the one in the
// dtype) or on i64 values as they are. The logical ops take non-zero (NaN
// included) as true.
template <class V> __device__ __forceinline__ bool compare_EQ(V a, V b) { return a == b; }
template <class V> __device__ __forceinline__ bool compare_NE(V a, V b) { return a != b; }
template <class V> __device__ __forceinline__ bool compare_LT(V a, V b) { return a < b; }
template <class V> __device__ __forceinline__ bool compare_LE(V a, V b) { return a <= b; }
template <class V> __device__ __forceinline__ bool compare_GT(V a, V b) { return a > b; }
template <class V> __device__ __forceinline__ bool compare_GE(V a, V b) { return a >= b; }
template <class V> __device__ __forceinline__ bool compare_AND(V a, V b) { return (a != V(0)) && (b != V(0)); }
template <class V> __device__ __forceinline__ bool compare_OR(V a, V b) { return (a != V(0)) || (b != V(0)); }
template <class V> __device__ __forceinline__ bool compare_XOR(V a, V b) { return (a != V(0)) != (b != V(0)); }

#define COMPARE_CASE(NAME) \
    case COMPARE_##NAME:   \
        return compare_##NAME<V>(a, b);
template <class V>
__device__ __forceinline__ bool compare_op(int op, V a, V b) {
    switch (op) { TESSERA_COMPARE_OPS(COMPARE_CASE) }
    // Unreachable: the launch wrappers pass only `CompareOp` codes.
    return false;
}

// Bool operands of the comparisons and logical ops, as 0 or 1.
__device__ __forceinline__ float to_float(unsigned char v) { return (float)v; }
// The value a comparison sees: floats and bools widened to f32, i64 as is.
template <class T> __device__ __forceinline__ float cmp_value(T v) { return to_float(v); }
__device__ __forceinline__ i64 cmp_value(i64 v) { return v; }

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
template <class T>
__device__ void compare_strided(int op, i64 n, const StridedArgs& s, const T* __restrict__ a, const T* __restrict__ b,
                                unsigned char* __restrict__ y) {
    GRID_STRIDE(i, n) {
        i64 off[3];
        strided_offsets(s, i, 2, off);
        y[i] = compare_op(op, cmp_value(a[off[0]]), cmp_value(b[off[1]])) ? 1 : 0;
    }
}
// x clamped to [lo, hi] as the CPU's `clamp_to`: NaN stays NaN, lo > hi
// gives hi.
template <class T>
__device__ void clamp_strided(i64 n, const StridedArgs& s, const T* __restrict__ x, T* __restrict__ y, float lo,
                              float hi) {
    GRID_STRIDE(i, n) {
        i64 off[3];
        strided_offsets(s, i, 1, off);
        float v = to_float(x[off[0]]);
        v = v < lo ? lo : v;
        y[i] = from_float<T>(v > hi ? hi : v);
    }
}
#define EW_COMPARE(T, S)                                                                                        \
    extern "C" __global__ void compare_strided_##S(int op, i64 n, StridedArgs s, const T* a, const T* b,       \
                                                   unsigned char* y) {                                         \
        compare_strided<T>(op, n, s, a, b, y);                                                                 \
    }
EW_COMPARE(float, f32)
EW_COMPARE(half_t, f16)
EW_COMPARE(bf16_t, bf16)
EW_COMPARE(i64, i64)
EW_COMPARE(unsigned char, u8)

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
// tril/triu of contiguous [batch, rows, cols]: element (i, j) is kept when
// j - i <= diag (lower) or >= diag (upper), else zero (all-zero bits: 0,
// 0.0 or false in every dtype). By element size, like the copy.
template <class T>
__device__ void tri(i64 n, i64 rows, i64 cols, i64 diag, int lower, const T* __restrict__ x, T* __restrict__ y) {
    GRID_STRIDE(i, n) {
        i64 j = i % cols, r = (i / cols) % rows, off = j - r;
        bool keep = lower ? off <= diag : off >= diag;
        y[i] = keep ? x[i] : T();
    }
}
// y[i] = x[off0(i) + idx[off1(i)] * dim_stride]: index_select and gather
// (stride 0 along the indexed dim in the x layout), any element size. The
// indices are checked by the caller.
template <class T>
__device__ void gather_strided(i64 n, const StridedArgs& s, const T* __restrict__ x, const i64* __restrict__ idx,
                               i64 dim_stride, T* __restrict__ y) {
    GRID_STRIDE(i, n) {
        i64 off[3];
        strided_offsets(s, i, 2, off);
        y[i] = x[off[0] + idx[off[1]] * dim_stride];
    }
}
// scatter / scatter_add along one dim: one thread per lane (a position of
// the index with the scattered dim dropped; s.shape is the lane shape, the
// offsets of s are of src, idx and out), walking the dim in order, so a
// repeated index is written (or accumulated) in the index's row-major
// order, as on the CPU; distinct lanes never meet. `value` (its low
// sizeof(T) bytes) replaces src when `use_value`.
template <class T>
__device__ void scatter_set(i64 lanes, const StridedArgs& s, i64 len, i64 src_step, i64 idx_step, i64 out_step,
                            const T* __restrict__ src, const i64* __restrict__ idx, T* __restrict__ out,
                            int use_value, u64 value) {
    T v = *reinterpret_cast<const T*>(&value);
    GRID_STRIDE(l, lanes) {
        i64 off[3];
        strided_offsets(s, l, 3, off);
        for (i64 i = 0; i < len; ++i)
            out[off[2] + idx[off[1] + i * idx_step] * out_step] = use_value ? v : src[off[0] + i * src_step];
    }
}
template <class T>
__device__ void scatter_add(i64 lanes, const StridedArgs& s, i64 len, i64 src_step, i64 idx_step, i64 out_step,
                            const T* __restrict__ src, const i64* __restrict__ idx, T* __restrict__ out) {
    GRID_STRIDE(l, lanes) {
        i64 off[3];
        strided_offsets(s, l, 3, off);
        for (i64 i = 0; i < len; ++i) {
            T* o = out + off[2] + idx[off[1] + i * idx_step] * out_step;
            *o = from_float<T>(to_float(*o) + to_float(src[off[0] + i * src_step]));
        }
    }
}
#define EW_COPY(T, B)                                                                                             \
    extern "C" __global__ void copy_strided_##B(i64 n, StridedArgs s, const T* x, T* y) { copy_strided<T>(n, s, x, y); } \
    extern "C" __global__ void tri_##B(i64 n, i64 rows, i64 cols, i64 diag, int lower, const T* x, T* y) {        \
        tri<T>(n, rows, cols, diag, lower, x, y);                                                                 \
    }                                                                                                             \
    extern "C" __global__ void gather_strided_##B(i64 n, StridedArgs s, const T* x, const i64* idx, i64 dim_stride, \
                                                  T* y) {                                                         \
        gather_strided<T>(n, s, x, idx, dim_stride, y);                                                           \
    }                                                                                                             \
    extern "C" __global__ void scatter_##B(i64 lanes, StridedArgs s, i64 len, i64 src_step, i64 idx_step,         \
                                           i64 out_step, const T* src, const i64* idx, T* out, int use_value,     \
                                           u64 value) {                                                           \
        scatter_set<T>(lanes, s, len, src_step, idx_step, out_step, src, idx, out, use_value, value);             \
    }                                                                                                             \
    extern "C" __global__ void where_strided_##B(i64 n, StridedArgs s, const unsigned char* c, const T* a,         \
                                                 const T* b, T* y) {                                              \
        where_strided<T>(n, s, c, a, b, y);                                                                       \
    }
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
    extern "C" __global__ void fill_##S(i64 n, float v, T* y) { fill_contig<T>(n, v, y); }                     \
    extern "C" __global__ void clamp_strided_##S(i64 n, StridedArgs s, const T* x, T* y, float lo, float hi) {  \
        clamp_strided<T>(n, s, x, y, lo, hi);                                                                  \
    }                                                                                                          \
    extern "C" __global__ void scatter_add_##S(i64 lanes, StridedArgs s, i64 len, i64 src_step, i64 idx_step,   \
                                               i64 out_step, const T* src, const i64* idx, T* out) {           \
        scatter_add<T>(lanes, s, len, src_step, idx_step, out_step, src, idx, out);                            \
    }

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
