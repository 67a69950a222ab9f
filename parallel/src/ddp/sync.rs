//! Construction-time collectives of DDP: checking that the ranks hold the
//! same parameters, and broadcasting rank 0's state in coalesced buffers.

use tessera_tensor::{bf16, f16, DType, Tensor};

use crate::comm::{CommExt, Communicator};
use crate::element::CommElement;
use crate::error::{CommError, Result};

/// PyTorch's `broadcast_bucket_size`: the most bytes one coalesced
/// broadcast carries.
const BROADCAST_BUCKET_BYTES: usize = 250 * 1024 * 1024;

/// Checks that every rank passes the same number of tensors with the same
/// shapes and dtypes (PyTorch's `_verify_param_shape_across_processes`; a
/// collective). Errors, as `DistributedDataParallel::new`, naming the ranks
/// that differ from rank 0 and what this rank holds.
pub fn verify_same_shapes(comm: &dyn Communicator, named: &[(&str, Tensor)]) -> Result<()> {
    let n = comm.world_size();
    if n == 1 {
        return Ok(());
    }
    // FNV-1a over (dtype, ndim, dims) of every tensor.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |v: u64| {
        for b in v.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for (_, t) in named {
        t.dtype().to_string().bytes().for_each(|b| eat(u64::from(b)));
        eat(t.ndim() as u64);
        t.shape().iter().for_each(|&d| eat(d as u64));
    }
    let mine = [named.len() as i64, h as i64];
    let mut all = vec![0i64; 2 * n];
    comm.all_gather_slice(&mine, &mut all)?;
    let differ: Vec<usize> = (1..n).filter(|&k| all[2 * k..2 * k + 2] != all[..2]).collect();
    if differ.is_empty() {
        return Ok(());
    }
    let shapes: Vec<String> = named
        .iter()
        .take(8)
        .map(|(name, t)| format!("{name} {:?} {}", t.shape(), t.dtype()))
        .collect();
    Err(CommError::arg(
        "DistributedDataParallel::new",
        format!(
            "ranks {differ:?} hold parameters whose count, shapes or dtypes differ from rank 0's (rank 0: {} tensors; rank {}: {} tensors: {}{})",
            all[0],
            comm.rank(),
            named.len(),
            shapes.join(", "),
            if named.len() > 8 { ", ..." } else { "" }
        ),
    ))
}

/// Rank `root`'s `tensors` on every rank (a collective: every rank passes
/// tensors of the same shapes and dtypes). Tensors of one dtype travel
/// together in flat buffers of at most 250 MiB; dtypes that collectives do
/// not carry (u8, u32, bool) travel as i64, which holds them exactly.
/// Errors when the ranks' tensors differ or communication fails.
pub fn broadcast_coalesced(comm: &dyn Communicator, tensors: &[Tensor], root: usize) -> Result<Vec<Tensor>> {
    let mut out: Vec<Option<Tensor>> = vec![None; tensors.len()];
    let wire = |d: DType| match d {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::I64 => d,
        _ => DType::I64,
    };
    let mut dtypes: Vec<DType> = Vec::new();
    for t in tensors {
        if !dtypes.contains(&wire(t.dtype())) {
            dtypes.push(wire(t.dtype()));
        }
    }
    for dtype in dtypes {
        let mut chunk: Vec<usize> = Vec::new();
        let mut bytes = 0usize;
        let members: Vec<usize> = (0..tensors.len())
            .filter(|&i| wire(tensors[i].dtype()) == dtype)
            .collect();
        for (k, &i) in members.iter().enumerate() {
            chunk.push(i);
            bytes += tensors[i].numel() * dtype.size_in_bytes();
            let last = k + 1 == members.len();
            if last
                || bytes + tensors[members[k + 1]].numel() * dtype.size_in_bytes() > BROADCAST_BUCKET_BYTES
            {
                broadcast_chunk(comm, tensors, &chunk, dtype, root, &mut out)?;
                chunk.clear();
                bytes = 0;
            }
        }
    }
    Ok(out
        .into_iter()
        .map(|t| t.expect("every tensor is in one chunk"))
        .collect())
}

fn broadcast_chunk(
    comm: &dyn Communicator,
    tensors: &[Tensor],
    chunk: &[usize],
    dtype: DType,
    root: usize,
    out: &mut [Option<Tensor>],
) -> Result<()> {
    fn go<T: CommElement>(
        comm: &dyn Communicator,
        tensors: &[Tensor],
        chunk: &[usize],
        root: usize,
        out: &mut [Option<Tensor>],
    ) -> Result<()> {
        let mut flat: Vec<T> = Vec::new();
        for &i in chunk {
            flat.extend(tensors[i].to_dtype(T::DTYPE)?.to_vec::<T>()?);
        }
        comm.broadcast_slice(&mut flat, root)?;
        let mut at = 0;
        for &i in chunk {
            let n = tensors[i].numel();
            let t = Tensor::from_slice(&flat[at..at + n], tensors[i].shape())?;
            out[i] = Some(t.to_dtype(tensors[i].dtype())?);
            at += n;
        }
        Ok(())
    }
    match dtype {
        DType::F32 => go::<f32>(comm, tensors, chunk, root, out),
        DType::F64 => go::<f64>(comm, tensors, chunk, root, out),
        DType::F16 => go::<f16>(comm, tensors, chunk, root, out),
        DType::BF16 => go::<bf16>(comm, tensors, chunk, root, out),
        _ => go::<i64>(comm, tensors, chunk, root, out),
    }
}
