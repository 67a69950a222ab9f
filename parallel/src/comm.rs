//! The [`Communicator`] trait every backend implements, and [`CommExt`]:
//! the typed-slice and tensor methods built on it.
//!
//! Semantics follow NCCL (spec §1.1): every rank of a group must issue the
//! same collectives in the same order with matching dtypes and lengths; a
//! rank that does not is reported as an error on the ranks that notice,
//! never as a hang. Collectives on a group of one rank return their input
//! and never touch the transport.

use tessera_tensor::{bf16, f16, DType, Device, Element, Tensor};

use crate::element::{Buf, BufMut, CommElement, ReduceOp};
use crate::error::{CommError, Result};

/// A group of ranks that exchange messages and run collectives.
///
/// The methods take dtype-tagged buffers ([`Buf`], [`BufMut`]) so that the
/// trait stays object-safe (`Box<dyn Communicator>` for sub-groups); call
/// the typed forms of [`CommExt`] (`all_reduce_slice`, `all_reduce` on a
/// tensor, ...) instead. Every method returns an error naming the call, the
/// ranks and the sizes when the ranks disagree, a peer is gone, or a wait
/// runs past the communicator's timeout. As in NCCL, any error of a
/// collective (an invalid argument too, which the other ranks cannot see)
/// aborts the group: this rank's later calls fail, and so do the other
/// ranks' pending and later calls, at once rather than at their timeout.
/// Point-to-point errors leave the group usable.
pub trait Communicator: Send + Sync {
    /// This rank's index in the group, `0 .. world_size()`.
    fn rank(&self) -> usize;
    /// The number of ranks in the group.
    fn world_size(&self) -> usize;
    /// The backend's name (`local`, `tcp`, `nccl`).
    fn backend(&self) -> &'static str;

    /// Sends `data` to rank `dst` with a user tag; returns once the data is
    /// buffered (it does not wait for the receiver). Errors when `dst` is
    /// outside the group or is this rank, or when `dst` is gone.
    fn send_buf(&self, data: Buf<'_>, dst: usize, tag: u64) -> Result<()>;
    /// Receives into `out` the message that rank `src` sent with `tag`.
    /// Errors when the dtype or the element count differs from the send,
    /// when `src` is invalid or gone, or on timeout.
    fn recv_buf(&self, out: BufMut<'_>, src: usize, tag: u64) -> Result<()>;
    /// Sends raw bytes to rank `dst` with a tag (errors as [`Communicator::send_buf`]).
    fn send_bytes(&self, data: &[u8], dst: usize, tag: u64) -> Result<()>;
    /// Receives the raw bytes rank `src` sent with `tag`, whatever their
    /// length (errors as [`Communicator::recv_buf`]).
    fn recv_bytes(&self, src: usize, tag: u64) -> Result<Vec<u8>>;

    /// In place: `buf[i] = op over ranks k of buf_k[i]`, bitwise the same on
    /// every rank. Errors when the ranks' lengths or dtypes differ.
    fn all_reduce_buf(&self, buf: BufMut<'_>, op: ReduceOp) -> Result<()>;
    /// `output = op over ranks k of input_k[rank·c .. (rank+1)·c)` where
    /// `c = output.len()` and `input.len() == world_size·c`.
    fn reduce_scatter_buf(&self, input: Buf<'_>, output: BufMut<'_>, op: ReduceOp) -> Result<()>;
    /// `output[k·c .. (k+1)·c) = input_k` for every rank k, where
    /// `c = input.len()` and `output.len() == world_size·c`.
    fn all_gather_buf(&self, input: Buf<'_>, output: BufMut<'_>) -> Result<()>;
    /// In place: every rank's `buf` becomes rank `root`'s.
    fn broadcast_buf(&self, buf: BufMut<'_>, root: usize) -> Result<()>;
    /// In place on `root`: `buf = op over ranks of buf_k`; the other ranks'
    /// buffers are left unchanged. The result is bitwise the all-reduce's.
    fn reduce_buf(&self, buf: BufMut<'_>, op: ReduceOp, root: usize) -> Result<()>;
    /// `input` holds `world_size` equal blocks, block j for rank j;
    /// `output` receives block `rank` of every rank, in rank order.
    fn all_to_all_buf(&self, input: Buf<'_>, output: BufMut<'_>) -> Result<()>;
    /// Returns once every rank of the group has entered the barrier.
    fn barrier(&self) -> Result<()>;
    /// Splits the group (a collective, like `MPI_Comm_split`): ranks that pass
    /// the same `color` form a new group, ordered by `(key, rank)`; ranks
    /// passing `None` get `None`. The sub-group shares this one's transport.
    fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Box<dyn Communicator>>>;
}

/// Typed-slice and tensor forms of the [`Communicator`] methods, for every
/// communicator (also `dyn Communicator`).
///
/// The slice forms work in place on flat buffers without copies (what DDP
/// and ZeRO reduce); the tensor forms take any CPU tensor of a payload dtype
/// (f32, f64, f16, bf16, i64; views are made contiguous) and return a new
/// tensor.
pub trait CommExt: Communicator {
    /// [`Communicator::all_reduce_buf`] on a typed slice.
    fn all_reduce_slice<T: CommElement>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.all_reduce_buf(T::buf_mut(buf), op)
    }
    /// [`Communicator::reduce_scatter_buf`] on typed slices.
    fn reduce_scatter_slice<T: CommElement>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.reduce_scatter_buf(T::buf(input), T::buf_mut(output), op)
    }
    /// [`Communicator::all_gather_buf`] on typed slices.
    fn all_gather_slice<T: CommElement>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.all_gather_buf(T::buf(input), T::buf_mut(output))
    }
    /// [`Communicator::broadcast_buf`] on a typed slice.
    fn broadcast_slice<T: CommElement>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.broadcast_buf(T::buf_mut(buf), root)
    }
    /// [`Communicator::reduce_buf`] on a typed slice.
    fn reduce_slice<T: CommElement>(&self, buf: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        self.reduce_buf(T::buf_mut(buf), op, root)
    }
    /// [`Communicator::all_to_all_buf`] on typed slices.
    fn all_to_all_slice<T: CommElement>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.all_to_all_buf(T::buf(input), T::buf_mut(output))
    }
    /// [`Communicator::send_buf`] of a typed slice.
    fn send_slice<T: CommElement>(&self, data: &[T], dst: usize, tag: u64) -> Result<()> {
        self.send_buf(T::buf(data), dst, tag)
    }
    /// [`Communicator::recv_buf`] into a typed slice.
    fn recv_slice<T: CommElement>(&self, out: &mut [T], src: usize, tag: u64) -> Result<()> {
        self.recv_buf(T::buf_mut(out), src, tag)
    }

