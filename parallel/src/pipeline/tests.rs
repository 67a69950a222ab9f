//! Schedule generators against the spec's golden tables, and every
//! generated schedule through the §5.6 checks and the unit-cost simulation.

use super::interleaved::schedule_table;
use super::*;

/// The golden table of spec §5.2 (DeepSpeed `TrainSchedule`, M=4, S=3).
const DS_GOLDEN_M4_S3: &str = "
0  | Load0 F0                             | -                                     | -
1  | SendAct0                             | RecvAct0 F0                           | -
2  | Load1 F1                             | SendAct0                              | RecvAct0 Load0 F0
3  | SendAct1                             | RecvAct1 F1                           | B0
4  | Load2 F2                             | RecvGrad0 SendAct1 B0                 | SendGrad0 RecvAct1 Load1 F1
5  | RecvGrad0 SendAct2 B0                | SendGrad0 RecvAct2 F2                 | B1
6  | Load3 F3                             | RecvGrad1 SendAct2 B1                 | SendGrad1 RecvAct2 Load2 F2
7  | RecvGrad1 SendAct3 B1                | SendGrad1 RecvAct3 F3                 | B2
8  | -                                    | RecvGrad2 SendAct3 B2                 | SendGrad2 RecvAct3 Load3 F3
9  | RecvGrad2 B2                         | SendGrad2                             | B3
10 | -                                    | RecvGrad3 B3                          | SendGrad3
11 | RecvGrad3 B3 RTG RG OPT              | SendGrad3 RTG RG OPT                  | RTG RG OPT
";

/// A table as rows of cells of instruction words, whitespace-insensitive.
fn cells(table: &str) -> Vec<Vec<Vec<String>>> {
    table
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.split('|')
                .map(|c| c.split_whitespace().map(str::to_string).collect())
                .collect()
        })
        .collect()
}

#[test]
fn deepspeed_train_schedule_reproduces_the_golden_table() {
    let s = Schedule::deepspeed(3, 4).unwrap();
    assert_eq!(cells(&s.table()), cells(DS_GOLDEN_M4_S3), "\n{}", s.table());
    assert_eq!(
        (0..3).map(|st| s.num_pipe_buffers(st)).collect::<Vec<_>>(),
        [3, 2, 2]
    );
    assert_eq!(s.buffer(0, 4), 1);
}

#[test]
fn deepspeed_facts_from_its_tests() {
    // S = 1: steps alternate [Load, F] / [B], the last B with the end instructions.
    let s = Schedule::deepspeed(1, 3).unwrap();
    let want = "0 | Load0 F0\n1 | B0\n2 | Load1 F1\n3 | B1\n4 | Load2 F2\n5 | B2 RTG RG OPT\n";
    assert_eq!(s.table(), want);
    for (stages, m) in [(2, 5), (4, 3), (6, 8)] {
        let s = Schedule::deepspeed(stages, m).unwrap();
        for st in 0..stages {
            assert_eq!(s.steps(st).len(), 2 * (m + stages - 1));
            let has = |f: fn(&Instr) -> bool| s.instrs(st).any(f);
            if st == 0 {
                assert!(!has(|i| matches!(
                    i,
                    Instr::SendGrad { .. } | Instr::RecvAct { .. }
                )));
            }
            if st == stages - 1 {
                assert!(!has(|i| matches!(
                    i,
                    Instr::SendAct { .. } | Instr::RecvGrad { .. }
                )));
            }
        }
        let inf = Schedule::inference(stages, m).unwrap();
        for st in 0..stages {
            assert_eq!(inf.steps(st).len(), m + stages - 1);
            assert_eq!(inf.num_pipe_buffers(st), 2);
        }
    }
}

#[test]
fn inference_schedule_alternates_send_and_receive_by_stage_parity() {
    let s = Schedule::inference(3, 2).unwrap();
    let want = "
0 | Load0 F0          | -                  | -
1 | Load1 SendAct0 F1 | RecvAct0 F0        | -
2 | SendAct1          | RecvAct1 SendAct0 F1 | Load0 RecvAct0 F0
3 | -                 | SendAct1           | Load1 RecvAct1 F1
";
    assert_eq!(cells(&s.table()), cells(want), "\n{}", s.table());
}

#[test]
fn megatron_schedule_table_example() {
    // MG docstring: p = 2, m = 5, v = 2, g = 3.
    let t = schedule_table(5, 2, 3);
    let mbs: Vec<usize> = t.iter().map(|x| x.0).collect();
    let chunks: Vec<usize> = t.iter().map(|x| x.1).collect();
    assert_eq!(mbs, [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]);
    assert_eq!(chunks, [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]);
    let s = Schedule::interleaved_grouped(2, 5, 2, 3).unwrap();
    s.check().unwrap();
    assert!(
        Schedule::interleaved_grouped(2, 5, 2, 4).is_err(),
        "5 % 4 = 1 < p"
    );
    assert!(Schedule::interleaved_grouped(2, 5, 2, 1).is_err(), "g < p");
}

