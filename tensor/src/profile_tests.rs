use super::*;
use crate::{DType, Tensor};

fn small_step() -> crate::Result<Tensor> {
    let x = Tensor::randn(&[8, 16], DType::F32)?;
    let w = Tensor::randn(&[16, 32], DType::F32)?;
    let h = x.matmul(&w)?.gelu(crate::GeluApprox::None)?;
    h.add(&h)?.softmax(-1)?.sum(&[], false)
}

#[test]
fn the_table_lists_the_ops_of_a_step_with_shapes_time_and_bytes() {
    let (out, prof) = profile(small_step);
    out.unwrap();
    let rows = prof.summary();
    let find = |name: &str| rows.iter().find(|r| r.name == name);
    let mm = find("matmul").expect("matmul recorded");
    assert_eq!(mm.shapes, vec![vec![8, 16], vec![16, 32]]);
    assert_eq!((mm.calls, mm.phase), (1, Phase::Forward));
    // The [8, 32] f32 result.
    assert!(mm.bytes >= 8 * 32 * 4, "{mm:?}");
    for name in ["gelu", "add", "softmax", "sum"] {
        assert!(find(name).is_some(), "{name} missing from {rows:?}");
    }
    let total: u64 = rows.iter().map(|r| r.self_ns).sum();
    assert!(total > 0 && total <= prof.wall_ns, "{total} of {}", prof.wall_ns);
    assert!(
        rows.windows(2).all(|w| w[0].self_ns >= w[1].self_ns),
        "sorted by self time"
    );
    let table = prof.table(50);
    assert!(
        table.contains("matmul") && table.contains("[8, 16] [16, 32]"),
        "{table}"
    );
    // Nothing is recorded outside a profile.
    let (_, empty) = profile(|| ());
    assert!(empty.events.is_empty());
}

#[test]
fn nested_spans_count_their_time_once() {
    let ((), prof) = profile(|| {
        let _outer = op_span("outer", []);
        let _ = small_step().unwrap();
    });
    let outer = prof
        .events
        .iter()
        .find(|e| e.name == "outer")
        .expect("outer span");
    let inner: u64 = prof
        .events
        .iter()
        .filter(|e| e.depth == 1)
        .map(|e| e.dur_ns)
        .sum();
    assert_eq!(outer.depth, 0);
    assert_eq!(outer.self_ns, outer.dur_ns - inner);
    assert!(prof.events.iter().all(|e| e.depth <= 1));
}

#[test]
fn the_chrome_trace_parses_with_the_trace_event_fields() {
    let (_, prof) = profile(small_step);
    let json: serde_json::Value = serde_json::from_str(&prof.chrome_trace()).expect("valid JSON");
    let events = json["traceEvents"].as_array().expect("traceEvents array");
    assert_eq!(events.len(), prof.events.len());
    assert!(!events.is_empty());
    for e in events {
        assert_eq!(e["ph"], "X");
        assert!(e["name"].is_string() && e["cat"].is_string());
        assert!(e["ts"].is_number() && e["dur"].is_number());
        assert!(e["pid"].is_number() && e["tid"].is_number());
        assert!(e["args"]["bytes"].is_number() && e["args"]["shapes"].is_string());
    }
    assert!(events
        .iter()
        .any(|e| e["name"] == "matmul" && e["args"]["shapes"] == "[8, 16] [16, 32]"));
    let dir = std::env::temp_dir().join(format!("tessera_trace_{}.json", std::process::id()));
    prof.write_chrome_trace(&dir).unwrap();
    assert_eq!(std::fs::read_to_string(&dir).unwrap(), prof.chrome_trace());
    std::fs::remove_file(&dir).unwrap();
    let err = prof
        .write_chrome_trace("/nonexistent-dir/trace.json")
        .unwrap_err();
    assert!(err.to_string().contains("nonexistent-dir"), "{err}");
}
