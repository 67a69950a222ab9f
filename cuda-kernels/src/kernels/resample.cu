// Bilinear resampling of planes [H, W] to [OH, OW] (upsample_bilinear2d)
// and its backward. The source coordinates come as per-axis tap tables
// formed on the host by the CPU's own code (PyTorch's source-index and
// lambda rules), so both backends blend with the same weights: output
// (oy, ox) = ly0*(lx0*x[y0,x0] + lx1*x[y0,x1]) + ly1*(lx0*x[y1,x0] + lx1*x[y1,x1]).

struct Tap {
    i64 i0, i1;
    float l0, l1;
};

template <class T>
__device__ void bilinear_fwd(const T* __restrict__ x, T* __restrict__ y, const Tap* __restrict__ ty,
                             const Tap* __restrict__ tx, i64 planes, i64 H, i64 W, i64 OH, i64 OW) {
    i64 per = OH * OW, n = planes * per;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        i64 pl = i / per, r = i - pl * per, oy = r / OW, ox = r - oy * OW;
        const T* src = x + pl * H * W;
        Tap a = ty[oy], b = tx[ox];
        float top = b.l0 * to_float(src[a.i0 * W + b.i0]) + b.l1 * to_float(src[a.i0 * W + b.i1]);
        float bottom = b.l0 * to_float(src[a.i1 * W + b.i0]) + b.l1 * to_float(src[a.i1 * W + b.i1]);
        y[i] = from_float<T>(a.l0 * top + a.l1 * bottom);
    }
}

// One thread per plane spreads each output gradient over its four sources
// in output order into a zeroed f32 `dx` (the CPU's order and accumulator).
template <class T>
__device__ void bilinear_bwd(const T* __restrict__ dy, float* __restrict__ dx, const Tap* __restrict__ ty,
                             const Tap* __restrict__ tx, i64 planes, i64 H, i64 W, i64 OH, i64 OW) {
    for (i64 pl = (i64)blockIdx.x * blockDim.x + threadIdx.x; pl < planes; pl += (i64)gridDim.x * blockDim.x) {
        const T* gp = dy + pl * OH * OW;
        float* g = dx + pl * H * W;
        for (i64 oy = 0; oy < OH; ++oy) {
            Tap a = ty[oy];
            for (i64 ox = 0; ox < OW; ++ox) {
                Tap b = tx[ox];
                float v = to_float(gp[oy * OW + ox]);
                g[a.i0 * W + b.i0] += a.l0 * b.l0 * v;
                g[a.i0 * W + b.i1] += a.l0 * b.l1 * v;
                g[a.i1 * W + b.i0] += a.l1 * b.l0 * v;
                g[a.i1 * W + b.i1] += a.l1 * b.l1 * v;
            }
        }
    }
}

#define RESAMPLE_DTYPE(T, S)                                                                                  \
    extern "C" __global__ void bilinear_fwd_##S(const T* x, T* y, const Tap* ty, const Tap* tx, i64 planes,   \
                                                i64 H, i64 W, i64 OH, i64 OW) {                               \
        bilinear_fwd<T>(x, y, ty, tx, planes, H, W, OH, OW);                                                  \
    }                                                                                                         \
    extern "C" __global__ void bilinear_bwd_##S(const T* dy, float* dx, const Tap* ty, const Tap* tx,         \
                                                i64 planes, i64 H, i64 W, i64 OH, i64 OW) {                   \
        bilinear_bwd<T>(dy, dx, ty, tx, planes, H, W, OH, OW);                                                \
    }
RESAMPLE_DTYPE(float, f32)
RESAMPLE_DTYPE(half_t, f16)
RESAMPLE_DTYPE(bf16_t, bf16)
