//! The training examples' thread pool, built once from `main` (declared by
//! the binaries only: the tests that include `common` run in a pool of
//! their own).

use super::common::BoxResult;

/// Builds the CPU thread pool once, from `main`: `threads` workers (all
/// cores when `None`), with this thread one of them when the training loop
/// runs on it (`caller_trains`: one process, or one rank per process), as
/// PyTorch's intra-op pool does; not when this thread only waits for rank
/// threads, whose ops then use every worker.
pub(crate) fn init(threads: Option<usize>, caller_trains: bool) -> BoxResult<()> {
    if caller_trains {
        tessera::tensor::init_thread_pool(threads)?;
    } else if let Some(n) = threads {
        rayon::ThreadPoolBuilder::new().num_threads(n).build_global()?;
    }
    Ok(())
}