    /// The all-reduce of a tensor: a new tensor of the same shape.
    fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let mut data = TensorData::of("all_reduce", t)?;
        self.all_reduce_buf(data.buf_mut(), op)?;
        data.into_tensor(t.shape())
    }
    /// The reduce-scatter of a tensor along dim 0: input `[n·m, ...]`,
    /// output `[m, ...]` (errors when dim 0 is not divisible by the group size).
    fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let n = self.world_size();
        let shape = split_dim0("reduce_scatter", t.shape(), n)?;
        let input = TensorData::of("reduce_scatter", t)?;
        let mut out = TensorData::zeros(t.dtype(), shape.iter().product());
        self.reduce_scatter_buf(input.buf(), out.buf_mut(), op)?;
        out.into_tensor(&shape)
    }
    /// The all-gather of a tensor along dim 0, in rank order: input
    /// `[m, ...]`, output `[n·m, ...]` (a 0-d input gives `[n]`).
    fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        let n = self.world_size();
        let mut shape = if t.ndim() == 0 {
            vec![1]
        } else {
            t.shape().to_vec()
        };
        shape[0] *= n;
        let input = TensorData::of("all_gather", t)?;
        let mut out = TensorData::zeros(t.dtype(), t.numel() * n);
        self.all_gather_buf(input.buf(), out.buf_mut())?;
        out.into_tensor(&shape)
    }
    /// Rank `root`'s tensor on every rank; the others pass a tensor of the
    /// same shape and dtype (its values are ignored).
    fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        let mut data = TensorData::of("broadcast", t)?;
        self.broadcast_buf(data.buf_mut(), root)?;
        data.into_tensor(t.shape())
    }
    /// The reduction on `root`; the other ranks get their input back.
    fn reduce(&self, t: &Tensor, op: ReduceOp, root: usize) -> Result<Tensor> {
        let mut data = TensorData::of("reduce", t)?;
        self.reduce_buf(data.buf_mut(), op, root)?;
        data.into_tensor(t.shape())
    }
    /// All-to-all along dim 0: block j of `t` (dim 0 split in n equal
    /// blocks) goes to rank j; the output stacks the received blocks in
    /// rank order, with the input's shape.
    fn all_to_all(&self, t: &Tensor) -> Result<Tensor> {
        split_dim0("all_to_all", t.shape(), self.world_size())?;
        let input = TensorData::of("all_to_all", t)?;
        let mut out = TensorData::zeros(t.dtype(), t.numel());
        self.all_to_all_buf(input.buf(), out.buf_mut())?;
        out.into_tensor(t.shape())
    }
    /// Sends a tensor (any dtype, any shape) to rank `dst` with a tag.
    fn send_tensor(&self, t: &Tensor, dst: usize, tag: u64) -> Result<()> {
        self.send_bytes(&encode_tensor(t)?, dst, tag)
    }
    /// Receives the tensor rank `src` sent with `tag`, with its shape and dtype.
    fn recv_tensor(&self, src: usize, tag: u64) -> Result<Tensor> {
        decode_tensor(&self.recv_bytes(src, tag)?)
    }
}

