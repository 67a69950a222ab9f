//! The emulator's stand-in for cuBLAS's f32 GEMM: each output element is an
//! f32 fused multiply-add chain over k in order, as a simple GPU GEMM
//! accumulates (cuBLAS's own order differs and is not documented).

use crate::launch::DevPtr;
use crate::ops::gemm::GemmShape;

/// C = op(A)·op(B) for each batch of `g` (row-major, see [`GemmShape`]).
///
/// # Safety
/// `a`, `b`, `c` are host addresses of live memory holding what `g`
/// reaches (as `check_sgemm` checks against their lengths); `c` does not
/// overlap `a` or `b`.
pub(super) unsafe fn reference(g: &GemmShape, a: DevPtr<f32>, b: DevPtr<f32>, c: DevPtr<f32>) {
    let (pa, pb, pc) = (
        a.addr() as *const f32,
        b.addr() as *const f32,
        c.addr() as *mut f32,
    );
    for batch in 0..g.batch {
        for i in 0..g.m {
            for j in 0..g.n {
                let mut acc = 0f32;
                for p in 0..g.k {
                    let ia = batch * g.stride_a + if g.trans_a { p * g.lda + i } else { i * g.lda + p };
                    let ib = batch * g.stride_b + if g.trans_b { j * g.ldb + p } else { p * g.ldb + j };
                    // SAFETY: the indices lie in what `g` reaches of A and B.
                    acc = unsafe { (*pa.add(ia)).mul_add(*pb.add(ib), acc) };
                }
                // SAFETY: as above, for C.
                unsafe { *pc.add(batch * g.stride_c + i * g.ldc + j) = acc };
            }
        }
    }
}