/// MG `test_get_pipeline_parallel_order`: per rank a signed list, `+c` a
/// forward of chunk c (1-based), `-c` a backward.
#[test]
fn interleaved_order_passes_megatrons_signed_list_checks() {
    for (p, m, v) in [(2, 4, 2), (4, 8, 2), (4, 8, 3), (3, 6, 4)] {
        let s = Schedule::interleaved(p, m, v).unwrap();
        for r in 0..p {
            let signed: Vec<i64> = s
                .instrs(r)
                .filter_map(|i| match *i {
                    Instr::Fwd { chunk, .. } => Some(chunk as i64 + 1),
                    Instr::Bwd { chunk, .. } => Some(-(chunk as i64 + 1)),
                    _ => None,
                })
                .collect();
            assert_eq!(signed.len(), 2 * m * v);
            let mut count = vec![0i64; v + 1];
            for &x in &signed {
                count[x.unsigned_abs() as usize] += x.signum();
                assert!(
                    count.iter().all(|&c| c >= 0),
                    "p {p} m {m} v {v} rank {r}: {signed:?}"
                );
            }
            assert!(count.iter().all(|&c| c == 0));
        }
    }
}

#[test]
fn generators_reject_what_their_references_reject() {
    assert!(Schedule::gpipe(0, 4).is_err());
    assert!(Schedule::deepspeed(2, 0).is_err());
    assert!(Schedule::one_f_one_b(0, 0).is_err());
    assert!(Schedule::inference(0, 1).is_err());
    assert!(Schedule::interleaved(2, 4, 0).is_err());
    let e = Schedule::interleaved(4, 6, 2).unwrap_err().to_string();
    assert!(e.contains("multiple of the stage count"), "{e}");
    assert!(ScheduleKind::parse("zb-h1").is_err());
    for k in [
        ScheduleKind::GPipe,
        ScheduleKind::DeepSpeed,
        ScheduleKind::OneFOneB,
        ScheduleKind::Interleaved,
        ScheduleKind::Inference,
    ] {
        assert_eq!(ScheduleKind::parse(k.name()).unwrap(), k);
    }
}

#[test]
fn routes_wrap_from_the_last_stage_to_the_next_chunk() {
    let s = Schedule::interleaved(3, 3, 2).unwrap();
    let r = s.route(2, &Instr::SendAct { mb: 1, chunk: 0 }).unwrap();
    assert_eq!(
        (r.peer, r.send, r.msg),
        (
            0,
            true,
            Msg {
                grad: false,
                mb: 1,
                dest: 3
            }
        )
    );
    let r = s.route(0, &Instr::SendGrad { mb: 1, chunk: 1 }).unwrap();
    assert_eq!((r.peer, r.msg.dest), (2, 2));
    assert!(
        s.route(2, &Instr::SendAct { mb: 0, chunk: 1 }).is_none(),
        "past the last stage"
    );
    assert!(
        s.route(0, &Instr::RecvAct { mb: 0, chunk: 0 }).is_none(),
        "before the first"
    );
}

/// Every schedule for p ≤ 6, m ≤ 12 (v ≤ 4 for interleaved, m a multiple
/// of p) passes the §5.6 checks, holds the in-flight count of §5.5, and
/// simulates to the makespan `(v·m + p − 1)(f + b)` with unit and unequal
/// costs, every pass after the passes it depends on.
#[test]
fn every_small_schedule_passes_the_checks_and_meets_the_formulas() {
    let mut schedules = Vec::new();
    for p in 1..=6 {
        for m in 1..=12 {
            schedules.push(Schedule::gpipe(p, m).unwrap());
            schedules.push(Schedule::deepspeed(p, m).unwrap());
            schedules.push(Schedule::one_f_one_b(p, m).unwrap());
            schedules.push(Schedule::inference(p, m).unwrap());
            for v in 1..=4 {
                match Schedule::interleaved(p, m, v) {
                    Ok(s) => schedules.push(s),
                    Err(e) => assert!(m % p != 0 || (p == 1 && v > 1), "p {p} m {m} v {v}: {e}"),
                }
            }
        }
    }
    for s in &schedules {
        let name = format!(
            "{} p {} m {} v {}",
            s.kind().name(),
            s.stages(),
            s.micro_batches(),
            s.chunks()
        );
        s.check().unwrap_or_else(|e| panic!("{name}: {e}"));
        for st in 0..s.stages() {
            let (peak, bound) = (s.peak_in_flight(st), s.in_flight_bound(st));
            if s.kind() == ScheduleKind::DeepSpeed {
                assert!(peak <= bound, "{name} stage {st}: {peak} > {bound}");
            } else {
                assert_eq!(peak, bound, "{name} stage {st}");
            }
        }
        let (p, m, v) = (s.stages() as u64, s.micro_batches() as u64, s.chunks() as u64);
        for costs in [Costs::UNIT, Costs { fwd: 1, bwd: 2 }, Costs { fwd: 3, bwd: 1 }] {
            let t = simulate(s, costs).unwrap();
            let per_mb = if s.kind().trains() {
                costs.fwd + costs.bwd
            } else {
                costs.fwd
            };
            assert_eq!(t.makespan, (v * m + p - 1) * per_mb, "{name} {costs:?}");
            if costs == Costs::UNIT {
                let theory = s.bubble_theory();
                for st in 0..s.stages() {
                    assert!((t.idle_fraction(st) - theory).abs() < 1e-12, "{name}");
                }
            }
            check_dependencies(s, &t, &name);
        }
    }
}

