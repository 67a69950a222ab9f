// Common header of every kernel family: half types, warp/block reductions and
// the only inline PTX of the crate (mma.sync, ldmatrix, cp.async, cvt), each
// in a small wrapper with a CPU emulation (CUDA_EMU) following the PTX ISA.
// NVRTC compiles it without any CUDA header: nothing here includes one.

typedef unsigned short u16;
typedef long long i64;
typedef unsigned long long u64;

#define NEG_INF (__int_as_float(0xff800000))
#define POS_INF (__int_as_float(0x7f800000))
#define FULL_MASK 0xffffffffu

#ifdef CUDA_EMU
#define DYN_SMEM(T, name) T* name = reinterpret_cast<T*>(EMU_DYN_SMEM())
#else
#define DYN_SMEM(T, name)                                         \
    extern __shared__ __align__(16) unsigned char tessera_smem[]; \
    T* name = reinterpret_cast<T*>(tessera_smem)
#endif

struct __align__(2) half_t {
    u16 bits;
};
struct __align__(2) bf16_t {
    u16 bits;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16_t v) { return __uint_as_float(((unsigned)v.bits) << 16); }

// Round to nearest even; NaN stays a quiet NaN.
__device__ __forceinline__ u16 f32_to_bf16_bits(float f) {
    unsigned x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (u16)(x >> 16);
}

#ifdef CUDA_EMU
inline float half_bits_to_f32(u16 h) {
    unsigned s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? __uint_as_float(0x7fc00000u) : POS_INF;
    else v = ldexpf((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}
inline u16 f32_to_half_bits(float f) {
    unsigned x = __float_as_uint(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (u16)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) return (u16)(sign | 0x7c00u);
    if (ax < 0x38800000u) return (u16)(sign | (unsigned)nearbyintf(__uint_as_float(ax) * 16777216.0f));
    unsigned h = ((((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13)), rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (u16)(sign | h);
}
#else
__device__ __forceinline__ float half_bits_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f32_to_half_bits(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif

__device__ __forceinline__ float to_float(half_t v) { return half_bits_to_f32(v.bits); }

template <class T>
struct Conv;
template <>
struct Conv<float> {
    static __device__ __forceinline__ float from(float v) { return v; }
};
template <>
struct Conv<half_t> {
    static __device__ __forceinline__ half_t from(float v) {
        half_t h;
        h.bits = f32_to_half_bits(v);
        return h;
    }
};
template <>
struct Conv<bf16_t> {
    static __device__ __forceinline__ bf16_t from(float v) {
        bf16_t h;
        h.bits = f32_to_bf16_bits(v);
        return h;
    }
};
template <class T>
__device__ __forceinline__ T from_float(float v) {
    return Conv<T>::from(v);
}

// Two 16-bit values packed into one 32-bit register, low half first.
__device__ __forceinline__ unsigned pack2(u16 lo, u16 hi) { return (unsigned)lo | ((unsigned)hi << 16); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32); every thread gets the
// total. `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    return warp_sum(lane < nw ? scratch[lane] : 0.0f);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    return warp_max(lane < nw ? scratch[lane] : NEG_INF);
}

// ---- inline PTX wrappers ---------------------------------------------------

#ifndef CUDA_EMU
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
#endif

// D = A(16x16, row) * B(16x8, col) + C, f32 accumulate; `BF16` selects bf16
// inputs instead of f16.
template <bool BF16>
__device__ __forceinline__ void mma_16816(float* d, const unsigned* a, const unsigned* b, const float* c) {
#ifdef CUDA_EMU
    uint64_t in[10], out[4];
    for (int i = 0; i < 4; ++i) in[i] = a[i];
    in[4] = b[0];
    in[5] = b[1];
    for (int i = 0; i < 4; ++i) in[6 + i] = __float_as_uint(c[i]);
    emu::warp_collective(BF16 ? emu::OP_MMA_BF16 : emu::OP_MMA_F16, FULL_MASK, __LINE__, in, 10, out, 4);
    for (int i = 0; i < 4; ++i) d[i] = __uint_as_float((unsigned)out[i]);
#else
    if (BF16)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%10,%11,%12,%13};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
              "f"(c[3]));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%10,%11,%12,%13};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
              "f"(c[3]));
#endif
}

// ldmatrix .x4 (four 8x8 b16 matrices); lane l passes the address of row l%8
// of matrix l/8. `TRANS` loads the transposes.
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* row) {
#ifdef CUDA_EMU
    uint64_t in[1] = {(uint64_t)row}, out[4];
    emu::warp_collective(TRANS ? emu::OP_LDMATRIX_X4_T : emu::OP_LDMATRIX_X4, FULL_MASK, __LINE__, in, 1, out, 4);
    for (int i = 0; i < 4; ++i) r[i] = (unsigned)out[i];
#else
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_u32(row)));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_u32(row)));
#endif
}

// 16-byte asynchronous global->shared copy; bytes past `src_bytes` (0..16)
// are zero-filled, which is how edge tiles read zeros past the matrix.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
#ifdef CUDA_EMU
    emu::cp_async(dst, src, 16, src_bytes);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef CUDA_EMU
    emu::cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef CUDA_EMU
    emu::cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}
