//! The emulator must catch what it promises to catch: each deliberately
//! broken kernel of `emu/faults.cu` fails with a message naming block and
//! thread, and the fixed twin passes.

use crate::common;

use common::exec::RtExec;
use common::{Exec, ORDERS};
use tessera_cuda_kernels::emu::ThreadOrder;
use tessera_cuda_kernels::{Arg, DevPtr, Launch, Module};

fn launch(kernel: &str, block: u32, smem: u32, args: Vec<Arg>) -> Launch {
    // The module is irrelevant to the emulator, which looks kernels up by name.
    Launch {
        module: Module::Elementwise,
        kernel: kernel.into(),
        grid: [2, 1, 1],
        block: [block, 1, 1],
        shared_mem: smem,
        args,
    }
}

fn run(e: &RtExec, kernel: &str, block: u32, smem: u32, out: DevPtr<f32>) -> Result<(), String> {
    e.run(&launch(kernel, block, smem, vec![Arg::ptr(out)]))
}

fn expect_err(kernel: &str, block: u32, needle: &str) {
    for order in ORDERS {
        let e = RtExec::emu(order);
        let out = e.upload(&vec![0f32; block as usize]);
        let err = run(&e, kernel, block, 0, out).expect_err(kernel);
        // The first block to run (and fail) depends on the order.
        let coords = ["block (0,0,0) thread (", "block (1,0,0) thread ("];
        assert!(
            err.contains(needle) && coords.iter().any(|c| err.contains(c)),
            "{kernel}: {err}"
        );
    }
}

#[test]
fn missing_barrier_changes_with_thread_order() {
    let want: Vec<f32> = (0..64).rev().map(|t| t as f32).collect();
    let mut wrong = 0;
    for order in ORDERS {
        let e = RtExec::emu(order);
        let out = e.upload(&vec![0f32; 64]);
        run(&e, "fault_missing_barrier", 64, 256, out).unwrap();
        wrong += (e.download(out) != want) as usize;
        let fixed = e.upload(&vec![0f32; 64]);
        run(&e, "fault_fixed_barrier", 64, 256, fixed).unwrap();
        assert_eq!(e.download(fixed), want, "{}", e.name());
    }
    assert_eq!(wrong, ORDERS.len(), "every order must expose the missing barrier");
}

#[test]
fn divergent_barrier_is_reported() {
    expect_err("fault_divergent_barrier", 64, "divergent __syncthreads");
}

#[test]
fn exit_before_barrier_is_reported() {
    expect_err("fault_early_exit", 64, "exited while");
}

#[test]
fn shuffle_with_exited_lane_is_reported() {
    expect_err("fault_shfl_exited_lane", 32, "which exited");
}

#[test]
fn deadlock_is_reported() {
    expect_err("fault_deadlock", 64, "deadlock");
}

#[test]
fn cp_async_read_before_wait_sees_no_data() {
    let e = RtExec::emu(ThreadOrder::Forward);
    let input = e.upload(&vec![2f32; 128]);
    let out = e.upload(&[0f32; 32]);
    e.run(&launch(
        "fault_cp_async_no_wait",
        32,
        512,
        vec![Arg::ptr(input), Arg::ptr(out)],
    ))
    .unwrap();
    assert!(
        e.download(out).iter().all(|v| v.is_nan()),
        "shared memory is poisoned until the copy lands"
    );
}

#[test]
fn out_of_bounds_write_is_reported() {
    let e = RtExec::emu(ThreadOrder::Forward);
    let out = e.upload(&[0f32; 8]);
    let err = e
        .run(&launch(
            "fault_out_of_bounds",
            32,
            0,
            vec![Arg::ptr(out), Arg::i32(8)],
        ))
        .unwrap_err();
    assert!(err.contains("outside buffer"), "{err}");
}

#[test]
fn bad_launches_are_errors() {
    let e = RtExec::emu(ThreadOrder::Forward);
    let out = e.upload(&[0f32; 8]);
    assert!(e
        .run(&launch("no_such_kernel", 32, 0, vec![]))
        .unwrap_err()
        .contains("unknown kernel"));
    assert!(run(&e, "fault_fixed_barrier", 2048, 0, out)
        .unwrap_err()
        .contains("block size"));
}

/// Blocks run in the thread order's sense too: forward, reverse, or a
/// random permutation, so a kernel relying on an order between blocks
/// gives different results.
#[test]
fn block_order_follows_the_thread_order() {
    let mut seen = Vec::new();
    for order in ORDERS {
        let e = RtExec::emu(order);
        let out = e.upload(&[0f32; 17]);
        let mut l = launch("fault_block_order", 32, 0, vec![Arg::ptr(out)]);
        l.grid = [8, 2, 1];
        e.run(&l).unwrap();
        let tickets: Vec<usize> = e.download(out)[..16].iter().map(|&t| t as usize).collect();
        let mut sorted = tickets.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..16).collect::<Vec<_>>(),
            "{}: every block once",
            e.name()
        );
        match order {
            ThreadOrder::Forward => assert_eq!(tickets, (0..16).collect::<Vec<_>>()),
            ThreadOrder::Reverse => assert_eq!(tickets, (0..16).rev().collect::<Vec<_>>()),
            ThreadOrder::Random(_) => {}
        }
        seen.push(tickets);
    }
    assert_ne!(seen[2], seen[0], "a random order is not the forward one");
    assert_ne!(seen[2], seen[3], "two seeds give two orders");
}
