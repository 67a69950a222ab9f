//! The `nccl` backend (feature `cuda`): without a GPU or NCCL it must
//! report "unavailable" on every rank, not panic; with one GPU it must pass
//! the collective suite at n = 1.
#![cfg(feature = "cuda")]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{check_case, Case, DTYPES};
use tessera_parallel::nccl::{check_available, NcclComm};
use tessera_parallel::{CommConfig, CommError, Communicator, LocalGroup, ReduceOp};

#[test]
fn nccl_reports_unavailable_or_passes_the_suite() {
    let timeout = Duration::from_secs(60);
    if let Err(why) = check_available(0) {
        eprintln!("no NCCL here ({why}): checking the error path");
        let comms = LocalGroup::comms(2, CommConfig::default()).unwrap();
        let res: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|c| s.spawn(move || NcclComm::new(Arc::new(c), 0, timeout).err()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for e in res {
            assert!(matches!(e, Some(CommError::Unavailable { .. })), "{e:?}");
        }
        return;
    }
    let cpu = LocalGroup::comms(1, CommConfig::default())
        .unwrap()
        .pop()
        .unwrap();
    let comm = NcclComm::new(Arc::new(cpu), 0, timeout).unwrap();
    assert_eq!(comm.backend(), "nccl");
    for (i, &dtype) in DTYPES.iter().enumerate() {
        for len in [0, 1, 1000] {
            let case = Case {
                seed: i as u64,
                len,
                dtype,
                op: ReduceOp::ALL[i],
                root: 0,
            };
            check_case(&comm, &case).unwrap();
        }
    }
}
