// 2-D max and average pooling over planes of [H, W] (one plane per (n, c)): the forward
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

// Average pooling over planes of [H, W], PyTorch's windows: regular
// (`adaptive` 0) window o covers [o*S - P, o*S - P + K) clipped to the padded
// input, then to the input, and is divided by `divisor` when it is non-zero
// (divisor_override), else by the padded window (`include_pad`) or by the
// input elements in it; a window entirely in the padding gives 0. Adaptive
// (`adaptive` 1) window o of OUT covers [floor(o*N/OUT), ceil((o+1)*N/OUT))
// and is divided by its size.
struct AvgGeom {
    i64 planes;
    int H, W, OH, OW, KH, KW, SH, SW, PH, PW, adaptive, include_pad, divisor, unused;
};

// The input range [lo, hi) of window `o` along a dim of `size` (kernel
// `k`, stride `s`, padding `p`, `out` windows) and its padded length.
__device__ __forceinline__ void avg_range(const AvgGeom& g, int o, int size, int out, int k, int s, int p, int* lo,
                                          int* hi, int* full) {
    if (g.adaptive) {
        *lo = (int)((i64)o * size / out);
        *hi = (int)(((i64)(o + 1) * size + out - 1) / out);
        *full = *hi - *lo;
        return;
    }
    int start = o * s - p;
    int end = start + k < size + p ? start + k : size + p;
    *full = end - start;
    *lo = start > 0 ? start : 0;
    *hi = end < size ? end : size;
}

// The divisor of window (oy, ox), or 0 when it holds no input element.
__device__ __forceinline__ float avg_window(const AvgGeom& g, int oy, int ox, int* y0, int* y1, int* x0, int* x1) {
    int fh, fw;
    avg_range(g, oy, g.H, g.OH, g.KH, g.SH, g.PH, y0, y1, &fh);
    avg_range(g, ox, g.W, g.OW, g.KW, g.SW, g.PW, x0, x1, &fw);
    if (*y0 >= *y1 || *x0 >= *x1) return 0.0f;
    if (g.divisor) return (float)g.divisor;
    if (g.include_pad) return (float)(fh * fw);
    return (float)((*y1 - *y0) * (*x1 - *x0));
}

// One thread per output: the window's sum in row-major order, then one
// division (the CPU kernel's order and rounding).
template <class T>
__device__ void avgpool_fwd(const T* __restrict__ x, T* __restrict__ y, AvgGeom g) {
    i64 per = (i64)g.OH * g.OW, n = g.planes * per;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        i64 pl = i / per, r = i - pl * per;
        int oy = (int)(r / g.OW), ox = (int)(r % g.OW), y0, y1, x0, x1;
        float div = avg_window(g, oy, ox, &y0, &y1, &x0, &x1);
        const T* src = x + pl * g.H * g.W;
        float sum = 0.0f;
        if (div != 0.0f)
            for (int yy = y0; yy < y1; ++yy)
                for (int xx = x0; xx < x1; ++xx) sum += to_float(src[(i64)yy * g.W + xx]);
        y[i] = from_float<T>(div != 0.0f ? sum / div : 0.0f);
    }
}

// The first window along a dim whose range can hold input index `v`.
__device__ __forceinline__ int avg_first(const AvgGeom& g, int v, int size, int out, int k, int s, int p) {
    if (g.adaptive) return (int)((i64)v * out / size);
    return v + p >= k ? (v + p - k) / s + 1 : 0;
}

// One thread per input element gathers dy/divisor of every window holding
// it, windows in output order: the additions of the CPU's per-plane scatter,
// in its order, so both give the same bits.
template <class T>
__device__ void avgpool_bwd(const T* __restrict__ dy, T* __restrict__ dx, AvgGeom g) {
    i64 per = (i64)g.H * g.W, n = g.planes * per;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        i64 pl = i / per, r = i - pl * per;
        int iy = (int)(r / g.W), ix = (int)(r % g.W);
        int oy0 = avg_first(g, iy, g.H, g.OH, g.KH, g.SH, g.PH);
        int ox0 = avg_first(g, ix, g.W, g.OW, g.KW, g.SW, g.PW);
        const T* gp = dy + pl * g.OH * g.OW;
        float acc = 0.0f;
        for (int oy = oy0; oy < g.OH; ++oy) {
            int y0, y1, x0, x1;
            float div = avg_window(g, oy, 0, &y0, &y1, &x0, &x1);
            if (y0 > iy) break;
            if (iy >= y1) continue;
            for (int ox = ox0; ox < g.OW; ++ox) {
                div = avg_window(g, oy, ox, &y0, &y1, &x0, &x1);
                if (x0 > ix) break;
                if (div == 0.0f || ix >= x1) continue;
                acc += to_float(gp[(i64)oy * g.OW + ox]) / div;
            }
        }
        dx[i] = from_float<T>(acc);
    }
}

#define POOL_DTYPE(T, S)                                                                          \
    extern "C" __global__ void maxpool_fwd_##S(const T* x, T* y, i64* idx, PoolGeom g) {          \
        maxpool_fwd<T>(x, y, idx, g);                                                             \
    }                                                                                             \
    extern "C" __global__ void maxpool_bwd_##S(const T* dy, const i64* idx, float* dx, i64 planes, i64 plane, \
                                               i64 outs) {                                                     \
        maxpool_bwd<T>(dy, idx, dx, planes, plane, outs);                                                      \
    }                                                                                                          \
    extern "C" __global__ void avgpool_fwd_##S(const T* x, T* y, AvgGeom g) { avgpool_fwd<T>(x, y, g); }      \
    extern "C" __global__ void avgpool_bwd_##S(const T* dy, T* dx, AvgGeom g) { avgpool_bwd<T>(dy, dx, g); }
POOL_DTYPE(float, f32)
POOL_DTYPE(half_t, f16)
POOL_DTYPE(bf16_t, bf16)
