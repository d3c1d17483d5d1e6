//! The worker pool survives `fork`: after a 2-thread attend started the
//! pool's workers, a forked child (which holds none of those threads) runs a
//! 2-thread attend that equals the 1-thread result, and so does a grandchild;
//! the parent's pool keeps working. The parent waits with a deadline, so a
//! regression (a child waiting on workers that do not exist) fails instead of
//! hanging.
//!
//! One test in this file: the test process must not run other tests' threads
//! while it forks.

#![cfg(unix)]

mod common;

use std::time::{Duration, Instant};

use common::Rng;
use offgraph_kv::{attend, AttendOptions, CacheConfig, KvSequenceCache, LayerConfig, LayerPolicy};

const KV_HEADS: usize = 2;
const Q_HEADS: usize = 4;
const DIM: usize = 64;
const T: usize = 64;

/// Exit codes of a child: the 2-thread result equals the 1-thread one / differs / failed.
const SAME: i32 = 0;
const DIFFERENT: i32 = 3;
const FAILED: i32 = 4;

struct Case {
    cache: KvSequenceCache,
    q: Vec<f32>,
}

fn case() -> Case {
    let mut c = CacheConfig::new(
        256,
        1,
        vec![LayerConfig::new(LayerPolicy::Flat, KV_HEADS, DIM)],
    );
    c.max_step = T;
    let mut cache = KvSequenceCache::new(c).unwrap();
    let mut rng = Rng::new(11);
    let kv = |rng: &mut Rng| -> Vec<f32> { (0..KV_HEADS * T * DIM).map(|_| rng.f32()).collect() };
    let (k, v) = (kv(&mut rng), kv(&mut rng));
    let q = (0..Q_HEADS * T * DIM).map(|_| rng.f32()).collect();
    cache.begin_step(T).unwrap();
    cache.update(0, &k, &v).unwrap();
    Case { cache, q }
}

fn attend_with(case: &Case, threads: usize) -> Option<Vec<f32>> {
    let spec = case.cache.spec(0).ok()?;
    let opts = AttendOptions {
        threads: Some(threads),
        ..AttendOptions::default()
    };
    attend(&case.q, [Q_HEADS, T, DIM], &spec, &opts).ok()
}

/// What a forked process runs: a 2-thread attend compared with `want`, then
/// (when `depth > 0`) the same in a child of its own. Never returns.
fn child(case: &Case, want: &[f32], depth: u32) -> ! {
    let code = match attend_with(case, 2) {
        Some(got) if got == want => {
            if depth == 0 {
                SAME
            } else {
                match fork_and_wait(case, want, depth - 1, Duration::from_secs(20)) {
                    Ok(code) => code,
                    Err(_) => FAILED,
                }
            }
        }
        Some(_) => DIFFERENT,
        None => FAILED,
    };
    // SAFETY: _exit ends the forked process without running the parent's
    // atexit handlers or the test harness's destructors.
    unsafe { libc::_exit(code) }
}

/// Forks a child running [`child`], waits at most `limit` for it and returns
/// its exit code; `Err` (the child killed) when it did not finish in time.
fn fork_and_wait(case: &Case, want: &[f32], depth: u32, limit: Duration) -> Result<i32, String> {
    // SAFETY: the child only attends (allocating, which glibc makes fork-safe),
    // forks and calls _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err("fork failed".into());
    }
    if pid == 0 {
        child(case, want, depth);
    }
    let deadline = Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: pid is our child; status is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return if libc::WIFEXITED(status) {
                Ok(libc::WEXITSTATUS(status))
            } else {
                Err(format!("child ended by a signal (status {status})"))
            };
        }
        if r < 0 {
            return Err("waitpid failed".into());
        }
        if Instant::now() > deadline {
            // SAFETY: pid is our child, still running.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return Err(format!(
                "the forked child's 2-thread attend did not finish within {limit:?} (killed)"
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_forked_child_attends_on_threads_of_its_own() {
    let case = case();
    let one = attend_with(&case, 1).unwrap();
    // Starts the pool's worker in this process.
    assert_eq!(attend_with(&case, 2).unwrap(), one);
    // depth 1: the child attends, then forks a grandchild that attends too.
    let code = fork_and_wait(&case, &one, 1, Duration::from_secs(30));
    assert_eq!(
        code,
        Ok(SAME),
        "{SAME}: equal, {DIFFERENT}: different, {FAILED}: failed"
    );
    // The parent's own pool still serves it.
    assert_eq!(attend_with(&case, 2).unwrap(), one);
}
