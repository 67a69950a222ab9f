//! A training run's `metrics.jsonl`, as the `train` and `train_mnist`
//! examples write it, turned into one self-contained HTML page: the run's
//! configuration and hardware, and SVG plots of loss, accuracy, learning
//! rate, throughput and gradient norm, drawn with `plotters`. The page loads
//! nothing from the network and runs no script beyond a few lines that
//! report any error into the page itself.
//!
//! ```
//! let log = r#"{"kind":"config","model":"vit","seed":0}
//! {"kind":"step","step":10,"epoch":0.5,"loss":2.1,"lr":0.001,"samples_per_s":900.0}
//! {"kind":"epoch","epoch":1,"train_loss":1.9,"train_acc":40.0,"test_acc":45.0}"#;
//! let run = tessera_report::Run::parse(log).unwrap();
//! let html = tessera_report::render(&run, "metrics.jsonl").unwrap();
//! assert!(html.contains("<svg"));
//! ```

mod plot;

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

pub use plot::Series;

/// What went wrong reading a metrics log or drawing its page.
#[derive(Debug)]
pub enum ReportError {
    /// Line `line` (1-based) is not a JSON object.
    Parse {
        /// The 1-based line number.
        line: usize,
        /// What the JSON parser said.
        message: String,
    },
    /// The log holds no step or epoch record, so there is nothing to plot.
    Empty,
    /// `plotters` failed to draw the plot named.
    Draw {
        /// The plot's title.
        plot: String,
        /// What `plotters` said.
        message: String,
    },
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Parse { line, message } => {
                write!(f, "metrics log line {line} is not a JSON object: {message}")
            }
            Self::Empty => write!(f, "the metrics log has no step or epoch record to plot"),
            Self::Draw { plot, message } => write!(f, "cannot draw the {plot:?} plot: {message}"),
        }
    }
}

impl std::error::Error for ReportError {}

/// One run's records, split by kind.
///
/// A record's kind is its `"kind"` field; the `train_mnist` example's
/// records have none and count as epochs when they carry `"epoch"`.
#[derive(Debug, Default, Clone)]
pub struct Run {
    /// The `config` record (the last one, if a resumed run wrote several).
    pub config: Map<String, Value>,
    /// `step` records in log order.
    pub steps: Vec<Map<String, Value>>,
    /// `epoch` records in log order.
    pub epochs: Vec<Map<String, Value>>,
    /// How many records of each other kind the log held; the page lists
    /// them so that nothing it does not plot disappears silently.
    pub other_kinds: BTreeMap<String, usize>,
}

impl Run {
    /// Reads a JSON-lines log; blank lines are skipped.
    ///
    /// Returns [`ReportError::Parse`] naming the first line that is not a
    /// JSON object.
    pub fn parse(jsonl: &str) -> Result<Run, ReportError> {
        let mut run = Run::default();
        for (i, line) in jsonl.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let record = match serde_json::from_str::<Value>(line) {
                Ok(Value::Object(m)) => m,
                Ok(other) => {
                    return Err(ReportError::Parse {
                        line: i + 1,
                        message: format!("found {}", kind_of(&other)),
                    })
                }
                Err(e) => {
                    return Err(ReportError::Parse {
                        line: i + 1,
                        message: e.to_string(),
                    })
                }
            };
            let kind = match record.get("kind").and_then(Value::as_str) {
                Some(k) => k.to_owned(),
                None if record.contains_key("epoch") => "epoch".to_owned(),
                None => "(no kind)".to_owned(),
            };
            match kind.as_str() {
                "config" => run.config = record,
                "step" => run.steps.push(record),
                "epoch" => run.epochs.push(record),
                _ => *run.other_kinds.entry(kind).or_default() += 1,
            }
        }
        Ok(run)
    }

    /// The plots the page shows, each with its series; series without a
    /// single finite point are left out, and so are plots left empty.
    pub fn plots(&self) -> Vec<(&'static str, Vec<Series>)> {
        let steps = |key| Series::collect(format!("{key} (step)"), &self.steps, "epoch", key);
        let epochs = |key: &str, label: &str| {
            Series::collect(label.to_owned(), &self.epochs, "epoch", key).with_markers()
        };
        let plots = vec![
            (
                "Loss",
                vec![steps("loss"), epochs("train_loss", "train loss (epoch)")],
            ),
            (
                "Accuracy (%)",
                vec![
                    epochs("train_acc", "train"),
                    epochs("test_acc", "test"),
                    epochs("ema_test_acc", "test (EMA)"),
                ],
            ),
            ("Learning rate", vec![steps("lr"), epochs("lr", "lr (epoch end)")]),
            (
                "Throughput (samples/s)",
                vec![
                    steps("samples_per_s"),
                    epochs("samples_per_s", "samples/s (epoch)"),
                ],
            ),
            ("Gradient norm", vec![steps("grad_norm")]),
        ];
        plots
            .into_iter()
            .map(|(title, series)| {
                let kept: Vec<Series> = series.into_iter().filter(|s| !s.is_empty()).collect();
                (title, kept)
            })
            .filter(|(_, series)| !series.is_empty())
            .collect()
    }
}

