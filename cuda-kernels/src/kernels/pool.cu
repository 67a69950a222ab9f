// 2-D max pooling over planes of [H, W] (one plane per (n, c)): the forward
// writes each window's maximum and the index (y*W + x) in its plane, the
// backward adds each output gradient at the index it names. Windows follow
// PyTorch: window (oy, ox) starts at (oy*SH - PH, ox*SW - PW) and taps every
// DH-th row and DW-th column; a NaN is the maximum (the last NaN wins, as
// the CPU kernel's `v > best || v != v`).

struct PoolGeom {
    i64 planes;
    int H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW;
};

// The first tap at or after `start` (stepping by `dil` out of the padding)
// and the end of the taps of a window of `k` taps in a dim of `size`.
__device__ __forceinline__ void pool_taps(int start, int k, int dil, int size, int* first, int* end) {
    int f = start;
    while (f < 0) f += dil;
    int e = start + (k - 1) * dil + 1;
    *first = f;
    *end = e < size ? e : size;
}

template <class T>
__device__ void maxpool_fwd(const T* __restrict__ x, T* __restrict__ y, i64* __restrict__ idx, PoolGeom g) {
    i64 per = (i64)g.OH * g.OW, n = g.planes * per;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        i64 pl = i / per, r = i - pl * per;
        int oy = (int)(r / g.OW), ox = (int)(r % g.OW);
        const T* src = x + pl * g.H * g.W;
        int y0, y1, x0, x1;
        pool_taps(oy * g.SH - g.PH, g.KH, g.DH, g.H, &y0, &y1);
        pool_taps(ox * g.SW - g.PW, g.KW, g.DW, g.W, &x0, &x1);
        float best = NEG_INF;
        i64 bi = (i64)y0 * g.W + x0;
        for (int yy = y0; yy < y1; yy += g.DH) {
            for (int xx = x0; xx < x1; xx += g.DW) {
                float v = to_float(src[(i64)yy * g.W + xx]);
                if (v > best || v != v) {
                    best = v;
                    bi = (i64)yy * g.W + xx;
                }
            }
        }
        y[i] = from_float<T>(best);
        idx[i] = bi;
    }
}

// One thread per plane scatters the plane's output gradients in output
// order into a zeroed f32 `dx` (the CPU kernel's order and accumulator, so
// both give the same bits); indices outside the plane add nothing.
template <class T>
__device__ void maxpool_bwd(const T* __restrict__ dy, const i64* __restrict__ idx, float* __restrict__ dx, i64 planes,
                            i64 plane, i64 outs) {
    for (i64 pl = (i64)blockIdx.x * blockDim.x + threadIdx.x; pl < planes; pl += (i64)gridDim.x * blockDim.x) {
        const i64* ip = idx + pl * outs;
        const T* gp = dy + pl * outs;
        float* d = dx + pl * plane;
        for (i64 j = 0; j < outs; ++j) {
            i64 i = ip[j];
            if (i >= 0 && i < plane) d[i] += to_float(gp[j]);
        }
    }
}

#define POOL_DTYPE(T, S)                                                                          \
    extern "C" __global__ void maxpool_fwd_##S(const T* x, T* y, i64* idx, PoolGeom g) {          \
        maxpool_fwd<T>(x, y, idx, g);                                                             \
    }                                                                                             \
    extern "C" __global__ void maxpool_bwd_##S(const T* dy, const i64* idx, float* dx, i64 planes, i64 plane, \
                                               i64 outs) {                                                     \
        maxpool_bwd<T>(dy, idx, dx, planes, plane, outs);                                                      \
    }
POOL_DTYPE(float, f32)
POOL_DTYPE(half_t, f16)
POOL_DTYPE(bf16_t, bf16)
