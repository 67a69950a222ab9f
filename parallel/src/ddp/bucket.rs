//! Bucket assignment: which parameters' gradients travel together in one
//! all-reduce (PyTorch's `_compute_bucket_assignment_by_size`, spec §2.1).

use tessera_tensor::DType;

/// PyTorch's `kDefaultFirstBucketBytes`: the limit of the bucket holding the
/// first-defined parameters (the last gradients backward produces).
pub const DEFAULT_FIRST_BUCKET_BYTES: usize = 1024 * 1024;

/// PyTorch's default `bucket_cap_mb = 25`, in bytes.
pub const DEFAULT_BUCKET_CAP_BYTES: usize = 25 * 1024 * 1024;

/// One bucket: parameters of one dtype laid out back to back in a flat
/// buffer, in definition order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketSpec {
    /// The dtype of every gradient in the bucket.
    pub dtype: DType,
    /// Indices of the parameters (into the list the plan was made from).
    pub params: Vec<usize>,
    /// Element offset of each parameter's gradient in the flat buffer.
    pub offsets: Vec<usize>,
    /// The flat buffer's length in elements.
    pub numel: usize,
}

/// Packs parameters (`(dtype, numel)` in definition order) into buckets,
/// as PyTorch does: per dtype, a bucket closes when adding the next
/// parameter would take it past its limit (the first bucket of each dtype
/// `first_bytes`, later ones `cap_bytes`; a parameter larger than the limit
/// gets a bucket of its own). The buckets are then ordered by their first
/// parameter and reversed, so bucket 0 holds the last-defined parameters,
/// whose gradients backward produces first. A limit of 0 puts every
/// parameter in its own bucket.
pub fn assign_buckets(params: &[(DType, usize)], first_bytes: usize, cap_bytes: usize) -> Vec<BucketSpec> {
    pack(params, |_, _| false, first_bytes, cap_bytes)
}

/// [`assign_buckets`] that never separates the parameters of one module:
/// `modules[i]` names the module that owns parameter `i`, and a bucket
/// only closes between parameters of different modules (a module whose
/// parameters exceed the limit gets a bucket of its own). What
/// [`super::DistributedDataParallel`] uses: a layer's weight and bias get
/// their gradients from one fused backward node, at the same moment, so a
/// bucket boundary between them would hold the bias's bucket (whose other
/// gradients are long final) until the end of the weight's node. For a
/// `784–1024–1024–10` MLP under the 1 MiB first-bucket limit PyTorch's
/// packing puts the first layer's bias in the big bucket, which then
/// waits for the last gradient of backward; here that bucket is launched
/// before the first layer's backward and overlaps it. Errors never; a
/// `modules` shorter than `params` treats the rest as modules of their own.
pub fn assign_buckets_by_module(
    params: &[(DType, usize)],
    modules: &[&str],
    first_bytes: usize,
    cap_bytes: usize,
) -> Vec<BucketSpec> {
    let same = |a: usize, b: usize| matches!((modules.get(a), modules.get(b)), (Some(x), Some(y)) if x == y);
    pack(params, same, first_bytes, cap_bytes)
}

