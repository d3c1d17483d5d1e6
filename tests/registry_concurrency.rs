//! Eight threads hammer the process-global
//! registry with install / get / erase / unique_key. Afterwards no key is lost
//! or duplicated (the registry holds exactly what the threads installed and did
//! not erase, each under the value its installer stored), every `unique_key` is
//! distinct, and nothing deadlocks: a watchdog fails the test instead of
//! letting it hang.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use offgraph_kv::registry::{global, AnyCache};
use offgraph_kv::CacheError;

const THREADS: usize = 8;
const ITERS: usize = 2_000;
/// Keys every thread fights over: at most one install wins until it is erased.
const CONTESTED: usize = 16;
const PREFIX: &str = "regconc-";
const WATCHDOG: Duration = Duration::from_secs(60);

/// The value a thread stores: (thread, iteration), so a `get` can tell whose it is.
type Tag = (usize, usize);

fn tag_of(c: &AnyCache) -> Tag {
    match c.clone().downcast::<Tag>() {
        Ok(t) => *t,
        Err(_) => panic!("registry returned a value of another type"),
    }
}

#[derive(Default)]
struct Outcome {
    /// Keys this thread installed and still owns at the end, with their tag.
    kept: BTreeMap<String, Tag>,
    /// Every key `unique_key` returned to this thread.
    unique: Vec<String>,
    installs: usize,
    erases: usize,
    contested_wins: usize,
}

/// A small deterministic generator (no dependency): xorshift64*.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn worker(id: usize, start: Arc<Barrier>) -> Outcome {
    let reg = global();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (id as u64 + 1).wrapping_mul(0x1234_5678_9ABC_DEF1));
    let mut out = Outcome::default();
    // Keys this thread installed and not yet erased (private keys and contested wins).
    let mut live: Vec<(String, Tag)> = Vec::new();
    start.wait();
    for it in 0..ITERS {
        let tag: Tag = (id, it);
        match rng.next() % 6 {
            // Install under a fresh unique key: must succeed.
            0 | 1 => {
                let key = reg.unique_key(PREFIX);
                out.unique.push(key.clone());
                let cache: AnyCache = Arc::new(tag);
                if let Err(e) = reg.install(&key, cache) {
                    panic!("thread {id}: install of unique key {key} failed: {e}");
                }
                out.installs += 1;
                live.push((key, tag));
            }
            // Fight over a contested key: a win must be exclusive until erased.
            2 => {
                let key = format!("{PREFIX}contested-{}", rng.next() % CONTESTED as u64);
                let cache: AnyCache = Arc::new(tag);
                match reg.install(&key, cache) {
                    Ok(()) => {
                        out.installs += 1;
                        out.contested_wins += 1;
                        live.push((key, tag));
                    }
                    Err(CacheError::KeyExists(_)) => {
                        // Someone holds it; they (and only they) will erase it.
                        let ours = live.iter().find(|(k, _)| *k == key).map(|(_, t)| *t);
                        match (reg.get(&key), ours) {
                            (Ok(c), Some(t)) => assert_eq!(tag_of(&c), t, "{key} changed hands"),
                            (Err(e), Some(_)) => panic!("thread {id}: our {key} lost: {e}"),
                            (Ok(c), None) => {
                                assert_ne!(tag_of(&c).0, id, "thread {id} lost track of {key}")
                            }
                            (Err(_), None) => {} // erased by its holder since
                        }
                    }
                    Err(e) => panic!("thread {id}: install {key}: unexpected {e}"),
                }
            }
            // Read back one of ours: must be there, with our value.
            3 => {
                if !live.is_empty() {
                    let i = (rng.next() % live.len() as u64) as usize;
                    let (key, want) = &live[i];
                    match reg.get(key) {
                        Ok(c) => assert_eq!(tag_of(&c), *want, "thread {id}: {key} changed hands"),
                        Err(e) => panic!("thread {id}: {key} lost: {e}"),
                    }
                }
            }
            // Erase one of ours: must return our value; a second erase must miss.
            4 => {
                if !live.is_empty() {
                    let i = (rng.next() % live.len() as u64) as usize;
                    let (key, want) = live.swap_remove(i);
                    match reg.erase(&key) {
                        Ok(c) => {
                            assert_eq!(tag_of(&c), want, "thread {id}: erased another's {key}")
                        }
                        Err(e) => panic!("thread {id}: erase {key}: {e}"),
                    }
                    out.erases += 1;
                    if !key.contains("contested") {
                        assert!(
                            matches!(reg.erase(&key), Err(CacheError::NotFound(_))),
                            "thread {id}: {key} erased twice"
                        );
                    }
                }
            }
            // Misses and whole-map reads interleaved with the writers.
            _ => {
                let missing = format!("{PREFIX}never-{id}-{it}");
                assert!(matches!(reg.get(&missing), Err(CacheError::NotFound(_))));
                assert!(matches!(reg.erase(&missing), Err(CacheError::NotFound(_))));
                let _ = reg.keys();
                let _ = reg.len();
            }
        }
    }
    // Give up contested keys so the other threads' view of them is final;
    // keep the private ones for the final comparison.
    for (key, want) in live {
        if key.contains("contested") {
            match reg.erase(&key) {
                Ok(c) => assert_eq!(tag_of(&c), want),
                Err(e) => panic!("thread {id}: final erase {key}: {e}"),
            }
            out.erases += 1;
        } else {
            out.kept.insert(key, want);
        }
    }
    out
}

