//! Registry life cycle, builders keyed by (backend_id, kind), sessions, threads.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use offgraph_kv::registry::{global, AnyCache, CacheSession, Registry};
use offgraph_kv::{CacheConfig, CacheError, LayerConfig, LayerPolicy, SequenceCache};

fn cfg() -> CacheConfig {
    CacheConfig::new(32, 2, vec![LayerConfig::new(LayerPolicy::Flat, 1, 8)])
}

#[test]
fn install_get_erase_life_cycle() {
    let reg: Registry<Arc<Mutex<SequenceCache>>> = Registry::new();
    let cache = Arc::new(Mutex::new(SequenceCache::new(cfg()).unwrap()));
    reg.install("a", cache.clone()).unwrap();
    assert!(Arc::ptr_eq(&reg.get("a").unwrap(), &cache));
    // A taken key is refused and the original stays.
    let other = Arc::new(Mutex::new(SequenceCache::new(cfg()).unwrap()));
    assert!(
        matches!(reg.install("a", other), Err(CacheError::KeyExists(m)) if m.contains("\"a\""))
    );
    assert!(Arc::ptr_eq(&reg.get("a").unwrap(), &cache));
    reg.erase("a").unwrap();
    assert!(matches!(reg.get("a"), Err(CacheError::NotFound(_))));
    assert!(matches!(reg.erase("a"), Err(CacheError::NotFound(_))));
    assert!(matches!(
        reg.install("", cache),
        Err(CacheError::InvalidArgument(_))
    ));
    assert!(reg.is_empty());
}

#[test]
fn builders_are_keyed_by_the_pair_and_validate_first() {
    let reg: Registry<AnyCache> = Registry::new();
    reg.register_builder(
        "cpu",
        "sequence",
        Arc::new(|c: &CacheConfig| {
            let cache: AnyCache = Arc::new(Mutex::new(SequenceCache::new(c.clone())?));
            Ok(cache)
        }),
    );
    let built = reg.build("cpu", "sequence", &cfg()).unwrap();
    assert!(built.downcast::<Mutex<SequenceCache>>().is_ok());
    // The pair, not a concatenation: ("cpus", "equence") is another key.
    assert!(matches!(
        reg.build("cpus", "equence", &cfg()),
        Err(CacheError::NotFound(_))
    ));
    assert!(
        matches!(reg.build("cpu", "cell", &cfg()), Err(CacheError::NotFound(m)) if m.contains("cell"))
    );
    // The config is validated before any builder runs (even a missing one).
    let mut bad = cfg();
    bad.capacity = 0;
    assert!(matches!(
        reg.build("nope", "nope", &bad),
        Err(CacheError::InvalidConfig(_))
    ));
}

#[test]
fn session_installs_and_erases_on_drop() {
    let reg: Registry<u32> = Registry::new();
    let key;
    {
        let s = CacheSession::new(&reg, 7, None).unwrap();
        key = s.key().to_string();
        assert_eq!(reg.get(&key).unwrap(), 7);
        assert_eq!(*s.cache(), 7);
        // A second session on the same key is refused.
        assert!(CacheSession::new(&reg, 8, Some(&key)).is_err());
    }
    assert!(reg.get(&key).is_err());
}

#[test]
fn a_dropped_session_never_erases_a_cache_someone_else_installed_under_its_key() {
    // Before the fix, Drop erased whatever was under the key.
    let reg: Registry<u32> = Registry::new();
    let s = CacheSession::new(&reg, 7, Some("shared")).unwrap();
    reg.erase("shared").unwrap();
    reg.install("shared", 9).unwrap();
    drop(s);
    assert_eq!(reg.get("shared").unwrap(), 9);
    // The serial names one installation: the same value installed again is not it.
    let serial = reg.install_serial("other", 1).unwrap();
    reg.erase("other").unwrap();
    reg.install("other", 1).unwrap();
    assert!(!reg.erase_installed("other", serial));
    assert_eq!(reg.get("other").unwrap(), 1);
}

#[test]
fn two_threads_each_take_a_thousand_unique_keys() {
    let keys: Vec<Vec<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    (0..1000)
                        .map(|_| {
                            let k = global().unique_key("t-");
                            let cache: AnyCache = Arc::new(0u8);
                            global().install(&k, cache).unwrap();
                            k
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let all: HashSet<&String> = keys.iter().flatten().collect();
    assert_eq!(all.len(), 2000);
    for k in all {
        global().erase(k).unwrap();
    }
}

#[test]
fn erase_if_removes_only_the_cache_it_accepts() {
    let reg: Registry<Arc<Mutex<SequenceCache>>> = Registry::new();
    let mine = Arc::new(Mutex::new(SequenceCache::new(cfg()).unwrap()));
    let theirs = Arc::new(Mutex::new(SequenceCache::new(cfg()).unwrap()));
    reg.install("k", theirs.clone()).unwrap();
    assert!(!reg.erase_if("k", |c| Arc::ptr_eq(c, &mine)));
    assert!(Arc::ptr_eq(&reg.get("k").unwrap(), &theirs));
    assert!(!reg.erase_if("absent", |_| true));
    assert!(reg.erase_if("k", |c| Arc::ptr_eq(c, &theirs)));
    assert!(!reg.contains("k"));
}
