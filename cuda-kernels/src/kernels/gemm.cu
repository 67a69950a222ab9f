// Tensor-core GEMM: C[b] = op(A[b]) * op(B[b]) with f16/bf16 inputs, f32
// accumulation and output in the input type. op(A) is M x K (A stored
// row-major M x K with leading dim lda, or K x M when TA), op(B) is K x N
// (stored K x N, or N x K when TB). Batch b = blockIdx.z with element strides
// sa/sb/sc (0 broadcasts an operand).
//
// Block tile 128x128x32, 8 warps (2 along M x 4 along N), warp tile 64x32 =
// 4x4 mma.sync.m16n8k16. Operands go global -> shared through a 3-stage
// cp.async pipeline (16-byte chunks, zero-filled past the edges) when
// `aligned` (leading dims, batch strides and base pointers are multiples of 8
// elements); otherwise through plain loads. Fragments come from shared memory
// with ldmatrix (.trans where the stored orientation is the transpose of the
// fragment's). Shared rows are padded by 8 elements so ldmatrix rows fall in
// different banks.

#define G_BM 128
#define G_BN 128
#define G_BK 32
#define G_STAGES 3
#define G_PAD 8
#define G_THREADS 256

// Elements per stage of an operand tile: [BM][BK+PAD] (k contiguous) or
// [BK][BM+PAD] (m contiguous, TA), whichever is larger; B likewise (BN == BM).
#define G_TILE_ELEMS (G_BM * (G_BK + G_PAD) > G_BK * (G_BM + G_PAD) ? G_BM * (G_BK + G_PAD) : G_BK * (G_BM + G_PAD))
#define G_A_ELEMS G_TILE_ELEMS
#define G_B_ELEMS G_TILE_ELEMS

// Loads one operand tile: `rows` x `cols` of a matrix stored with `cols`
// contiguous, starting at (r0, c0), valid up to (R, C); into shared memory
// with row pitch `pitch`.
template <class T>
__device__ __forceinline__ void load_tile(T* __restrict__ dst, const T* __restrict__ src, i64 ld, int r0, int c0,
                                          int R, int C, int rows, int cols, int pitch, bool aligned) {
    int chunks_per_row = cols / 8, total = rows * chunks_per_row;
    for (int q = threadIdx.x; q < total; q += G_THREADS) {
        int r = q / chunks_per_row, c = (q % chunks_per_row) * 8;
        int gr = r0 + r, gc = c0 + c;
        T* d = dst + r * pitch + c;
        if (aligned) {
            int n = (gr < R && gc < C) ? min(8, C - gc) : 0;
            cp_async16(d, n > 0 ? (const void*)(src + gr * ld + gc) : (const void*)src, n * 2);
        } else {
            for (int e = 0; e < 8; ++e) {
                T v;
                v.bits = 0;
                if (gr < R && gc + e < C) v = src[gr * ld + gc + e];
                d[e] = v;
            }
        }
    }
}

template <class T, bool BF16, bool TA, bool TB>
__device__ void gemm_kernel(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N, int K,
                            i64 lda, i64 ldb, i64 ldc, i64 sa, i64 sb, i64 sc, int aligned) {
    DYN_SMEM(T, smem);
    T* sA = smem;
    T* sB = smem + G_STAGES * G_A_ELEMS;
    A += blockIdx.z * sa;
    B += blockIdx.z * sb;
    C += blockIdx.z * sc;
    int bm = blockIdx.y * G_BM, bn = blockIdx.x * G_BN;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
    int ktiles = (K + G_BK - 1) / G_BK;

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    auto load_stage = [&](int stage, int kt) {
        int k0 = kt * G_BK;
        T* a = sA + stage * G_A_ELEMS;
        T* b = sB + stage * G_B_ELEMS;
        if (TA) load_tile(a, A, lda, k0, bm, K, M, G_BK, G_BM, G_BM + G_PAD, aligned);
        else load_tile(a, A, lda, bm, k0, M, K, G_BM, G_BK, G_BK + G_PAD, aligned);
        if (TB) load_tile(b, B, ldb, bn, k0, N, K, G_BN, G_BK, G_BK + G_PAD, aligned);
        else load_tile(b, B, ldb, k0, bn, K, N, G_BK, G_BN, G_BN + G_PAD, aligned);
    };

    for (int s = 0; s < G_STAGES - 1; ++s) {
        if (s < ktiles) load_stage(s, s);
        cp_async_commit();
    }
    int mi8 = lane >> 3, r8 = lane & 7;
    for (int kt = 0; kt < ktiles; ++kt) {
        cp_async_wait<G_STAGES - 2>();
        __syncthreads();
        int next = kt + G_STAGES - 1;
        if (next < ktiles) load_stage(next % G_STAGES, next);
        cp_async_commit();
        const T* a = sA + (kt % G_STAGES) * G_A_ELEMS;
        const T* b = sB + (kt % G_STAGES) * G_B_ELEMS;
#pragma unroll
        for (int kk = 0; kk < G_BK; kk += 16) {
            unsigned af[4][4], bfr[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                int m0 = wm + i * 16;
                const T* p;
                if (TA) p = a + (kk + r8 + (mi8 >> 1) * 8) * (G_BM + G_PAD) + m0 + (mi8 & 1) * 8;
                else p = a + (m0 + r8 + (mi8 & 1) * 8) * (G_BK + G_PAD) + kk + (mi8 >> 1) * 8;
                ldmatrix_x4<TA>(af[i], p);
            }
#pragma unroll
            for (int j = 0; j < 4; j += 2) {
                int n0 = wn + j * 8;
                const T* p;
                if (TB) p = b + (n0 + r8 + (mi8 >> 1) * 8) * (G_BK + G_PAD) + kk + (mi8 & 1) * 8;
                else p = b + (kk + r8 + (mi8 & 1) * 8) * (G_BN + G_PAD) + n0 + (mi8 >> 1) * 8;
                unsigned r[4];
                ldmatrix_x4<!TB>(r, p);
                bfr[j][0] = r[0];
                bfr[j][1] = r[1];
                bfr[j + 1][0] = r[2];
                bfr[j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma_16816<BF16>(acc[i][j], af[i], bfr[j], acc[i][j]);
        }
    }
    cp_async_wait<0>();

    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int row = bm + wm + i * 16 + g + ((e & 2) ? 8 : 0);
                int col = bn + wn + j * 8 + 2 * t + (e & 1);
                if (row < M && col < N) C[(i64)row * ldc + col] = from_float<T>(acc[i][j][e]);
            }
}

#define GEMM_VARIANT(T, S, BF, TA, TB, NAME)                                                                   \
    extern "C" __global__ void __launch_bounds__(G_THREADS) gemm_##S##_##NAME(                                 \
        const T* A, const T* B, T* C, int M, int N, int K, i64 lda, i64 ldb, i64 ldc, i64 sa, i64 sb, i64 sc,  \
        int aligned) {                                                                                         \
        gemm_kernel<T, BF, TA, TB>(A, B, C, M, N, K, lda, ldb, ldc, sa, sb, sc, aligned);                      \
    }
#define GEMM_DTYPE(T, S, BF)                   \
    GEMM_VARIANT(T, S, BF, false, false, nn)   \
    GEMM_VARIANT(T, S, BF, false, true, nt)    \
    GEMM_VARIANT(T, S, BF, true, false, tn)    \
    GEMM_VARIANT(T, S, BF, true, true, tt)
GEMM_DTYPE(half_t, f16, false)
GEMM_DTYPE(bf16_t, bf16, true)
