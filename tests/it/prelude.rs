//! A script written against `tessera::prelude::*` alone: a tiny model
//! trained for a step with AdamW, a warm-up cosine schedule and clipping,
//! evaluated under `no_grad`, with `?` on tensor, data and I/O errors in one
//! function returning `tessera::Result`.

use tessera::prelude::*;

/// The script: returns the loss before and after one optimizer step on the
/// same batch.
fn train_one_step() -> Result<(f64, f64)> {
    manual_seed(0);
    let x = Tensor::randn(&[8, 4], DType::F32)?;
    let y = Tensor::from_vec((0..8).map(|i| i % 3).collect::<Vec<i64>>(), &[8])?;
    let mut loader = DataLoader::builder(TensorDataset::new(vec![x, y])?)
        .batch_size(8)
        .build()?;

    let mut model = Sequential::new();
    model.push(Box::new(Linear::new(4, 16, true)?));
    model.push(Box::new(GELU::default()));
    model.push(Box::new(Dropout::new(0.1)?));
    model.push(Box::new(Linear::new(16, 3, true)?));
    let mut opt = AdamW::new(
        model.parameters(),
        AdamWOptions {
            lr: 1e-2,
            ..Default::default()
        },
    )?;
    let mut schedule = CosineLR::new(
        &mut opt,
        CosineOptions {
            warmup_t: 1,
            ..CosineOptions::new(10)
        },
    )?;
    let ce = CrossEntropyOptions::default();

    let batch = loader.iter().next().expect("one batch")?;
    let (x, y) = (Var::constant(batch[0].clone()), &batch[1]);
    let eval_loss = |model: &mut Sequential| -> Result<f64> {
        model.eval();
        let loss = no_grad(|| model.forward(&x)?.cross_entropy(Target::Indices(y), &ce))?;
        model.train(true);
        Ok(loss.tensor().to_dtype(DType::F64)?.to_vec::<f64>()?[0])
    };
    let before = eval_loss(&mut model)?;
    for _ in 0..5 {
        let loss = model.forward(&x)?.cross_entropy(Target::Indices(y), &ce)?;
        let mut grads = loss.backward()?;
        clip_grad_norm(&mut grads, 1.0, 2.0)?;
        opt.step(&grads)?;
        schedule.step(&mut opt)?;
    }
    let after = eval_loss(&mut model)?;

    // A missing file is an `Io` error with its path, through the same `?`.
    match std::fs::read("/nonexistent/tessera-prelude-test")
        .map_err(|e| Error::io("/nonexistent/tessera-prelude-test", e))
    {
        Err(Error::Io { path: Some(_), .. }) => {}
        other => return Err(Error::msg(format!("expected an Io error, got {other:?}"))),
    }
    Ok((before, after))
}

#[test]
fn a_script_needs_only_the_prelude() {
    let (before, after) = train_one_step().unwrap();
    assert!(before.is_finite() && after.is_finite(), "{before} {after}");
    assert!(
        after < before,
        "training did not lower the loss: {before} -> {after}"
    );
}