impl<C: Communicator + ?Sized> CommExt for C {}

/// Whether any rank of `comm` raised its flag (a loss scaler's inf/NaN
/// verdict, so that every rank acts on the same one): `local` all-reduced
/// with max. A collective. Errors, as a tensor error naming `op`, when the
/// all-reduce fails.
pub(crate) fn any_rank(
    comm: &dyn Communicator,
    local: bool,
    op: &'static str,
) -> tessera_tensor::Result<bool> {
    let mut flag = [f64::from(u8::from(local))];
    comm.all_reduce_slice(&mut flag, ReduceOp::Max)
        .map_err(|e| tessera_tensor::Error::io(op, format!("all-reducing the inf/NaN flag failed: {e}")))?;
    Ok(flag[0] > 0.0)
}

/// A tensor's elements copied out into an owned typed vector.
enum TensorData {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I64(Vec<i64>),
}

macro_rules! with_data {
    ($d:expr, $v:ident => $body:expr) => {
        match $d {
            TensorData::F32($v) => $body,
            TensorData::F64($v) => $body,
            TensorData::F16($v) => $body,
            TensorData::BF16($v) => $body,
            TensorData::I64($v) => $body,
        }
    };
}

impl TensorData {
    fn of(op: &'static str, t: &Tensor) -> Result<Self> {
        if t.device() != Device::Cpu {
            return Err(CommError::arg(
                op,
                format!("tensor is on {}, collectives take CPU tensors", t.device()),
            ));
        }
        Ok(match t.dtype() {
            DType::F32 => TensorData::F32(t.to_vec()?),
            DType::F64 => TensorData::F64(t.to_vec()?),
            DType::F16 => TensorData::F16(t.to_vec()?),
            DType::BF16 => TensorData::BF16(t.to_vec()?),
            DType::I64 => TensorData::I64(t.to_vec()?),
            d => return Err(unsupported(op, d)),
        })
    }

    fn zeros(dtype: DType, n: usize) -> Self {
        match dtype {
            DType::F64 => TensorData::F64(vec![0.0; n]),
            DType::F16 => TensorData::F16(vec![Element::ZERO; n]),
            DType::BF16 => TensorData::BF16(vec![Element::ZERO; n]),
            DType::I64 => TensorData::I64(vec![0; n]),
            _ => TensorData::F32(vec![0.0; n]),
        }
    }

    fn buf(&self) -> Buf<'_> {
        with_data!(self, v => CommElement::buf(v.as_slice()))
    }

    fn buf_mut(&mut self) -> BufMut<'_> {
        with_data!(self, v => CommElement::buf_mut(v.as_mut_slice()))
    }

    fn into_tensor(self, shape: &[usize]) -> Result<Tensor> {
        Ok(with_data!(self, v => Tensor::from_vec(v, shape)?))
    }
}

fn unsupported(op: &'static str, d: DType) -> CommError {
    CommError::arg(
        op,
        format!("dtype {d} is not a payload dtype (f32, f64, f16, bf16, i64)"),
    )
}

