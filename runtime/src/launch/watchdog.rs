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
    what: String,
    start: M,
    end: M,
    /// When the watchdog first saw `start` complete: the collective runs from then on (before,
    /// it waits for the compute stream, which may be far behind the host).
    started: Option<Instant>,
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
    /// Records a collective `what` just issued, whose start and end on its stream `start` and
    /// `end` mark; retires the ones already complete (so the ledger stays short without a
    /// watchdog).
    pub fn push(&self, what: impl Into<String>, start: M, end: M) {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        retire(&mut q);
        q.push_back(Issued { what: what.into(), start, end, started: None });
    }
    /// Collectives not yet seen complete.
    pub fn len(&self) -> usize {
        self.q.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Retires completed collectives; the oldest one still running `timeout` after it was
    /// first seen started (at a check up to `now`) is an error naming it and how long it ran.
    pub fn check(&self, now: Instant, timeout: Duration) -> Result<(), String> {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let queued = q.len().saturating_sub(1);
            let Some(first) = q.front_mut() else { break };
            if first.end.done()? {
                q.pop_front();
                continue;
            }
            if first.started.is_none() && first.start.done()? {
                first.started = Some(now);
            }
            let ran = first.started.map(|t| now.saturating_duration_since(t)).unwrap_or_default();
            if ran > timeout {
                return Err(format!(
                    "{} has not completed {:.1} s after it started (timeout {:.1} s; {} collective(s) queued behind it): a peer rank died or hangs",
                    first.what,
                    ran.as_secs_f64(),
                    timeout.as_secs_f64(),
                    queued
                ));
            }
            break;
        }
        Ok(())
    }
    /// Waits up to `limit` for every collective to complete (true), polling.
    pub fn drain(&self, limit: Duration) -> bool {
        let t = Instant::now();
        loop {
            {
                let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
                retire(&mut q);
                if q.is_empty() {
                    return true;
                }
            }
            if t.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn retire<M: Mark>(q: &mut VecDeque<Issued<M>>) {
    while q.front().is_some_and(|f| f.end.done().unwrap_or(false)) {
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
        let s = |n| t0 + Duration::from_secs(n);
        let ((a0, sa0), (a1, sa1)) = (fake(), fake());
        let ((b0, sb0), (b1, _sb1)) = (fake(), fake());
        l.push("all-gather of 1024 elements", a0, a1);
        l.push("reduce-scatter of 1024 elements", b0, b1);
        let to = Duration::from_secs(10);
        // not started yet (its stream waits for compute): never judged, however long
        assert_eq!(l.check(s(100), to), Ok(()));
        sa0.store(1, Ordering::SeqCst);
        assert_eq!(l.check(s(101), to), Ok(()));
        assert_eq!(l.check(s(111), to), Ok(()));
        let e = l.check(s(112), to).unwrap_err();
        assert!(e.starts_with("all-gather of 1024 elements has not completed 11.0 s after it started (timeout 10.0 s; 1 collective(s) queued behind it)"), "{e}");
        // the first completes: the second is judged from when it is seen started
        sa1.store(1, Ordering::SeqCst);
        sb0.store(1, Ordering::SeqCst);
        assert_eq!(l.check(s(112), to), Ok(()));
        assert_eq!(l.len(), 1);
        assert_eq!(l.check(s(122), to), Ok(()));
        let e = l.check(s(123), to).unwrap_err();
        assert!(e.starts_with("reduce-scatter of 1024 elements has not completed 11.0 s after it started"), "{e}");
        assert!(!l.drain(Duration::from_millis(20)), "one still running");
    }

    #[test]
    fn completed_collectives_are_retired_and_errors_reported() {
        let l = Ledger::default();
        for _ in 0..100 {
            let ((a, sa), (b, sb)) = (fake(), fake());
            sa.store(1, Ordering::SeqCst);
            sb.store(1, Ordering::SeqCst);
            l.push("all-reduce", a, b);
        }
        // retired as new ones come, without a watchdog
        assert_eq!(l.len(), 1);
        assert_eq!(l.check(Instant::now(), Duration::ZERO), Ok(()));
        assert!(l.is_empty() && l.drain(Duration::ZERO));
        let ((a, _sa), (b, sb)) = (fake(), fake());
        l.push("all-gather", a, b);
        sb.store(2, Ordering::SeqCst);
        assert_eq!(l.check(Instant::now(), Duration::from_secs(600)), Err("device lost".to_string()));
    }

    #[test]
    fn the_watchdog_reports_the_first_failure_once_and_stops_when_dropped() {
        let l = Arc::new(Ledger::default());
        let ((a, sa), (b, _sb)) = (fake(), fake());
        sa.store(1, Ordering::SeqCst);
        l.push("all-gather", a, b);
        let (tx, rx) = std::sync::mpsc::channel();
        let l2 = l.clone();
        let wd = Watchdog::start(Duration::from_millis(5), move || l2.check(Instant::now(), Duration::from_millis(50)), move |e| tx.send(e).unwrap_or(()));
        let e = rx.recv_timeout(Duration::from_secs(10)).expect("the watchdog fired");
        assert!(e.starts_with("all-gather has not completed"), "{e}");
        drop(wd);
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err(), "reported once");
        // a healthy ledger: no report, and dropping the watchdog ends its thread promptly
        let quiet = Watchdog::start(Duration::from_secs(3600), || Ok(()), |e| panic!("{e}"));
        let t = Instant::now();
        drop(quiet);
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