/// F(k, mb) starts after F(k − 1, mb) ends, B(k, mb) after B(k + 1, mb),
/// and the last virtual stage's backward after its forward.
fn check_dependencies(s: &Schedule, t: &Timeline, name: &str) {
    let vs = s.virtual_stages();
    let span = |k: usize, fwd: bool, mb: usize| {
        let (st, chunk) = s.stage_chunk(k);
        let i = if fwd {
            Instr::Fwd { mb, chunk }
        } else {
            Instr::Bwd { mb, chunk }
        };
        t.passes[&(st, i)]
    };
    for mb in 0..s.micro_batches() {
        for k in 1..vs {
            assert!(
                span(k, true, mb).0 >= span(k - 1, true, mb).1,
                "{name} F({k}, {mb})"
            );
        }
        if s.kind().trains() {
            assert!(span(vs - 1, false, mb).0 >= span(vs - 1, true, mb).1, "{name}");
            for k in 0..vs - 1 {
                assert!(
                    span(k, false, mb).0 >= span(k + 1, false, mb).1,
                    "{name} B({k}, {mb})"
                );
            }
        }
    }
}

/// The checks catch what they claim to: each mutation of a valid schedule
/// is rejected.
#[test]
fn checks_reject_broken_schedules() {
    let good = Schedule::one_f_one_b(3, 4).unwrap();
    good.check().unwrap();
    let mutate = |f: &dyn Fn(&mut Vec<Vec<Step>>)| {
        let mut s = good.clone();
        f(&mut s.programs);
        s.check().map(|_| ()).unwrap_err().to_string()
    };
    // A dropped send: the receiver waits forever and the counts are off.
    let e = mutate(&|p| {
        p[0].iter_mut()
            .for_each(|st| st.retain(|i| *i != Instr::SendAct { mb: 2, chunk: 0 }))
    });
    assert!(e.contains("SendAct2"), "{e}");
    // A backward before its forward.
    let e = mutate(&|p| {
        let f = p[2]
            .iter()
            .position(|st| st.contains(&Instr::Fwd { mb: 0, chunk: 0 }))
            .unwrap();
        p[2][f].retain(|i| *i != Instr::Fwd { mb: 0, chunk: 0 });
        p[2].last_mut().unwrap().insert(0, Instr::Fwd { mb: 0, chunk: 0 });
    });
    assert!(e.contains("before its forward") || e.contains("after"), "{e}");
    // Swapped receive order: sends and receives no longer line up.
    let e = mutate(&|p| {
        let a = p[1]
            .iter()
            .position(|st| st.contains(&Instr::RecvAct { mb: 1, chunk: 0 }))
            .unwrap();
        let b = p[1]
            .iter()
            .position(|st| st.contains(&Instr::RecvAct { mb: 2, chunk: 0 }))
            .unwrap();
        for st in [a, b] {
            for i in p[1][st].iter_mut() {
                if let Instr::RecvAct { mb, .. } = i {
                    *mb = 3 - *mb;
                }
            }
        }
    });
    assert!(e.contains("receives") || e.contains("after its forward"), "{e}");
    // Megatron's fused pair split into blocking halves deadlocks under rendezvous.
    let s = Schedule::one_f_one_b(2, 2).unwrap();
    assert!(run_untimed(&s, Semantics::Batched).is_ok());
    let e = run_untimed(&s, Semantics::Blocking).unwrap_err().to_string();
    assert!(e.contains("deadlock"), "{e}");
    // Interleaving on two stages needs buffered sends (see `Schedule::check`).
    let s = Schedule::interleaved(2, 4, 2).unwrap();
    assert!(run_untimed(&s, Semantics::Buffered).is_ok());
    assert!(run_untimed(&s, Semantics::Batched).is_err());
}

proptest::proptest! {
    /// Interleaved schedules with any group size Megatron accepts pass the
    /// checks and keep the makespan `(v·m + p − 1)(f + b)`.
    #[test]
    fn interleaved_with_any_valid_group_passes_the_checks(p in 2usize..=6, m in 1usize..=12, v in 1usize..=3, g in 1usize..=12) {
        match Schedule::interleaved_grouped(p, m, v, g) {
            Ok(s) => {
                s.check().unwrap();
                for st in 0..p {
                    proptest::prop_assert_eq!(s.peak_in_flight(st), s.in_flight_bound(st));
                }
                let t = simulate(&s, Costs { fwd: 1, bwd: 2 }).unwrap();
                proptest::prop_assert_eq!(t.makespan, (v * m + p - 1) as u64 * 3);
            }
            Err(_) => proptest::prop_assert!(!(p <= g && g <= m && (m % g == 0 || m % g >= p))),
        }
    }
}
