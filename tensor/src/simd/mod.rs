//! Explicit SIMD for the f32 elementwise, reduction and row kernels, picked
//! at run time: AVX-512 → AVX2+FMA → portable (plain arrays of 8 lanes that
//! compile to whatever the target guarantees: SSE2 on x86-64, NEON on
//! aarch64).
//!
//! Every kernel is written once, generic over the [`vector::Vf32`] trait, and
//! instantiated per level inside a `#[target_feature]` wrapper by
//! [`simd_fn!`]. A [`Level`] can only be obtained from run-time detection, so
//! holding one proves the CPU can run its kernels; tests run every kernel at
//! every level this CPU has ([`Level::available`]).
//!
//! Reductions keep a fixed structure of [`ACC_LANES`] partial sums whatever
//! the vector width, combined by a fixed tree, so a sum is bitwise the same
//! at every level and on any thread count.

pub(crate) mod cast;
pub(crate) mod kernels;
pub(crate) mod math;
pub(crate) mod norm;
#[cfg(test)]
mod tests;
pub(crate) mod vector;

use std::sync::OnceLock;

/// Partial sums a reduction keeps (a multiple of every vector width).
pub(crate) const ACC_LANES: usize = 64;

/// An instruction-set level the kernels run at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level(Kind);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Portable,
}

impl Level {
    /// The fastest level this CPU supports (detected once).
    pub fn best() -> Level {
        static BEST: OnceLock<Level> = OnceLock::new();
        *BEST.get_or_init(|| Level::available()[0])
    }

    /// Every level this CPU can run, fastest first (the portable level is
    /// always last).
    pub fn available() -> Vec<Level> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            let fma = is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2");
            if fma && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512dq") {
                v.push(Level(Kind::Avx512));
            }
            if fma {
                v.push(Level(Kind::Avx2));
            }
        }
        v.push(Level(Kind::Portable));
        v
    }

    /// A short name ("avx512", "avx2", "portable") for messages and benches.
    pub fn name(self) -> &'static str {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Kind::Avx512 => "avx512",
            #[cfg(target_arch = "x86_64")]
            Kind::Avx2 => "avx2",
            Kind::Portable => "portable",
        }
    }
}

/// Defines `$name(level, args..) -> ret` running the generic kernel
/// `$generic::<V>(args..)` with the vector type of `level`, compiled for that
/// level's features.
macro_rules! simd_fn {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? => $generic:ident) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name(level: $crate::simd::Level, $($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                $generic::<$crate::simd::vector::x86::F32x16>($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                $generic::<$crate::simd::vector::x86::F32x8>($($arg),*)
            }
            match level.kind() {
                // SAFETY: a Level comes only from run-time detection, so the
                // CPU has the features the wrapper is compiled for.
                #[cfg(target_arch = "x86_64")]
                $crate::simd::LevelKind::Avx512 => unsafe { avx512($($arg),*) },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                $crate::simd::LevelKind::Avx2 => unsafe { avx2($($arg),*) },
                $crate::simd::LevelKind::Portable => {
                    $generic::<$crate::simd::vector::portable::F32x8>($($arg),*)
                }
            }
        }
    };
}
pub(crate) use simd_fn;

/// The level's kind, for [`simd_fn!`]'s dispatch.
pub(crate) use Kind as LevelKind;

impl Level {
    pub(crate) fn kind(self) -> Kind {
        self.0
    }
}
