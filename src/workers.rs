//! A persistent pool of worker threads (attention, and the engine's matmuls): started the first time a
//! call asks for more threads than the pool holds, then reused, so a
//! multi-thread call pays a wake-up and a join (a condition variable each),
//! not a thread start.
//!
//! One call at a time owns the pool; a call that finds it busy (another
//! thread attending concurrently) runs on scoped threads instead, as before.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, TryLockError};

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
}

/// The pool: its worker count, behind the lock that makes one call its owner.
struct Pool {
    shared: Arc<Shared>,
    owner: Mutex<usize>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere; the slot stays consistent
    // (every field is written under the lock in one step).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        shared: Arc::new(Shared::default()),
        owner: Mutex::new(0),
    })
}

fn worker(shared: Arc<Shared>, idx: usize, mut seen: u64) {
    loop {
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
// The one failure carries nothing to name: each caller maps it to its own error.
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
