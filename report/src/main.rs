//! `tessera-report metrics.jsonl [-o report.html]`: writes the HTML page of
//! a training run's metrics log (default: `report.html` beside the log).

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: tessera-report METRICS.jsonl [-o REPORT.html]";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(Some(out)) => {
            println!("wrote {}", out.display());
            ExitCode::SUCCESS
        }
        Ok(None) => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("tessera-report: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Parses the arguments and writes the page; `Ok(None)` for `--help`.
fn run(args: Vec<String>) -> Result<Option<PathBuf>, String> {
    let mut input = None;
    let mut output = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "-o" | "--output" => {
                let path = args
                    .next()
                    .ok_or_else(|| format!("{arg} needs a path; {USAGE}"))?;
                output = Some(PathBuf::from(path));
            }
            _ if arg.starts_with('-') => return Err(format!("unknown option {arg:?}; {USAGE}")),
            _ if input.is_none() => input = Some(PathBuf::from(arg)),
            _ => return Err(format!("more than one input ({arg:?}); {USAGE}")),
        }
    }
    let input = input.ok_or_else(|| format!("no metrics log given; {USAGE}"))?;
    let output = output.unwrap_or_else(|| input.with_file_name("report.html"));
    let text =
        std::fs::read_to_string(&input).map_err(|e| format!("cannot read {}: {e}", input.display()))?;
    let run = tessera_report::Run::parse(&text).map_err(|e| format!("{}: {e}", input.display()))?;
    let html = tessera_report::render(&run, &input.display().to_string())
        .map_err(|e| format!("{}: {e}", input.display()))?;
    std::fs::write(&output, html).map_err(|e| format!("cannot write {}: {e}", output.display()))?;
    Ok(Some(output))
}

#[cfg(test)]
mod tests {
    use super::run;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn writes_the_page_beside_the_log_or_where_asked() {
        let dir = std::env::temp_dir().join(format!("tessera-report-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("metrics.jsonl");
        std::fs::write(&log, "{\"epoch\":1,\"train_loss\":0.5,\"test_acc\":97}\n").unwrap();
        let beside = run(args(&[log.to_str().unwrap()])).unwrap().unwrap();
        assert_eq!(beside, dir.join("report.html"));
        assert!(std::fs::read_to_string(&beside).unwrap().contains("<svg"));
        let asked = dir.join("x.html");
        let out = run(args(&[log.to_str().unwrap(), "-o", asked.to_str().unwrap()]));
        assert_eq!(out.unwrap().unwrap(), asked);
        assert!(asked.is_file());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_arguments_and_files_are_errors_that_say_what() {
        assert_eq!(run(args(&["--help"])).unwrap(), None);
        assert!(run(args(&[])).unwrap_err().starts_with("no metrics log given"));
        assert!(run(args(&["a", "b"]))
            .unwrap_err()
            .starts_with("more than one input"));
        assert!(run(args(&["a", "-o"]))
            .unwrap_err()
            .starts_with("-o needs a path"));
        assert!(run(args(&["--bogus"])).unwrap_err().starts_with("unknown option"));
        let missing = run(args(&["/nonexistent/metrics.jsonl"])).unwrap_err();
        assert!(
            missing.starts_with("cannot read /nonexistent/metrics.jsonl"),
            "{missing}"
        );
        let dir = std::env::temp_dir().join(format!("tessera-report-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("metrics.jsonl");
        std::fs::write(&log, "{\"epoch\":1}\nnot json\n").unwrap();
        let err = run(args(&[log.to_str().unwrap()])).unwrap_err();
        assert!(err.contains("line 2 is not a JSON object"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
