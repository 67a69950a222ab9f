//! A thread that runs one rank's collectives in the order they are
//! submitted, so that the caller computes while they run (ZeRO-3's
//! prefetching all-gathers and its gradient reduce-scatters). Every rank
//! submits the same sequence, so the collectives match across ranks as
//! they would on one thread.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, Sender};

use crate::error::{CommError, Result};

type Job = Box<dyn FnOnce() + Send>;

/// The submitting side of the thread; the thread ends once this is
/// dropped and the jobs already submitted have run.
pub(crate) struct CommThread {
    jobs: Sender<Job>,
}

/// The result of a submitted job, to [`Pending::wait`] for.
pub(crate) struct Pending<R>(Receiver<Result<R>>);

impl CommThread {
    /// Starts the thread. Errors when the OS refuses a thread.
    pub fn spawn(name: &str) -> Result<CommThread> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || queue.into_iter().for_each(|job| job()))
            .map_err(|e| CommError::io("Zero3", format!("starting the communication thread: {e}")))?;
        Ok(CommThread { jobs })
    }

    /// Queues `job` behind the jobs submitted before it. A job that panics
    /// yields an error instead of ending the thread.
    pub fn submit<R: Send + 'static>(&self, job: impl FnOnce() -> Result<R> + Send + 'static) -> Pending<R> {
        let (tx, rx) = mpsc::sync_channel(1);
        let run = move || {
            let result = catch_unwind(AssertUnwindSafe(job)).unwrap_or_else(|_| {
                Err(CommError::arg(
                    "Zero3",
                    "a collective panicked on the communication thread",
                ))
            });
            // The submitter may have given up waiting (it already failed).
            let _ = tx.send(result);
        };
        // A failed send drops `run` and with it `tx`: waiting then reports
        // the stopped thread.
        let _ = self.jobs.send(Box::new(run));
        Pending(rx)
    }
}

impl<R> Pending<R> {
    /// Blocks until the job has run; its result. Errors with the job's
    /// error, or when the thread stopped before running it.
    pub fn wait(self) -> Result<R> {
        self.0
            .recv()
            .unwrap_or_else(|_| Err(CommError::arg("Zero3", "the communication thread stopped")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_in_submission_order_and_panics_become_errors() {
        let t = CommThread::spawn("test-comm").unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let pending: Vec<Pending<usize>> = (0..20)
            .map(|i| {
                let log = log.clone();
                t.submit(move || {
                    log.lock().unwrap().push(i);
                    Ok(i * 2)
                })
            })
            .collect();
        let bad = t.submit::<()>(|| panic!("boom"));
        let after = t.submit(|| Ok(7));
        for (i, p) in pending.into_iter().enumerate().rev() {
            assert_eq!(p.wait().unwrap(), i * 2);
        }
        assert_eq!(*log.lock().unwrap(), (0..20).collect::<Vec<_>>());
        assert!(bad.wait().unwrap_err().to_string().contains("panicked"));
        assert_eq!(after.wait().unwrap(), 7, "the thread survives a panicking job");
    }
}