/// The shape with dim 0 divided by `n`; errors for 0-d tensors and when
/// dim 0 is not divisible.
fn split_dim0(op: &'static str, shape: &[usize], n: usize) -> Result<Vec<usize>> {
    match shape.first() {
        Some(&d0) if d0 % n == 0 => {
            let mut s = shape.to_vec();
            s[0] = d0 / n;
            Ok(s)
        }
        _ => Err(CommError::arg(
            op,
            format!("dim 0 of shape {shape:?} must be divisible by the group size {n}"),
        )),
    }
}

/// Wire form of a tensor: dtype code, ndim, dims (u64 LE), then the
/// elements in row-major order (little-endian, as in memory).
fn encode_tensor(t: &Tensor) -> Result<Vec<u8>> {
    if t.device() != Device::Cpu {
        return Err(CommError::arg(
            "send_tensor",
            format!("tensor is on {}", t.device()),
        ));
    }
    let c = t.contiguous()?;
    let mut out = Vec::with_capacity(16 + 8 * t.ndim() + c.storage().as_bytes().len());
    out.extend_from_slice(&(crate::frame::dtype_code(t.dtype()) as u64).to_le_bytes());
    out.extend_from_slice(&(t.ndim() as u64).to_le_bytes());
    for &d in t.shape() {
        out.extend_from_slice(&(d as u64).to_le_bytes());
    }
    let elem = t.dtype().size_in_bytes();
    let start = c.layout().offset() * elem;
    out.extend_from_slice(&c.storage().as_bytes()[start..start + c.numel() * elem]);
    Ok(out)
}

/// Parses [`encode_tensor`]'s form; errors on malformed bytes.
fn decode_tensor(b: &[u8]) -> Result<Tensor> {
    let bad = |msg: &str| {
        CommError::arg(
            "recv_tensor",
            format!("malformed tensor message ({} bytes): {msg}", b.len()),
        )
    };
    let word = |i: usize| -> Result<u64> {
        b.get(8 * i..8 * i + 8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
            .ok_or_else(|| bad("truncated header"))
    };
    let dtype = u8::try_from(word(0)?)
        .ok()
        .and_then(crate::frame::dtype_of_code)
        .ok_or_else(|| bad("unknown dtype"))?;
    let ndim = usize::try_from(word(1)?).map_err(|_| bad("ndim"))?;
    if ndim > 64 {
        return Err(bad("more than 64 dimensions"));
    }
    let shape = (0..ndim)
        .map(|i| word(2 + i).and_then(|d| usize::try_from(d).map_err(|_| bad("dim"))))
        .collect::<Result<Vec<usize>>>()?;
    let data = &b[8 * (2 + ndim)..];
    let numel = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad("shape overflows"))?;
    if numel.checked_mul(dtype.size_in_bytes()) != Some(data.len()) {
        return Err(bad(&format!(
            "shape {shape:?} of {dtype} does not match {} data bytes",
            data.len()
        )));
    }
    let size = dtype.size_in_bytes();
    let pods = |_: ()| data.chunks_exact(size);
    Ok(match dtype {
        DType::F32 => Tensor::from_vec(
            pods(())
                .map(bytemuck::pod_read_unaligned::<f32>)
                .collect::<Vec<_>>(),
            &shape,
        )?,
        DType::F64 => Tensor::from_vec(
            pods(())
                .map(bytemuck::pod_read_unaligned::<f64>)
                .collect::<Vec<_>>(),
            &shape,
        )?,
        DType::F16 => Tensor::from_vec(
            pods(())
                .map(bytemuck::pod_read_unaligned::<f16>)
                .collect::<Vec<_>>(),
            &shape,
        )?,
        DType::BF16 => Tensor::from_vec(
            pods(())
                .map(bytemuck::pod_read_unaligned::<bf16>)
                .collect::<Vec<_>>(),
            &shape,
        )?,
        DType::I64 => Tensor::from_vec(
            pods(())
                .map(bytemuck::pod_read_unaligned::<i64>)
                .collect::<Vec<_>>(),
            &shape,
        )?,
        DType::U32 => Tensor::from_vec(
            pods(())
                .map(bytemuck::pod_read_unaligned::<u32>)
                .collect::<Vec<_>>(),
            &shape,
        )?,
        DType::U8 => Tensor::from_vec(data.to_vec(), &shape)?,
        DType::Bool => Tensor::from_vec(data.iter().map(|&b| b != 0).collect::<Vec<bool>>(), &shape)?,
    })
}
