//! GPU benchmarks (`cargo bench -p tessera-cuda-kernels --bench gpu`):
//! GEMM 4096³ bf16 beside cuBLAS, LayerNorm fwd+bwd beside a device copy,
//! attention fwd+bwd. One `bench` line per figure; without a device it
//! prints `skipped: no CUDA device (<reason>)`.

use std::time::Instant;

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::CudaSlice;
use half::bf16;
use tessera_cuda_kernels::ops::attention::{attention_bwd, attention_fwd, AttnGrads, AttnMask, AttnShape};
use tessera_cuda_kernels::ops::gemm::{gemm, GemmShape};
use tessera_cuda_kernels::ops::layernorm::{layer_norm_bwd, layer_norm_bwd_workspace, layer_norm_fwd};
use tessera_cuda_kernels::{Gpu, Launch, Result};

fn bench(workload: &str, implementation: &str, metric: &str, value: f64, unit: &str) {
    println!("bench\t{workload}\t{implementation}\t{metric}\t{value:.2}\t{unit}");
}

/// Mean seconds per call of `f` after a warm-up, synchronised.
fn time(gpu: &Gpu, iters: u32, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    gpu.synchronize()?;
    let t = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    gpu.synchronize()?;
    Ok(t.elapsed().as_secs_f64() / iters as f64)
}

fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    n: usize,
) -> Result<CudaSlice<T>> {
    gpu.stream()
        .alloc_zeros::<T>(n)
        .map_err(|e| tessera_cuda_kernels::Error::Driver {
            op: "alloc",
            msg: e.to_string(),
        })
}

fn run(gpu: &Gpu, ls: &[Launch]) -> Result<()> {
    for l in ls {
        // SAFETY: every pointer comes from a buffer alive for the whole benchmark.
        unsafe { gpu.launch(l)? };
    }
    Ok(())
}

fn gemm_bench(gpu: &Gpu) -> Result<()> {
    let n = 4096;
    let ones: Vec<bf16> = (0..n * n)
        .map(|i| bf16::from_f32(((i % 7) as f32 - 3.0) / 8.0))
        .collect();
    let (a, b) = (gpu.upload(&ones)?, gpu.upload(&ones)?);
    let mut c = zeros::<bf16>(gpu, n * n)?;
    let l = gemm(&GemmShape::new(n, n, n), gpu.ptr(&a), gpu.ptr(&b), gpu.ptr(&c))?;
    let flops = 2.0 * (n as f64).powi(3);
    let ours = time(gpu, 20, || run(gpu, std::slice::from_ref(&l)))?;
    bench(
        "gemm_4096_bf16",
        "tessera",
        "throughput",
        flops / ours / 1e12,
        "TFLOP/s",
    );
    let blas = CudaBlas::new(gpu.stream().clone()).map_err(|e| tessera_cuda_kernels::Error::Driver {
        op: "cublas",
        msg: format!("{e:?}"),
    })?;
    // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ.
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: n as i32,
        k: n as i32,
        alpha: bf16::ONE,
        lda: n as i32,
        ldb: n as i32,
        beta: bf16::ZERO,
        ldc: n as i32,
    };
    let theirs = time(gpu, 20, || {
        // SAFETY: all three buffers hold n*n elements.
        unsafe { blas.gemm(cfg, &b, &a, &mut c) }.map_err(|e| tessera_cuda_kernels::Error::Driver {
            op: "cublas gemm",
            msg: format!("{e:?}"),
        })
    })?;
    bench(
        "gemm_4096_bf16",
        "cublas",
        "throughput",
        flops / theirs / 1e12,
        "TFLOP/s",
    );
    bench(
        "gemm_4096_bf16",
        "tessera",
        "fraction_of_cublas",
        theirs / ours,
        "ratio",
    );
    Ok(())
}

