//! Interchange with PyTorch: `fixtures/torch_fixture.safetensors` was written
//! by `safetensors.torch.save_file` (see `fixtures/make_safetensors_fixture.py`)
//! and must load with exactly the values PyTorch saved. The test also writes
//! `tessera_written.safetensors` into Cargo's test temp dir, covering every
//! dtype, so that it can be checked by hand with `safetensors.torch.load_file`.

use std::collections::HashMap;
use std::path::Path;

use tessera_tensor::{bf16, f16, safetensors, DType, Tensor};

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_fixture.safetensors")
}

fn check<T: tessera_tensor::Element>(t: &Tensor, dtype: DType, shape: &[usize], want: &[T]) {
    assert_eq!((t.dtype(), t.shape()), (dtype, shape));
    assert_eq!(t.to_vec::<T>().unwrap(), want);
}

#[test]
fn loads_a_file_written_by_pytorch() {
    let (t, meta) = safetensors::load_with_metadata(fixture()).unwrap();
    assert_eq!(t.len(), 11);
    assert_eq!(meta["format"], "pt");
    assert_eq!(meta["made_by"], "make_safetensors_fixture.py");
    check(
        &t["f32"],
        DType::F32,
        &[2, 3],
        &[1.5f32, -2.25, 3.0, 0.1, 1e-8, -1e8],
    );
    check(&t["f64"], DType::F64, &[3], &[0.1f64, -1.0 / 3.0, 2f64.powi(60)]);
    let f16s: Vec<f16> = [0.5, -65504.0, 6.103515625e-05, 0.333251953125]
        .iter()
        .map(|&x| f16::from_f64(x))
        .collect();
    check(&t["f16"], DType::F16, &[2, 2], &f16s);
    let bf16s: Vec<bf16> = [1.0, -3.140625, 1.0002555517425873e30]
        .iter()
        .map(|&x| bf16::from_f64(x))
        .collect();
    check(&t["bf16"], DType::BF16, &[3], &bf16s);
    check(
        &t["i64"],
        DType::I64,
        &[2, 2],
        &[-(1i64 << 62), 7, (1 << 53) + 1, -1],
    );
    check(&t["u32"], DType::U32, &[3], &[0u32, u32::MAX, 123_456_789]);
    check(&t["u8"], DType::U8, &[2, 3], &[0u8, 51, 102, 153, 204, 255]);
    check(&t["bool"], DType::Bool, &[1, 3], &[true, false, true]);
    check(
        &t["transposed"],
        DType::F32,
        &[3, 2],
        &[0.0f32, 3.0, 1.0, 4.0, 2.0, 5.0],
    );
    check(&t["scalar"], DType::F64, &[], &[-4.5f64]);
    check(&t["empty"], DType::F32, &[0, 3], &[] as &[f32]);
}

#[test]
fn writes_a_file_pytorch_can_read() {
    let (t, _) = safetensors::load_with_metadata(fixture()).unwrap();
    // Views, not copies: the file must store them row-major.
    let u8_t = t["u8"].t().unwrap();
    let f32_flipped = t["f32"].flip(&[1]).unwrap();
    let mut out: Vec<(&str, Tensor)> = t.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    out.push(("u8_t", u8_t));
    out.push(("f32_flipped", f32_flipped));
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tessera_written.safetensors");
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::save_with_metadata(&path, out.iter().map(|(k, v)| (*k, v)), &meta).unwrap();
    println!("wrote {}", path.display());
    let back = safetensors::load(&path).unwrap();
    assert_eq!(back.len(), out.len());
    check(&back["u8_t"], DType::U8, &[3, 2], &[0u8, 153, 51, 204, 102, 255]);
    check(
        &back["f32_flipped"],
        DType::F32,
        &[2, 3],
        &[3.0f32, -2.25, 1.5, -1e8, 1e-8, 0.1],
    );
    check(
        &back["i64"],
        DType::I64,
        &[2, 2],
        &[-(1i64 << 62), 7, (1 << 53) + 1, -1],
    );
}
