//! A persistent pool of worker threads (attention, and the engine's matmuls): started the first time a
//! call asks for more threads than the pool holds, then reused, so a
//! multi-thread call pays a wake-up and a join, not a thread start. Both
//! sides poll briefly before sleeping on a condition variable (`SPIN`), so
//! calls in quick succession (a decode step's matmuls) pay no futex round trip.
//!
//! One call at a time owns the pool; a call that finds it busy (another
//! thread attending concurrently) runs on scoped threads instead, as before.
//!
//! **Fork.** A forked child inherits the pool's memory but none of its
//! threads, and its locks may be held by threads that exist only in the
//! parent: the child must not wait on anything of the old pool. Each pool
//! records the process that started it (its id, and the count of forks a
//! `pthread_atfork` child handler has seen); a process whose figures differ
//! starts a fresh pool on first use and never touches the old one (left
//! allocated: its locks cannot be trusted to be free, so neither can its
//! drop). Both figures, since neither alone is enough: a process id can be
//! reused by a later descendant, and a raw `clone` runs no fork handler.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

/// How long a worker polls for the next job, and a caller for its workers,
/// before sleeping on the condition variable. A decode step makes ~100 pool
/// calls a few microseconds apart; a futex round trip per call (4-6 us)
/// made two threads slower than one. Short, since the machine may be shared.
const SPIN: Duration = Duration::from_micros(50);

/// Polls `done` until it holds or [`SPIN`] has passed; whether it held.
fn spin_until(done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            if done() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= SPIN {
            return done();
        }
    }
}

/// The job of one call, its lifetime erased (see [`Pool::run`]).
#[derive(Clone, Copy)]
struct Job(&'static (dyn Fn(usize) + Sync));

#[derive(Default)]
struct Slot {
    /// Bumped for every job, so a worker runs each job once.
    epoch: u64,
    job: Option<Job>,
    /// Workers taking part in the current job (worker `i` runs part `i + 1`).
    parts: usize,
    /// Workers of the current job still running.
    pending: usize,
    panicked: bool,
}

#[derive(Default)]
struct Shared {
    slot: Mutex<Slot>,
    work: Condvar,
    done: Condvar,
    /// Copies of `slot.epoch` and `slot.pending`, written under the lock,
    /// read without it by the spinning waits (the lock decides).
    epoch: AtomicU64,
    pending: AtomicUsize,
}

/// The pool: its worker count, behind the lock that makes one call its owner.
struct Pool {
    shared: Arc<Shared>,
    owner: Mutex<usize>,
    /// The process that started this pool: its id and [`FORKS`] then.
    pid: u32,
    forks: u64,
}

/// Forks this process's line has gone through (bumped in each child by the
/// `pthread_atfork` handler): a pool started before a fork is stale after it.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// The current process's pool; null until the first multi-thread call.
/// Pools are never freed, so a pointer read from here stays valid.
static CURRENT: AtomicPtr<Pool> = AtomicPtr::new(std::ptr::null_mut());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere; the slot stays consistent
    // (every field is written under the lock in one step).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(unix)]
extern "C" fn forked_child() {
    // Async-signal-safe: one atomic add (catch_unwind, as at every C-called
    // function, costs nothing unless a panic happens, and none can here).
    let _ = std::panic::catch_unwind(|| FORKS.fetch_add(1, Ordering::SeqCst));
}

/// Registers the fork handler once per process (inherited by children).
/// A flag rather than a `Once`: a child must never wait on an
/// initialisation a vanished parent thread was in the middle of.
fn watch_forks() {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    if REGISTERED.swap(true, Ordering::SeqCst) {
        return;
    }
    #[cfg(unix)]
    // SAFETY: the handler is a plain function that only bumps an atomic. A
    // failure (ENOMEM) leaves the process-id check alone to notice a fork.
    unsafe {
        libc::pthread_atfork(None, None, Some(forked_child));
    }
}

/// This process's pool: the one it started, or a fresh one when there is none
/// yet or the current one was started before a fork (see the module docs).
fn pool() -> &'static Pool {
    let pid = std::process::id();
    loop {
        let forks = FORKS.load(Ordering::SeqCst);
        let cur = CURRENT.load(Ordering::Acquire);
        // SAFETY: a non-null pointer in CURRENT came from Box::into_raw below
        // and is never freed.
        if let Some(p) = unsafe { cur.as_ref() } {
            if p.pid == pid && p.forks == forks {
                return p;
            }
        }
        watch_forks();
        let fresh = Box::into_raw(Box::new(Pool {
            shared: Arc::new(Shared::default()),
            owner: Mutex::new(0),
            pid,
            forks: FORKS.load(Ordering::SeqCst),
        }));
        match CURRENT.compare_exchange(cur, fresh, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: just installed; never freed.
            Ok(_) => return unsafe { &*fresh },
            // Another thread installed one first: drop ours (never shared)
            // and check theirs.
            // SAFETY: `fresh` came from Box::into_raw and was not published.
            Err(_) => drop(unsafe { Box::from_raw(fresh) }),
        }
    }
}

