// im2col / col2im for 2-D convolution. Per image (blockIdx.y), x is
// [C, H, W] and col is [C*KH*KW, OH*OW] with row (c, ki, kj) and column
// (oy, ox) holding x[c, oy*sh - ph + ki*dh, ox*sw - pw + kj*dw] (0 outside).
// col2im sums, for each input pixel, every column entry that read it (a
// gather, so no atomics and a fixed summation order).

struct ConvGeom {
    int C, H, W, KH, KW, PH, PW, SH, SW, DH, DW, OH, OW;
};

template <class T>
__device__ void im2col(const T* __restrict__ x, T* __restrict__ col, ConvGeom g) {
    i64 cols = (i64)g.OH * g.OW, total = (i64)g.C * g.KH * g.KW * cols;
    x += (i64)blockIdx.y * g.C * g.H * g.W;
    col += (i64)blockIdx.y * total;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        i64 row = e / cols, p = e - row * cols;
        int oy = (int)(p / g.OW), ox = (int)(p % g.OW);
        int kj = (int)(row % g.KW), ki = (int)((row / g.KW) % g.KH), c = (int)(row / ((i64)g.KW * g.KH));
        int y = oy * g.SH - g.PH + ki * g.DH, xx = ox * g.SW - g.PW + kj * g.DW;
        col[e] = (y >= 0 && y < g.H && xx >= 0 && xx < g.W) ? x[((i64)c * g.H + y) * g.W + xx] : from_float<T>(0.0f);
    }
}

template <class T>
__device__ void col2im(const T* __restrict__ col, T* __restrict__ x, ConvGeom g) {
    i64 cols = (i64)g.OH * g.OW, npix = (i64)g.C * g.H * g.W;
    col += (i64)blockIdx.y * g.C * g.KH * g.KW * cols;
    x += (i64)blockIdx.y * npix;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < npix; e += (i64)gridDim.x * blockDim.x) {
        int xx = (int)(e % g.W), y = (int)((e / g.W) % g.H), c = (int)(e / ((i64)g.W * g.H));
        float s = 0.0f;
        for (int ki = 0; ki < g.KH; ++ki) {
            int ty = y + g.PH - ki * g.DH;
            if (ty < 0 || ty % g.SH != 0 || ty / g.SH >= g.OH) continue;
            for (int kj = 0; kj < g.KW; ++kj) {
                int tx = xx + g.PW - kj * g.DW;
                if (tx < 0 || tx % g.SW != 0 || tx / g.SW >= g.OW) continue;
                i64 row = ((i64)c * g.KH + ki) * g.KW + kj;
                s += to_float(col[row * cols + (i64)(ty / g.SH) * g.OW + tx / g.SW]);
            }
        }
        x[e] = from_float<T>(s);
    }
}

#define CONV_DTYPE(T, S)                                                                                       \
    extern "C" __global__ void im2col_##S(const T* x, T* col, ConvGeom g) { im2col<T>(x, col, g); }            \
    extern "C" __global__ void col2im_##S(const T* col, T* x, ConvGeom g) { col2im<T>(col, x, g); }
CONV_DTYPE(float, f32)
CONV_DTYPE(half_t, f16)
CONV_DTYPE(bf16_t, bf16)