#[test]
fn eight_threads_lose_and_duplicate_nothing_and_do_not_deadlock() {
    let (tx, rx) = mpsc::channel::<Result<Outcome, String>>();
    let start = Arc::new(Barrier::new(THREADS));
    for id in 0..THREADS {
        let tx = tx.clone();
        let start = Arc::clone(&start);
        thread::Builder::new()
            .name(format!("registry-hammer-{id}"))
            .spawn(move || {
                let r =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker(id, start)))
                        .map_err(|e| {
                            e.downcast_ref::<String>()
                                .cloned()
                                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_else(|| "panic".into())
                        });
                let _ = tx.send(r);
            })
            .unwrap();
    }
    drop(tx);
    // Watchdog: a deadlocked worker never reports; fail instead of hanging.
    let deadline = std::time::Instant::now() + WATCHDOG;
    let mut outcomes = Vec::new();
    while outcomes.len() < THREADS {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(Ok(o)) => outcomes.push(o),
            Ok(Err(msg)) => panic!("a worker failed: {msg}"),
            Err(e) => panic!(
                "watchdog: only {} of {THREADS} workers finished within {WATCHDOG:?} ({e}): deadlock?",
                outcomes.len()
            ),
        }
    }

    // unique_key never handed the same key out twice.
    let mut seen = HashSet::new();
    for o in &outcomes {
        for k in &o.unique {
            assert!(seen.insert(k.clone()), "unique_key returned {k} twice");
        }
    }
    // The registry holds exactly the keys kept, each with its installer's value.
    let mut expected: BTreeMap<String, Tag> = BTreeMap::new();
    for o in &outcomes {
        for (k, t) in &o.kept {
            assert!(expected.insert(k.clone(), *t).is_none(), "{k} kept twice");
        }
    }
    let reg = global();
    let actual: BTreeSet<String> = reg
        .keys()
        .into_iter()
        .filter(|k| k.starts_with(PREFIX))
        .collect();
    let want: BTreeSet<String> = expected.keys().cloned().collect();
    assert_eq!(
        actual, want,
        "registry contents differ from what the threads kept"
    );
    for (k, t) in &expected {
        assert_eq!(tag_of(&reg.get(k).unwrap()), *t, "{k} holds another value");
    }
    let installs: usize = outcomes.iter().map(|o| o.installs).sum();
    let erases: usize = outcomes.iter().map(|o| o.erases).sum();
    assert_eq!(installs - erases, expected.len());
    let wins: usize = outcomes.iter().map(|o| o.contested_wins).sum();
    assert!(wins > 0, "no contested install ever won");
    eprintln!(
        "registry hammer: {THREADS} threads x {ITERS} ops, {installs} installs, {erases} erases, {wins} contested wins, {} keys left",
        expected.len()
    );
    // Leave the global registry as we found it.
    for k in expected.keys() {
        reg.erase(k).unwrap();
    }
}