fn worker(shared: Arc<Shared>, idx: usize, mut seen: u64) {
    loop {
        spin_until(|| shared.epoch.load(Ordering::Acquire) != seen);
        let job = {
            let mut s = lock(&shared.slot);
            while s.epoch == seen {
                s = shared.work.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            seen = s.epoch;
            if idx >= s.parts {
                continue;
            }
            s.job
        };
        let ok = match job {
            Some(Job(f)) => catch_unwind(AssertUnwindSafe(|| f(idx.saturating_add(1)))).is_ok(),
            None => true,
        };
        let mut s = lock(&shared.slot);
        s.panicked |= !ok;
        s.pending = s.pending.saturating_sub(1);
        shared.pending.store(s.pending, Ordering::Release);
        if s.pending == 0 {
            shared.done.notify_all();
        }
    }
}

/// Waits for the job's workers even when the caller's own part unwinds, so
/// the erased borrow never outlives the call.
struct Join<'a>(&'a Shared);

impl Join<'_> {
    fn wait(&self) -> bool {
        spin_until(|| self.0.pending.load(Ordering::Acquire) == 0);
        let mut s = lock(&self.0.slot);
        while s.pending > 0 {
            s = self.0.done.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.job = None;
        std::mem::take(&mut s.panicked)
    }
}

impl Drop for Join<'_> {
    fn drop(&mut self) {
        self.wait();
    }
}

/// Runs `f(0)` on the caller's thread and `f(1)`..`f(parts - 1)` on other
/// threads, returning when all are done; `Err` when a part panicked on
/// another thread (a panic of `f(0)` unwinds to the caller).
// The one failure is "a part panicked": callers map `()` to an error of their own.
#[allow(clippy::result_unit_err)]
pub fn run(parts: usize, f: &(dyn Fn(usize) + Sync)) -> Result<(), ()> {
    if parts <= 1 {
        f(0);
        return Ok(());
    }
    let p = pool();
    let mut owner = match p.owner.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => return run_scoped(parts, f),
    };
    let want = parts.saturating_sub(1);
    while *owner < want {
        let shared = Arc::clone(&p.shared);
        let (idx, seen) = (*owner, lock(&p.shared.slot).epoch);
        let spawned = std::thread::Builder::new()
            .name(format!("okv-attend-{idx}"))
            .spawn(move || worker(shared, idx, seen));
        if spawned.is_err() {
            drop(owner);
            return run_scoped(parts, f);
        }
        *owner = owner.saturating_add(1);
    }
    // SAFETY: the erased borrow is only used by workers of this job, and
    // `Join` (also on unwind) waits until every one of them has finished
    // with it and cleared it from the slot before this function returns.
    let job: &'static (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
    {
        let mut s = lock(&p.shared.slot);
        s.epoch = s.epoch.wrapping_add(1);
        s.job = Some(Job(job));
        s.parts = want;
        s.pending = want;
        s.panicked = false;
        p.shared.pending.store(want, Ordering::Release);
        p.shared.epoch.store(s.epoch, Ordering::Release);
    }
    p.shared.work.notify_all();
    let join = Join(&p.shared);
    f(0);
    let panicked = join.wait();
    drop(owner);
    if panicked {
        Err(())
    } else {
        Ok(())
    }
}

/// [`run`] on scoped threads started for this call.
fn run_scoped(parts: usize, f: &(dyn Fn(usize) + Sync)) -> Result<(), ()> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (1..parts).map(|w| s.spawn(move || f(w))).collect();
        f(0);
        let mut res = Ok(());
        for h in hs {
            if h.join().is_err() {
                res = Err(());
            }
        }
        res
    })
}
