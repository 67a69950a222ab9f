use super::*;

/// A log of `epochs` epochs with `steps_per_epoch` step records each, as
/// the `train` example writes it.
pub(crate) fn sample_log(epochs: usize, steps_per_epoch: usize) -> String {
    let mut lines = vec![r#"{"kind":"config","model":"vit_tiny <32>","seed":0,"cpu":"AMD EPYC"}"#.to_owned()];
    for e in 0..epochs {
        for s in 0..steps_per_epoch {
            let step = e * steps_per_epoch + s + 1;
            lines.push(format!(
                r#"{{"kind":"step","step":{step},"epoch":{},"loss":{},"lr":{},"grad_norm":{},"samples_per_s":{}}}"#,
                step as f64 / steps_per_epoch as f64,
                2.3 / step as f64,
                1e-3 * (1.0 - step as f64 / 100.0),
                if step.is_multiple_of(2) { "null".to_owned() } else { "1.5".to_owned() },
                800.0 + step as f64
            ));
        }
        lines.push(format!(
            r#"{{"kind":"epoch","epoch":{},"train_loss":{},"train_acc":{},"test_acc":{},"ema_test_acc":null,"lr":0.001,"samples_per_s":900.0,"elapsed_s":{}}}"#,
            e + 1,
            1.0 / (e + 1) as f64,
            50.0 + e as f64,
            55.0 + e as f64,
            10.0 * (e + 1) as f64
        ));
    }
    lines.join("\n")
}

/// The vertex count of every series line (a `<polyline>` of the series'
/// stroke width; axis ticks are polylines too) in `svg`, in document order.
pub(crate) fn polyline_vertices(svg: &str) -> Vec<usize> {
    svg.split("<polyline")
        .skip(1)
        .filter(|tag| {
            let attrs = &tag[..tag.find('>').unwrap_or(tag.len())];
            attrs.contains(&format!("stroke-width=\"{}\"", plot::SERIES_STROKE_WIDTH))
        })
        .map(|tag| {
            let points = tag.split("points=\"").nth(1).unwrap_or("");
            let points = &points[..points.find('"').unwrap_or(0)];
            points.split_whitespace().count()
        })
        .collect()
}

#[test]
fn records_are_split_by_kind_and_unknown_kinds_are_counted() {
    let log = format!(
        "{}\n\n{{\"kind\":\"eval\",\"x\":1}}\n{{\"kind\":\"eval\"}}\n{{\"x\":2}}",
        sample_log(2, 3)
    );
    let run = Run::parse(&log).unwrap();
    assert_eq!(run.steps.len(), 6);
    assert_eq!(run.epochs.len(), 2);
    assert_eq!(run.config["model"], "vit_tiny <32>");
    assert_eq!(run.other_kinds["eval"], 2);
    assert_eq!(run.other_kinds["(no kind)"], 1);
}

#[test]
fn train_mnist_records_without_a_kind_are_epochs() {
    let run = Run::parse(r#"{"epoch":1,"train_loss":0.3,"test_acc":97.5}"#).unwrap();
    assert_eq!(run.epochs.len(), 1);
    assert!(run.steps.is_empty());
}

#[test]
fn a_line_that_is_not_an_object_is_named() {
    let err = Run::parse("{\"kind\":\"config\"}\n[1, 2]").unwrap_err();
    assert_eq!(
        err.to_string(),
        "metrics log line 2 is not a JSON object: found an array"
    );
    let err = Run::parse("{\"kind\":\"step\"}\n\n{\"kind\": ").unwrap_err();
    assert!(matches!(err, ReportError::Parse { line: 3, .. }), "{err}");
}

#[test]
fn a_log_without_steps_or_epochs_has_nothing_to_plot() {
    let run = Run::parse(r#"{"kind":"config","model":"x"}"#).unwrap();
    assert!(matches!(render(&run, "m.jsonl"), Err(ReportError::Empty)));
}

#[test]
fn every_series_is_one_polyline_with_a_vertex_per_point() {
    let run = Run::parse(&sample_log(3, 4)).unwrap();
    let plots = run.plots();
    let titles: Vec<&str> = plots.iter().map(|(t, _)| *t).collect();
    assert_eq!(
        titles,
        [
            "Loss",
            "Accuracy (%)",
            "Learning rate",
            "Throughput (samples/s)",
            "Gradient norm"
        ]
    );
    let counts: Vec<Vec<usize>> = plots
        .iter()
        .map(|(_, s)| s.iter().map(Series::len).collect())
        .collect();
    // The EMA series is all null and is left out; grad_norm is null on
    // every second step.
    assert_eq!(
        counts,
        [vec![12, 3], vec![3, 3], vec![12, 3], vec![12, 3], vec![6]]
    );
    for (title, series) in &plots {
        let svg = plot::draw(title, series).unwrap();
        let expected: Vec<usize> = series.iter().map(Series::len).collect();
        assert_eq!(polyline_vertices(&svg), expected, "{title}");
        let circles = svg.matches("<circle").count();
        let marked: usize = series.iter().filter(|s| s.markers).map(Series::len).sum();
        assert_eq!(circles, marked, "{title}");
    }
}

#[test]
fn the_page_is_self_contained_and_escapes_text() {
    let run = Run::parse(&sample_log(2, 2)).unwrap();
    let html = render(&run, "runs/<a>&b.jsonl").unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("runs/&lt;a&gt;&amp;b.jsonl"));
    assert!(html.contains("tessera run: vit_tiny &lt;32&gt;"));
    assert!(html.contains("<th>cpu</th><td>AMD EPYC</td>"));
    assert!(html.contains("56.00% (epoch 2)"), "best test accuracy");
    for external in ["href=", "src=", "<link", "url(", "@import"] {
        assert!(!html.contains(external), "the page refers to {external}");
    }
    assert_eq!(html.matches("<figure").count(), 5);
}

#[test]
fn single_point_series_and_flat_lines_still_draw() {
    let run = Run::parse(r#"{"epoch":1,"train_loss":0.5,"train_acc":90,"test_acc":90,"lr":0.1}"#).unwrap();
    let html = render(&run, "m.jsonl").unwrap();
    assert_eq!(polyline_vertices(&html), [1, 1, 1, 1]);
}
