//! Kernel families: their CUDA sources (embedded at build time) and the
//! names of the kernels each one defines.

/// Common header prepended to every family: types, reductions, PTX wrappers.
pub const COMMON_HEADER: &str = include_str!("kernels/common.cuh");

/// One `.cu` source file of `src/kernels/`, compiled as one NVRTC program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Module {
    /// Unary/binary/compare/clamp/where over strided inputs, strided copies,
    /// casts, fill.
    Elementwise,
    /// Philox4x32-10 uniform and normal numbers.
    Philox,
    /// Sum, max, argmax/argmin over a dimension.
    Reduce,
    /// Softmax, log_softmax, cross-entropy.
    Softmax,
    /// Fused LayerNorm forward and backward.
    LayerNorm,
    /// Tensor-core GEMM.
    Gemm,
    /// Flash-style attention forward and backward.
    Attention,
    /// Multi-tensor Adam/AdamW, SGD and LAMB steps.
    Optim,
    /// Max and average pooling (fixed and adaptive windows), forward and
    /// backward.
    Pool,
    /// Embedding forward and backward.
    Embedding,
    /// im2col / col2im.
    Im2col,
    /// Bilinear resampling forward and backward.
    Resample,
}

const FLOATS: [&str; 3] = ["f32", "f16", "bf16"];

fn per_dtype(prefixes: &[&str], dtypes: &[&str]) -> Vec<String> {
    prefixes
        .iter()
        .flat_map(|p| dtypes.iter().map(move |d| format!("{p}_{d}")))
        .collect()
}

impl Module {
    /// Every family.
    pub const ALL: [Module; 12] = [
        Module::Elementwise,
        Module::Philox,
        Module::Reduce,
        Module::Softmax,
        Module::LayerNorm,
        Module::Gemm,
        Module::Attention,
        Module::Optim,
        Module::Pool,
        Module::Embedding,
        Module::Im2col,
        Module::Resample,
    ];

    /// File name of the source under `src/kernels/`.
    pub fn file_name(self) -> &'static str {
        match self {
            Module::Elementwise => "elementwise.cu",
            Module::Philox => "philox.cu",
            Module::Reduce => "reduce.cu",
            Module::Softmax => "softmax.cu",
            Module::LayerNorm => "layernorm.cu",
            Module::Gemm => "gemm.cu",
            Module::Attention => "attention.cu",
            Module::Optim => "optim.cu",
            Module::Pool => "pool.cu",
            Module::Embedding => "embedding.cu",
            Module::Im2col => "im2col.cu",
            Module::Resample => "resample.cu",
        }
    }

    /// The family's own source (without the common header).
    pub fn source(self) -> &'static str {
        match self {
            Module::Elementwise => include_str!("kernels/elementwise.cu"),
            Module::Philox => include_str!("kernels/philox.cu"),
            Module::Reduce => include_str!("kernels/reduce.cu"),
            Module::Softmax => include_str!("kernels/softmax.cu"),
            Module::LayerNorm => include_str!("kernels/layernorm.cu"),
            Module::Gemm => include_str!("kernels/gemm.cu"),
            Module::Attention => include_str!("kernels/attention.cu"),
            Module::Optim => include_str!("kernels/optim.cu"),
            Module::Pool => include_str!("kernels/pool.cu"),
            Module::Embedding => include_str!("kernels/embedding.cu"),
            Module::Im2col => include_str!("kernels/im2col.cu"),
            Module::Resample => include_str!("kernels/resample.cu"),
        }
    }

    /// The program NVRTC compiles: the op codes
    /// ([`crate::op_codes::cuda_header`]), the common header, then the
    /// family's source with `#line` so compiler messages name the right file
    /// and line.
    pub fn full_source(self) -> String {
        format!(
            "{}{COMMON_HEADER}\n#line 1 \"{}\"\n{}",
            crate::op_codes::cuda_header(),
            self.file_name(),
            self.source()
        )
    }

    /// 64-bit FNV-1a hash of [`Module::full_source`], the compilation cache key.
    pub fn source_hash(self) -> u64 {
        fnv1a(self.full_source().as_bytes())
    }

    /// Names of the `extern "C"` kernels the family defines.
    pub fn kernels(self) -> Vec<String> {
        match self {
            Module::Elementwise => {
                let mut v = per_dtype(
                    &[
                        "unary_contig",
                        "unary_strided",
                        "binary_contig",
                        "binary_strided",
                        "fill",
                        "clamp_strided",
                        "scatter_add",
                    ],
                    &FLOATS,
                );
                v.extend(per_dtype(
                    &["compare_strided"],
                    &["f32", "f16", "bf16", "i64", "u8"],
                ));
                v.extend(per_dtype(
                    &[
                        "copy_strided",
                        "tri",
                        "gather_strided",
                        "scatter",
                        "where_strided",
                    ],
                    &["b1", "b2", "b4", "b8"],
                ));
                for (a, b) in [
                    ("f32", "f16"),
                    ("f32", "bf16"),
                    ("f16", "f32"),
                    ("bf16", "f32"),
                    ("f16", "bf16"),
                    ("bf16", "f16"),
                ] {
                    v.push(format!("cast_{a}_{b}"));
                }
                v
            }
            Module::Philox => per_dtype(&["philox_uniform", "philox_normal"], &FLOATS),
            Module::Reduce => per_dtype(&["reduce", "arg_extreme", "scan", "topk"], &FLOATS),
            Module::Softmax => per_dtype(&["softmax", "ce_fwd", "ce_bwd"], &FLOATS),
            Module::LayerNorm => per_dtype(
                &["ln_fwd", "ln_bwd_dx", "ln_bwd_partial", "ln_bwd_final"],
                &FLOATS,
            ),
            Module::Gemm => per_dtype(&["gemm_f16", "gemm_bf16"], &["nn", "nt", "tn", "tt"]),
            Module::Attention => {
                let mut v = per_dtype(&["attn_bwd_dot"], &FLOATS);
                for d in FLOATS {
                    for dm in ["d64", "d128"] {
                        for k in ["attn_fwd", "attn_bwd_dq", "attn_bwd_dkdv"] {
                            v.push(format!("{k}_{d}_{dm}"));
                        }
                    }
                }
                v
            }
            Module::Optim => per_dtype(&["adam", "sgd", "lamb_moments", "lamb_apply"], &FLOATS),
            Module::Pool => per_dtype(
                &["maxpool_fwd", "maxpool_bwd", "avgpool_fwd", "avgpool_bwd"],
                &FLOATS,
            ),
            Module::Embedding => per_dtype(&["emb_fwd", "emb_bwd"], &FLOATS),
            Module::Im2col => per_dtype(&["im2col", "col2im"], &FLOATS),
            Module::Resample => per_dtype(&["bilinear_fwd", "bilinear_bwd"], &FLOATS),
        }
    }
}

/// 64-bit FNV-1a.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