/// The packing of [`assign_buckets`], where `same_module(i, j)` says that
/// parameters `i` and `j` must share a bucket when they are adjacent in it.
fn pack(
    params: &[(DType, usize)],
    same_module: impl Fn(usize, usize) -> bool,
    first_bytes: usize,
    cap_bytes: usize,
) -> Vec<BucketSpec> {
    // One open bucket per dtype, with the number of buckets that dtype has
    // closed (which decides its limit).
    let mut open: Vec<(BucketSpec, usize, usize)> = Vec::new();
    let mut closed: Vec<BucketSpec> = Vec::new();
    for (i, &(dtype, numel)) in params.iter().enumerate() {
        let bytes = numel.saturating_mul(dtype.size_in_bytes());
        let k = match open.iter().position(|(b, _, _)| b.dtype == dtype) {
            Some(k) => k,
            None => {
                open.push((empty(dtype), 0, 0));
                open.len() - 1
            }
        };
        let (bucket, used, n_closed) = &mut open[k];
        let limit = if *n_closed == 0 { first_bytes } else { cap_bytes };
        let joined = bucket.params.last().is_some_and(|&j| same_module(j, i));
        if !bucket.params.is_empty() && !joined && used.saturating_add(bytes) > limit {
            closed.push(std::mem::replace(bucket, empty(dtype)));
            *used = 0;
            *n_closed += 1;
        }
        bucket.params.push(i);
        bucket.offsets.push(bucket.numel);
        bucket.numel += numel;
        *used = used.saturating_add(bytes);
    }
    closed.extend(
        open.into_iter()
            .map(|(b, _, _)| b)
            .filter(|b| !b.params.is_empty()),
    );
    closed.sort_by_key(|b| std::cmp::Reverse(b.params[0]));
    closed
}

fn empty(dtype: DType) -> BucketSpec {
    BucketSpec {
        dtype,
        params: Vec::new(),
        offsets: Vec::new(),
        numel: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn indices(b: &[BucketSpec]) -> Vec<Vec<usize>> {
        b.iter().map(|b| b.params.clone()).collect()
    }

    #[test]
    fn first_bucket_small_then_cap_then_reversed() {
        // f32: 4 bytes per element. Limits: first 40 bytes, then 80.
        let p = [
            (DType::F32, 6),
            (DType::F32, 4),
            (DType::F32, 10),
            (DType::F32, 10),
            (DType::F32, 30),
        ];
        let b = assign_buckets(&p, 40, 80);
        // Definition order: [0,1] (40 B), [2,3] (80 B), [4] (120 B alone); reversed.
        assert_eq!(indices(&b), vec![vec![4], vec![2, 3], vec![0, 1]]);
        assert_eq!(b[1].offsets, vec![0, 10]);
        assert_eq!(b[1].numel, 20);
    }

    #[test]
    fn dtypes_never_share_a_bucket_and_zero_limit_isolates() {
        let p = [(DType::F32, 2), (DType::F64, 2), (DType::F32, 2), (DType::F64, 2)];
        let b = assign_buckets(&p, 1 << 20, 1 << 20);
        assert_eq!(indices(&b), vec![vec![1, 3], vec![0, 2]]);
        assert_eq!(b[0].dtype, DType::F64);
        let b = assign_buckets(&p, 0, 0);
        assert_eq!(indices(&b), vec![vec![3], vec![2], vec![1], vec![0]]);
        assert!(assign_buckets(&[], 1, 1).is_empty());
    }

    /// The MNIST MLP 784–1024–1024–10 under the default limits: PyTorch's
    /// packing leaves the first layer's bias in the big bucket; by module,
    /// the first layer's weight and bias form the last bucket.
    #[test]
    fn a_module_never_straddles_a_bucket_boundary() {
        let p = [
            (DType::F32, 784 * 1024),
            (DType::F32, 1024),
            (DType::F32, 1024 * 1024),
            (DType::F32, 1024),
            (DType::F32, 10 * 1024),
            (DType::F32, 10),
        ];
        let modules = ["0", "0", "2", "2", "4", "4"];
        let (first, cap) = (DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_BUCKET_CAP_BYTES);
        assert_eq!(
            indices(&assign_buckets(&p, first, cap)),
            vec![vec![1, 2, 3, 4, 5], vec![0]]
        );
        let b = assign_buckets_by_module(&p, &modules, first, cap);
        assert_eq!(indices(&b), vec![vec![2, 3, 4, 5], vec![0, 1]]);
        // Small limits still split between modules, never inside one.
        let b = assign_buckets_by_module(&p, &modules, 4, 4);
        assert_eq!(indices(&b), vec![vec![4, 5], vec![2, 3], vec![0, 1]]);
        // Without module names it is PyTorch's packing.
        assert_eq!(assign_buckets_by_module(&p, &[], 4, 4), assign_buckets(&p, 4, 4));
    }
}
