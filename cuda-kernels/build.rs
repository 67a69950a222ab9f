//! With the feature `cuda-emu`: compiles the CPU emulator of the CUDA device
//! into a static library linked into this crate. Each kernel family
//! (`src/kernels/*.cu`) is compiled as C++ with `emu/cuda_emu.h` force-included,
//! after the op-code header generated from `src/op_codes.rs`, in its own unit (in parallel), beside `emu/runtime.cpp` (fibers, scheduler,
//! warp collectives), `emu/faults.cu` (deliberately broken kernels for the
//! emulator's own tests) and a generated unit that registers every kernel
//! named by `Module::kernels`, so the kernel list has one source.
//!
//! Without the feature the build script does nothing.

#[cfg(feature = "cuda-emu")]
#[allow(dead_code)]
#[path = "src/module.rs"]
mod module;

#[cfg(feature = "cuda-emu")]
#[allow(dead_code)]
#[path = "src/op_codes.rs"]
mod op_codes;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "cuda-emu")]
    emu::build();
}

#[cfg(feature = "cuda-emu")]
mod emu {
    use std::fmt::Write as _;
    use std::path::{Path, PathBuf};

    use super::module::Module;

    /// Kernels of `emu/faults.cu`.
    const FAULT_KERNELS: [&str; 9] = [
        "fault_missing_barrier",
        "fault_fixed_barrier",
        "fault_divergent_barrier",
        "fault_early_exit",
        "fault_shfl_exited_lane",
        "fault_deadlock",
        "fault_cp_async_no_wait",
        "fault_out_of_bounds",
        "fault_block_order",
    ];

    pub(super) fn build() {
        let dir =
            PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
        let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
        for p in ["emu", "src/kernels", "src/module.rs", "src/op_codes.rs"] {
            println!("cargo:rerun-if-changed={}", dir.join(p).display());
        }
        let kernels = dir.join("src/kernels");
        // The op codes first, as NVRTC gets them (`Module::full_source`).
        let codes = write(out.join("op_codes.cuh"), &super::op_codes::cuda_header());
        let common = kernels.join("common.cuh");
        let mut units = vec![dir.join("emu/runtime.cpp")];
        let mut families = Vec::new();
        for m in Module::ALL {
            let stem = m.file_name().trim_end_matches(".cu");
            units.push(unit(
                &out,
                stem,
                &[&codes, &common, &kernels.join(m.file_name())],
                &m.kernels(),
            ));
            families.push(stem.to_string());
        }
        let faults: Vec<String> = FAULT_KERNELS.iter().map(|k| k.to_string()).collect();
        units.push(unit(
            &out,
            "faults",
            &[&codes, &common, &dir.join("emu/faults.cu")],
            &faults,
        ));
        families.push("faults".into());
        units.push(registry(&out, &families));

        cc::Build::new()
            .cpp(true)
            .std("c++17")
            // The fiber switches dominate the emulator's time, not the code
            // quality: -O1 compiles twice as fast as -O2 and runs as fast.
            .opt_level(1)
            .debug(false)
            .warnings(false)
            .cargo_warnings(false)
            .flag("-w")
            // _FORTIFY_SOURCE's longjmp check rejects the jumps between fiber stacks.
            .flag("-U_FORTIFY_SOURCE")
            .flag("-include")
            .flag(
                dir.join("emu/cuda_emu.h")
                    .to_str()
                    .expect("the crate path is UTF-8"),
            )
            .files(&units)
            .compile("tessera_cuda_emu");
    }

    /// A unit compiling `sources` with a function registering `names`.
    fn unit(out: &Path, stem: &str, sources: &[&Path], names: &[String]) -> PathBuf {
        let mut src = String::new();
        for s in sources {
            writeln!(src, "#include \"{}\"", s.display()).expect("writing to a String");
        }
        writeln!(src, "extern \"C\" void tessera_emu_register_{stem}() {{").expect("writing to a String");
        for k in names {
            writeln!(src, "    EMU_KERNEL({k})").expect("writing to a String");
        }
        src.push_str("}\n");
        write(out.join(format!("{stem}.cu.cpp")), &src)
    }

    /// The unit defining `emu::register_all`, which the runtime calls once.
    fn registry(out: &Path, families: &[String]) -> PathBuf {
        let mut src = String::new();
        for f in families {
            writeln!(src, "extern \"C\" void tessera_emu_register_{f}();").expect("writing to a String");
        }
        src.push_str("namespace emu {\nvoid register_all() {\n");
        for f in families {
            writeln!(src, "    tessera_emu_register_{f}();").expect("writing to a String");
        }
        src.push_str("}\n}  // namespace emu\n");
        write(out.join("registry.cpp"), &src)
    }

    fn write(path: PathBuf, src: &str) -> PathBuf {
        std::fs::write(&path, src).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path
    }
}
