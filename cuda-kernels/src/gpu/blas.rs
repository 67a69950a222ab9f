//! The f32 GEMM of a [`Gpu`] through cuBLAS (the tensor-core kernel of
//! `gemm.cu` covers f16/bf16 only).

use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};

use super::{poisoned, Gpu};
use crate::launch::DevPtr;
use crate::ops::gemm::{check_sgemm, GemmShape};
use crate::{Error, Result};

fn blas_err(e: impl std::fmt::Display) -> Error {
    Error::Driver {
        op: "cuBLAS sgemm",
        msg: e.to_string(),
    }
}

impl Gpu {
    /// The device's cuBLAS handle, created on first use.
    fn blas(&self) -> Result<Arc<CudaBlas>> {
        // SAFETY: only tries to dlopen libcublas by its usual names; cudarc
        // panics on first use when it is absent.
        if !unsafe { blas_sys::is_culib_present() } {
            return Err(Error::Driver {
                op: "cuBLAS sgemm",
                msg: "f32 matmul needs cuBLAS, and libcublas.so could not be loaded".into(),
            });
        }
        let mut slot = self.blas.lock().map_err(|_| poisoned())?;
        if let Some(h) = slot.as_ref() {
            return Ok(h.clone());
        }
        let h = Arc::new(CudaBlas::new(self.stream.clone()).map_err(blas_err)?);
        *slot = Some(h.clone());
        Ok(h)
    }

    /// Row-major C = op(A)·op(B) as column-major Cᵀ = op(B)ᵀ·op(A)ᵀ.
    ///
    /// # Safety
    /// As [`crate::Runtime::sgemm`].
    pub(super) unsafe fn cublas_sgemm(
        &self,
        g: &GemmShape,
        a: DevPtr<f32>,
        b: DevPtr<f32>,
        c: DevPtr<f32>,
    ) -> Result<()> {
        check_sgemm(g, &a, &b, &c)?;
        if g.m == 0 || g.n == 0 || g.batch == 0 {
            return Ok(());
        }
        let h = self.blas()?;
        let t = |trans: bool| {
            if trans {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        // `check_sgemm` bounded every size by i32::MAX / i64::MAX. cuBLAS
        // wants leading dimensions of at least 1 even where k = 0 (then it
        // writes C = 0·C = 0, the empty sum).
        let (int, long) = (|v: usize| v as i32, |v: usize| v as i64);
        let ld = |v: usize| v.max(1) as i32;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the lengths of A, B, C were checked against `g`; they are
        // live device memory on this stream (caller).
        unsafe {
            blas::sgemm_strided_batched(
                *h.handle(),
                t(g.trans_b),
                t(g.trans_a),
                int(g.n),
                int(g.m),
                int(g.k),
                &alpha,
                b.addr() as *const f32,
                ld(g.ldb),
                long(g.stride_b),
                a.addr() as *const f32,
                ld(g.lda),
                long(g.stride_a),
                &beta,
                c.addr() as *mut f32,
                ld(g.ldc),
                long(g.stride_c),
                int(g.batch),
            )
        }
        .map_err(blas_err)
    }
}
