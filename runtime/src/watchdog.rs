//! A watchdog for collectives that never finish. On a GPU a rank whose peer died or hangs
//! waits forever inside an NCCL kernel: no host call returns an error. As PyTorch's NCCL
//! watchdog (`TORCH_NCCL_ASYNC_ERROR_HANDLING`), a thread looks at every collective in flight
//! ([`Ledger`]): one that has not completed within the timeout, or an asynchronous NCCL error,
//! makes it abort the communicators and end the process with a message naming the
//! collective, so that the launcher stops the other ranks and the last checkpoint stands.
//!
//! The bookkeeping is generic over what marks a collective's end ([`Mark`]: a CUDA event for
//! NCCL), so it is tested without a GPU.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The end of a collective's work: whether it has completed (an error when that cannot be
/// told, e.g. the device failed).
pub trait Mark: Send {
    fn done(&self) -> Result<bool, String>;
}

impl<M: Mark + Sync> Mark for Arc<M> {
    fn done(&self) -> Result<bool, String> {
        (**self).done()
    }
}

struct Issued<M> {
    at: Instant,
    what: String,
    mark: M,
}

/// The collectives issued on one stream and not yet seen complete, oldest first (a stream
/// runs its work in order, so the oldest is the one to watch).
pub struct Ledger<M> {
    q: Mutex<VecDeque<Issued<M>>>,
}

impl<M: Mark> Default for Ledger<M> {
    fn default() -> Self {
        Ledger { q: Mutex::new(VecDeque::new()) }
    }
}

impl<M: Mark> Ledger<M> {
    /// Records a collective `what`, issued now, whose end `mark` marks; retires the ones
    /// already complete (so the ledger stays short without a watchdog).
    pub fn push(&self, what: impl Into<String>, mark: M) {
        self.push_at(Instant::now(), what, mark)
    }
    fn push_at(&self, at: Instant, what: impl Into<String>, mark: M) {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        retire(&mut q);
        q.push_back(Issued { at, what: what.into(), mark });
    }
    /// Collectives not yet seen complete.
    pub fn len(&self) -> usize {
        self.q.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Retires completed collectives; the oldest still running after `timeout` (at `now`) is
    /// an error naming it and how long it has run.
    pub fn check(&self, now: Instant, timeout: Duration) -> Result<(), String> {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(first) = q.front() {
            if first.mark.done()? {
                q.pop_front();
                continue;
            }
            let ran = now.saturating_duration_since(first.at);
            if ran > timeout {
                return Err(format!(
                    "{} has not completed after {:.1} s (timeout {:.1} s; {} collective(s) queued behind it): a peer rank died or hangs",
                    first.what,
                    ran.as_secs_f64(),
                    timeout.as_secs_f64(),
                    q.len() - 1
                ));
            }
            break;
        }
        Ok(())
    }
}

fn retire<M: Mark>(q: &mut VecDeque<Issued<M>>) {
    while q.front().is_some_and(|f| f.mark.done().unwrap_or(false)) {
        q.pop_front();
    }
}

/// A thread that runs `check` every `period` until dropped; the first error goes to
/// `on_fail` (abort and exit, for NCCL) and the thread ends.
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub fn start(period: Duration, mut check: impl FnMut() -> Result<(), String> + Send + 'static, on_fail: impl FnOnce(String) + Send + 'static) -> Watchdog {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("fsdp-watchdog".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    if let Err(e) = check() {
                        on_fail(e);
                        return;
                    }
                    std::thread::park_timeout(period);
                }
            })
            .ok();
        Watchdog { stop, thread }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU8;

    /// 0 running, 1 done, 2 broken
    struct Fake(Arc<AtomicU8>);
    impl Mark for Fake {
        fn done(&self) -> Result<bool, String> {
            match self.0.load(Ordering::SeqCst) {
                0 => Ok(false),
                1 => Ok(true),
                _ => Err("device lost".into()),
            }
        }
    }

    fn fake() -> (Fake, Arc<AtomicU8>) {
        let s = Arc::new(AtomicU8::new(0));
        (Fake(s.clone()), s)
    }

    #[test]
    fn a_collective_past_its_timeout_is_named() {
        let l = Ledger::default();
        let t0 = Instant::now();
        let (a, sa) = fake();
        let (b, _sb) = fake();
        l.push_at(t0, "all-gather of u3 (rank 1 of 4)", a);
        l.push_at(t0 + Duration::from_secs(1), "reduce-scatter of u3", b);
        let to = Duration::from_secs(10);
        assert_eq!(l.check(t0 + Duration::from_secs(5), to), Ok(()));
        let e = l.check(t0 + Duration::from_secs(11), to).unwrap_err();
        assert!(e.starts_with("all-gather of u3 (rank 1 of 4) has not completed after 11.0 s (timeout 10.0 s; 1 collective(s) queued behind it)"), "{e}");
        // the first completes: the second is judged from its own start
        sa.store(1, Ordering::SeqCst);
        assert_eq!(l.check(t0 + Duration::from_secs(11), to), Ok(()));
        assert_eq!(l.len(), 1);
        let e = l.check(t0 + Duration::from_secs(12), to).unwrap_err();
        assert!(e.starts_with("reduce-scatter of u3 has not completed after 11.0 s"), "{e}");
    }

    #[test]
    fn completed_collectives_are_retired_and_errors_reported() {
        let l = Ledger::default();
        for _ in 0..100 {
            let (m, s) = fake();
            s.store(1, Ordering::SeqCst);
            l.push("all-reduce", m);
        }
        // retired as new ones come, without a watchdog
        assert_eq!(l.len(), 1);
        assert_eq!(l.check(Instant::now(), Duration::ZERO), Ok(()));
        assert!(l.is_empty());
        let (m, s) = fake();
        l.push("all-gather", m);
        s.store(2, Ordering::SeqCst);
        assert_eq!(l.check(Instant::now(), Duration::from_secs(600)), Err("device lost".to_string()));
    }

    #[test]
    fn the_watchdog_reports_the_first_failure_once_and_stops_when_dropped() {
        let l = Arc::new(Ledger::default());
        let (m, _s) = fake();
        l.push("all-gather", m);
        let (tx, rx) = std::sync::mpsc::channel();
        let l2 = l.clone();
        let wd = Watchdog::start(Duration::from_millis(5), move || l2.check(Instant::now(), Duration::from_millis(50)), move |e| tx.send(e).unwrap_or(()));
        let e = rx.recv_timeout(Duration::from_secs(10)).expect("the watchdog fired");
        assert!(e.starts_with("all-gather has not completed after"), "{e}");
        drop(wd);
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err(), "reported once");
        // a healthy ledger: no report, and dropping the watchdog ends its thread promptly
        let quiet = Watchdog::start(Duration::from_secs(3600), || Ok(()), |e| panic!("{e}"));
        let t = Instant::now();
        drop(quiet);
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