/// Renders `run` as one HTML page; `source` names the log in the title.
///
/// Returns [`ReportError::Empty`] when the log has no step or epoch record,
/// or [`ReportError::Draw`] if a plot cannot be drawn.
pub fn render(run: &Run, source: &str) -> Result<String, ReportError> {
    if run.steps.is_empty() && run.epochs.is_empty() {
        return Err(ReportError::Empty);
    }
    let mut html = String::new();
    let title = match run.config.get("model").and_then(Value::as_str) {
        Some(model) => format!("tessera run: {model}"),
        None => "tessera run".to_owned(),
    };
    html.push_str(&format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{}</title><style>{STYLE}</style></head>\n<body data-errors=\"0\">\
         <script>window.addEventListener('error', function () {{\
         var b = document.body; b.dataset.errors = String(Number(b.dataset.errors) + 1); }});\
         </script>\n<h1>{}</h1>\n<p class=\"source\">from {}</p>\n",
        escape(&title),
        escape(&title),
        escape(source)
    ));
    html.push_str(&summary(run));
    html.push_str("<div class=\"plots\">\n");
    for (title, series) in run.plots() {
        let svg = plot::draw(title, &series).map_err(|message| ReportError::Draw {
            plot: title.to_owned(),
            message,
        })?;
        let points: Vec<String> = series.iter().map(|s| s.len().to_string()).collect();
        html.push_str(&format!(
            "<figure data-plot=\"{}\" data-series-points=\"{}\">{svg}</figure>\n",
            escape(title),
            points.join(",")
        ));
    }
    html.push_str("</div>\n");
    html.push_str(&config_table(&run.config));
    if !run.other_kinds.is_empty() {
        html.push_str("<h2>Records not plotted</h2>\n<ul>\n");
        for (kind, n) in &run.other_kinds {
            html.push_str(&format!("<li>{n} × {}</li>\n", escape(kind)));
        }
        html.push_str("</ul>\n");
    }
    html.push_str("</body></html>\n");
    Ok(html)
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em;color:#222}\
h1{margin-bottom:0}.source{color:#666;margin-top:.2em}\
.plots{display:flex;flex-wrap:wrap;gap:1em}figure{margin:0}\
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}";

/// The headline figures: best test accuracy, final losses, time.
fn summary(run: &Run) -> String {
    let mut rows = Vec::new();
    let best = run
        .epochs
        .iter()
        .filter_map(|e| Some((e.get("test_acc")?.as_f64()?, e.get("epoch")?.as_f64()?)))
        .fold(None, |best: Option<(f64, f64)>, (acc, ep)| match best {
            Some((b, _)) if b >= acc => best,
            _ => Some((acc, ep)),
        });
    if let Some((acc, epoch)) = best {
        rows.push(("best test accuracy", format!("{acc:.2}% (epoch {epoch})")));
    }
    if let Some(last) = run.epochs.last() {
        for (key, label) in [("train_loss", "final train loss"), ("elapsed_s", "wall time (s)")] {
            if let Some(v) = last.get(key).and_then(Value::as_f64) {
                rows.push((label, format!("{v:.4}")));
            }
        }
    }
    rows.push(("epochs logged", run.epochs.len().to_string()));
    rows.push(("step records", run.steps.len().to_string()));
    table("Summary", rows.iter().map(|(k, v)| (*k, v.as_str())))
}

/// The configuration record, key by key (hardware fields included).
fn config_table(config: &Map<String, Value>) -> String {
    if config.is_empty() {
        return "<h2>Configuration</h2>\n<p>The log has no config record.</p>\n".to_owned();
    }
    let rows: Vec<(&str, String)> = config
        .iter()
        .filter(|(k, _)| k.as_str() != "kind")
        .map(|(k, v)| match v {
            Value::String(s) => (k.as_str(), s.clone()),
            other => (k.as_str(), other.to_string()),
        })
        .collect();
    table(
        "Configuration and hardware",
        rows.iter().map(|(k, v)| (*k, v.as_str())),
    )
}

/// A titled two-column table of `(name, value)` rows, escaped.
fn table<'a>(title: &str, rows: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut html = format!("<h2>{}</h2>\n<table>\n", escape(title));
    for (k, v) in rows {
        html.push_str(&format!(
            "<tr><th>{}</th><td>{}</td></tr>\n",
            escape(k),
            escape(v)
        ));
    }
    html.push_str("</table>\n");
    html
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Escapes text for HTML element content and attribute values.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod browser_tests;
#[cfg(test)]
mod tests;
