//! The page in a real headless browser (Chromium's `--dump-dom`): it loads
//! without console messages or script errors, and the plots the browser
//! parsed have a vertex per logged point. Skips, saying why, where no
//! Chromium is installed (`.ci/run` installs `chromium-headless-shell`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::tests::{polyline_vertices, sample_log};
use super::*;

const BROWSERS: [&str; 4] = [
    "chromium-headless-shell",
    "chromium",
    "google-chrome",
    "chrome-headless-shell",
];

#[test]
fn the_page_loads_in_a_headless_browser_with_every_point_plotted() {
    let Some(browser) = find_browser() else {
        eprintln!(
            "skipped: no Chromium found (tried $TESSERA_BROWSER and {BROWSERS:?}); \
             install chromium-headless-shell to run this test"
        );
        return;
    };
    let dir = std::env::temp_dir().join(format!("tessera-report-browser-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("report.html");
    let run = Run::parse(&sample_log(4, 5)).unwrap();
    std::fs::write(&page, render(&run, "metrics.jsonl").unwrap()).unwrap();

    let (dom, log) = dump_dom(&browser, &page, &dir.join("profile"));
    std::fs::remove_dir_all(&dir).ok();

    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "console output: {console:#?}");
    assert!(
        dom.contains(r#"data-errors="0""#),
        "the page's error counter is not 0 (or the page did not load):\n{dom:.2000}"
    );
    let figures: Vec<(String, Vec<usize>)> = dom
        .split("<figure")
        .skip(1)
        .map(|fig| {
            let title = fig.split("data-plot=\"").nth(1).unwrap_or("");
            (
                title[..title.find('"').unwrap_or(0)].to_owned(),
                polyline_vertices(fig),
            )
        })
        .collect();
    // 4 epochs of 5 steps: 20 step points and 4 epoch points per series;
    // grad_norm is null on every second step, the EMA accuracy always.
    assert_eq!(
        figures,
        [
            ("Loss".to_owned(), vec![20, 4]),
            ("Accuracy (%)".to_owned(), vec![4, 4]),
            ("Learning rate".to_owned(), vec![20, 4]),
            ("Throughput (samples/s)".to_owned(), vec![20, 4]),
            ("Gradient norm".to_owned(), vec![10]),
        ]
    );
}

/// `$TESSERA_BROWSER`, else the first Chromium on `PATH`.
fn find_browser() -> Option<PathBuf> {
    if let Some(b) = std::env::var_os("TESSERA_BROWSER") {
        return Some(PathBuf::from(b));
    }
    let path = std::env::var_os("PATH")?;
    BROWSERS.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// The DOM after load, and the browser's log; the browser is killed if it
/// has not finished within a minute.
fn dump_dom(browser: &Path, page: &Path, profile: &Path) -> (String, String) {
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", browser.display()));
    let read = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            r.read_to_string(&mut s).ok();
            s
        })
    };
    let stdout = read(Box::new(child.stdout.take().unwrap()));
    let stderr = read(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            panic!("{} did not finish within 60 s", browser.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (dom, log) = (stdout.join().unwrap(), stderr.join().unwrap());
    assert!(
        status.success(),
        "{} failed ({status}):\n{log}",
        browser.display()
    );
    (dom, log)
}
