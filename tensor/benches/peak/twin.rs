//! A reference implementation's bench script (PyTorch's) in a child
//! process that says `ready` once set up and then answers each line it is
//! sent with one line, so that the two sides' measurements can alternate.
//! Shared by the tensor benches (through `peak`) and the training-step
//! bench (included by path).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

/// How long each side's idle threads get to settle before the other side
/// measures: rayon's spin briefly after a parallel region, OpenMP's as its
/// wait policy says (PyTorch's measured idle within a quarter second).
const SETTLE: Duration = Duration::from_millis(500);

/// The child process of a reference script.
pub struct Twin {
    child: Child,
    input: Option<ChildStdin>,
    output: BufReader<ChildStdout>,
}

impl Twin {
    /// Runs `py args…` and waits for its `ready` line (importing torch
    /// takes both cores for seconds); `None`, saying why, when it does not
    /// start or says something else first.
    pub fn start(py: &str, args: &[&str]) -> Option<Twin> {
        let spawned = Command::new(py)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                println!("# reference skipped: cannot run {py}: {e}");
                return None;
            }
        };
        let mut twin = Twin {
            input: child.stdin.take(),
            output: BufReader::new(child.stdout.take().expect("piped stdout")),
            child,
        };
        let mut line = String::new();
        if twin.output.read_line(&mut line).is_err() || line.trim_end() != "ready" {
            println!("# reference skipped: {py} did not start {args:?} (its error is above)");
            return None;
        }
        Some(twin)
    }

    /// Sends `request` once both sides' idle threads have settled and
    /// returns the answer line (without its newline), settling again
    /// before returning; `None`, saying so, when the script has stopped
    /// (it is not asked again).
    pub fn ask(&mut self, request: &str) -> Option<String> {
        let input = self.input.as_mut()?;
        std::thread::sleep(SETTLE);
        let mut line = String::new();
        let asked = writeln!(input, "{request}").and_then(|()| input.flush());
        let answered = asked.is_ok() && self.output.read_line(&mut line).is_ok_and(|n| n > 0);
        std::thread::sleep(SETTLE);
        if !answered {
            println!("# reference stopped before answering {request:?} (its error is above)");
            self.input = None;
            return None;
        }
        Some(line.trim_end().to_string())
    }

    /// Ends the script's input and returns what it prints after that,
    /// once it has exited (`None` when that cannot be read).
    #[allow(
        dead_code,
        reason = "the training-step bench reads the twin's report; the tensor benches need none"
    )]
    pub fn finish(mut self) -> Option<String> {
        self.input = None;
        let mut rest = String::new();
        let read = self.output.read_to_string(&mut rest);
        let _ = self.child.wait();
        read.ok().map(|_| rest)
    }
}

impl Drop for Twin {
    fn drop(&mut self) {
        // End of input ends the script.
        self.input = None;
        let _ = self.child.wait();
    }
}
