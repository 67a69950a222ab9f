//! The ZeRO paper's memory and communication models (Rajbhandari et al.
//! 2019, §5 and §7; spec §3.1), which the measured counters are checked
//! against.

/// A ZeRO stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZeroStage {
    /// Plain data parallelism (every rank holds everything).
    Baseline,
    /// P_os: optimizer state partitioned.
    One,
    /// P_os+g: optimizer state and gradients partitioned.
    Two,
    /// P_os+g+p: parameters partitioned too.
    Three,
}

/// Bytes per rank of mixed-precision training with `psi` parameters over
/// `n_d` data-parallel ranks, 2-byte parameters and gradients and `k`
/// bytes of optimizer state per parameter (12 for Adam: fp32 master,
/// momentum, variance): the paper's table, `(2+2+K)Ψ` for the baseline,
/// `2Ψ + 2Ψ + KΨ/N_d`, `2Ψ + (2+K)Ψ/N_d`, `(2+2+K)Ψ/N_d` for stages 1–3.
pub fn memory_model(stage: ZeroStage, psi: f64, n_d: f64, k: f64) -> f64 {
    memory_model_with(stage, psi, n_d, 2.0, 2.0, k)
}

/// [`memory_model`] with `param_bytes` and `grad_bytes` per element (4 and
/// 4 for f32 training, where `k` counts the f32 master copy too).
pub fn memory_model_with(
    stage: ZeroStage,
    psi: f64,
    n_d: f64,
    param_bytes: f64,
    grad_bytes: f64,
    k: f64,
) -> f64 {
    let (p, g) = (param_bytes * psi, grad_bytes * psi);
    let os = k * psi;
    match stage {
        ZeroStage::Baseline => p + g + os,
        ZeroStage::One => p + g + os / n_d,
        ZeroStage::Two => p + (g + os) / n_d,
        ZeroStage::Three => (p + g + os) / n_d,
    }
}

/// Elements each rank communicates per step for `psi` parameters (paper
/// §7): an all-reduce counts 2Ψ (reduce-scatter + all-gather), stages 1
/// and 2 a reduce-scatter of the gradients and an all-gather of the
/// parameters (2Ψ), stage 3 an all-gather in forward and again in backward
/// plus the reduce-scatter (3Ψ).
pub fn comm_model(stage: ZeroStage, psi: f64) -> f64 {
    match stage {
        ZeroStage::Baseline | ZeroStage::One | ZeroStage::Two => 2.0 * psi,
        ZeroStage::Three => 3.0 * psi,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paper's table for Ψ = 7.5B, N_d = 64, K = 12 (in GB, 1e9 bytes).
    #[test]
    fn memory_model_gives_the_papers_table() {
        let gb = |s| memory_model(s, 7.5e9, 64.0, 12.0) / 1e9;
        assert!((gb(ZeroStage::Baseline) - 120.0).abs() < 0.05);
        assert!((gb(ZeroStage::One) - 31.4).abs() < 0.05);
        assert!((gb(ZeroStage::Two) - 16.6).abs() < 0.05);
        assert!((gb(ZeroStage::Three) - 1.9).abs() < 0.05);
        assert_eq!(
            comm_model(ZeroStage::Three, 10.0) / comm_model(ZeroStage::Baseline, 10.0),
            1.5
        );
    }
}