fn layer_norm_bench(gpu: &Gpu) -> Result<()> {
    let (rows, cols) = (16384, 4096);
    let n = rows * cols;
    let x = zeros::<bf16>(gpu, n)?;
    let (y, dy, dx) = (
        zeros::<bf16>(gpu, n)?,
        zeros::<bf16>(gpu, n)?,
        zeros::<bf16>(gpu, n)?,
    );
    let (g, b, dg, db) = (
        zeros::<bf16>(gpu, cols)?,
        zeros::<bf16>(gpu, cols)?,
        zeros::<bf16>(gpu, cols)?,
        zeros::<bf16>(gpu, cols)?,
    );
    let (mean, rstd) = (zeros::<f32>(gpu, rows)?, zeros::<f32>(gpu, rows)?);
    let ws = zeros::<f32>(gpu, layer_norm_bwd_workspace(rows, cols))?;
    let p = |s: &CudaSlice<bf16>| gpu.ptr(s);
    let mut ls = vec![layer_norm_fwd(
        p(&x),
        Some(p(&g)),
        Some(p(&b)),
        p(&y),
        gpu.ptr(&mean),
        gpu.ptr(&rstd),
        rows,
        cols,
        1e-5,
    )?];
    ls.extend(layer_norm_bwd(
        p(&x),
        Some(p(&g)),
        p(&dy),
        gpu.ptr(&mean),
        gpu.ptr(&rstd),
        p(&dx),
        p(&dg),
        p(&db),
        gpu.ptr(&ws),
        rows,
        cols,
    )?);
    // Minimum traffic: forward reads x, writes y; backward reads x and dy
    // (twice: dx pass and dgamma/dbeta pass) and writes dx.
    let bytes = (2.0 + 5.0) * n as f64 * 2.0;
    let ours = time(gpu, 20, || run(gpu, &ls))?;
    bench(
        "layernorm_16384x4096_bf16",
        "tessera",
        "fwd+bwd_bandwidth",
        bytes / ours / 1e9,
        "GB/s",
    );
    let mut copy = zeros::<bf16>(gpu, n)?;
    let t = time(gpu, 20, || {
        gpu.stream()
            .memcpy_dtod(&x, &mut copy)
            .map_err(|e| tessera_cuda_kernels::Error::Driver {
                op: "copy",
                msg: e.to_string(),
            })
    })?;
    let copy_bw = 2.0 * n as f64 * 2.0 / t / 1e9;
    bench(
        "layernorm_16384x4096_bf16",
        "device_copy",
        "bandwidth",
        copy_bw,
        "GB/s",
    );
    bench(
        "layernorm_16384x4096_bf16",
        "tessera",
        "fraction_of_copy",
        bytes / ours / 1e9 / copy_bw,
        "ratio",
    );
    Ok(())
}

fn attention_bench(gpu: &Gpu, head_dim: usize) -> Result<()> {
    let s = AttnShape {
        batch: 4,
        heads: 16,
        lq: 2048,
        lk: 2048,
        head_dim,
    };
    let nq = s.batch * s.heads * s.lq * head_dim;
    let rows = s.batch * s.heads * s.lq;
    let bufs: Vec<CudaSlice<bf16>> = (0..8).map(|_| zeros::<bf16>(gpu, nq)).collect::<Result<_>>()?;
    let (lse, ws) = (zeros::<f32>(gpu, rows)?, zeros::<f32>(gpu, rows)?);
    let p: Vec<_> = bufs.iter().map(|b| gpu.ptr(b)).collect();
    let m = AttnMask {
        scale: 1.0 / (head_dim as f32).sqrt(),
        causal: false,
        kv_len: None,
    };
    let fwd = attention_fwd(&s, &m, p[0], p[1], p[2], p[3], gpu.ptr(&lse))?;
    let g = AttnGrads {
        d_o: p[4],
        d_q: p[5],
        d_k: p[6],
        d_v: p[7],
        workspace: gpu.ptr(&ws),
    };
    let bwd = attention_bwd(&s, &m, p[0], p[1], p[2], p[3], gpu.ptr(&lse), &g)?;
    let flops_fwd = 4.0 * (s.batch * s.heads) as f64 * (s.lq * s.lk) as f64 * head_dim as f64;
    let tf = time(gpu, 5, || run(gpu, std::slice::from_ref(&fwd)))?;
    let tb = time(gpu, 5, || run(gpu, &bwd))?;
    let w = format!("attention_b4h16l2048d{head_dim}_bf16");
    bench(&w, "tessera", "fwd_throughput", flops_fwd / tf / 1e12, "TFLOP/s");
    bench(
        &w,
        "tessera",
        "bwd_throughput",
        2.5 * flops_fwd / tb / 1e12,
        "TFLOP/s",
    );
    Ok(())
}

fn main() {
    let gpu = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            return;
        }
    };
    let results = [
        gemm_bench(&gpu),
        layer_norm_bench(&gpu),
        attention_bench(&gpu, 64),
        attention_bench(&gpu, 128),
    ];
    for r in results {
        if let Err(e) = r {
            eprintln!("benchmark failed: {e}");
            std::process::exit(1);
        }
    }
}
