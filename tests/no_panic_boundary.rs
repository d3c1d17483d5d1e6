//! No panic unwinds into C or Python.
//!
//! Reads the crates' sources and checks, structurally:
//! * every `#[pyfunction]` / `#[pymethods]` in `bindings/python/src` is PyO3's
//!   attribute on an ordinary `fn` / `impl` (PyO3's generated trampolines catch
//!   panics and raise `PanicException`; the bindings also map every `CacheError`
//!   to an exception), and no file defines its own `pyfunction`/`pymethods`;
//! * no Cargo manifest (nor `.cargo/config*`) sets `panic = "abort"` (under
//!   abort a panic would kill the interpreter instead of reaching a trampoline);
//! * no `extern "C" fn` is *defined* in the core, the bindings or xnnpack-sys
//!   (xnnpack-sys only *declares* C functions in `extern "C" {}` blocks and
//!   names `extern "C" fn(...)` pointer types), and every definition that may
//!   appear later, and every `#[no_mangle]`/`#[export_name]` function, wraps its
//!   body in `std::panic::catch_unwind`, either inline or by being one call to a
//!   boundary function: a plain `fn` of the scanned sources whose own body calls
//!   `catch_unwind` (the C library's `status::guard`).
//!
//! The checker runs on synthetic sources first, so a checker that cannot fail
//! fails the test.

use std::fs;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Punct(char),
}

/// A small Rust lexer: drops comments, keeps identifiers, string literals (by
/// content) and punctuation; char literals and lifetimes are dropped.
fn lex(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    while i < c.len() {
        let ch = c[i];
        if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == 'r'
            && (at(i + 1) == '"' || (at(i + 1) == '#' && matches!(at(i + 2), '"' | '#')))
        {
            // Raw string r"..." / r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1; // opening quote
            let start = j;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (1..=hashes).all(|h| at(j + h) == '#') {
                    break;
                }
                j += 1;
            }
            out.push(Tok::Str(c[start..j.min(c.len())].iter().collect()));
            i = j + 1 + hashes;
        } else if ch == '"' || (ch == 'b' && at(i + 1) == '"') {
            let mut j = if ch == 'b' { i + 2 } else { i + 1 };
            let start = j;
            while j < c.len() && c[j] != '"' {
                if c[j] == '\\' {
                    j += 1;
                }
                j += 1;
            }
            out.push(Tok::Str(c[start..j.min(c.len())].iter().collect()));
            i = j + 1;
        } else if ch == '\'' {
            // Char literal ('x', '\n', '\'', '"') or lifetime ('a).
            if at(i + 1) == '\\' {
                let mut j = i + 2;
                while j < c.len() && c[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(c[start..i].iter().collect()));
        } else if ch.is_whitespace() || ch.is_ascii_digit() {
            i += 1;
        } else {
            out.push(Tok::Punct(ch));
            i += 1;
        }
    }
    out
}

fn is_ident(t: Option<&Tok>, s: &str) -> bool {
    matches!(t, Some(Tok::Ident(x)) if x == s)
}

fn is_punct(t: Option<&Tok>, p: char) -> bool {
    matches!(t, Some(Tok::Punct(x)) if *x == p)
}

/// The tokens of the `{ ... }` body of the fn whose `fn` keyword is at `k`
/// (`None` for a declaration ending in `;`).
fn fn_body(toks: &[Tok], k: usize) -> Option<&[Tok]> {
    let mut j = k;
    let mut paren = 0i32;
    while let Some(t) = toks.get(j) {
        match t {
            Tok::Punct('(') => paren += 1,
            Tok::Punct(')') => paren -= 1,
            Tok::Punct(';') if paren == 0 => return None,
            Tok::Punct('{') if paren == 0 => break,
            _ => {}
        }
        j += 1;
    }
    let open = j;
    let mut depth = 0i32;
    while let Some(t) = toks.get(j) {
        match t {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    return toks.get(open..=j);
                }
            }
            _ => {}
        }
        j += 1;
    }
    toks.get(open..)
}

fn catches(body: &[Tok]) -> bool {
    body.iter()
        .any(|t| matches!(t, Tok::Ident(x) if x == "catch_unwind"))
}

/// Plain (non-extern) fns whose body calls `catch_unwind`: an export whose
/// whole body is one call to one of them is wrapped.
fn boundary_fns(src: &str) -> Vec<String> {
    let toks = lex(src);
    let mut out = Vec::new();
    for (k, t) in toks.iter().enumerate() {
        if !is_ident(Some(t), "fn") {
            continue;
        }
        let foreign = toks
            .get(k.saturating_sub(2)..k)
            .is_some_and(|s| s.iter().any(|t| is_ident(Some(t), "extern")));
        if let (false, Some(Tok::Ident(name))) = (foreign, toks.get(k + 1)) {
            if fn_body(&toks, k).is_some_and(catches) {
                out.push(name.clone());
            }
        }
    }
    out
}

/// `{ boundary(...) }`: the body is exactly one call to a boundary fn, so
/// nothing runs outside its `catch_unwind`.
fn one_boundary_call(body: &[Tok], boundaries: &[String]) -> bool {
    let [Tok::Punct('{'), Tok::Ident(name), Tok::Punct('('), inner @ .., Tok::Punct(')'), Tok::Punct('}')] =
        body
    else {
        return false;
    };
    // The parentheses after the name must close at the end: `g(a)(b)` or
    // `g(a); h()` is not one call.
    let mut depth = 0i32;
    for t in inner {
        match t {
            Tok::Punct('(') => depth += 1,
            Tok::Punct(')') => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => {}
        }
    }
    depth == 0 && boundaries.iter().any(|b| b == name)
}

fn wrapped(body: &[Tok], boundaries: &[String]) -> bool {
    catches(body) || one_boundary_call(body, boundaries)
}

/// Foreign-ABI fn definitions and exported symbols; returns one message per
/// boundary function whose body does not go through `catch_unwind`, and the
/// names of every foreign-ABI definition found.
fn check_extern_fns(src: &str, file: &str, boundaries: &[String]) -> (Vec<String>, Vec<String>) {
    let toks = lex(src);
    let mut bad = Vec::new();
    let mut defs = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        // `extern "abi" fn name` (or `extern fn name`, ABI "C"): a definition or
        // a declaration of a foreign-ABI function with a name. `extern "C" fn(`
        // (a pointer type) and `extern "C" {` (a block of C declarations) are not.
        if is_ident(Some(t), "extern") {
            let mut k = i + 1;
            let abi = match toks.get(k) {
                Some(Tok::Str(a)) => {
                    k += 1;
                    a.clone()
                }
                _ => "C".to_string(),
            };
            if abi == "Rust" || !is_ident(toks.get(k), "fn") {
                continue;
            }
            let Some(Tok::Ident(name)) = toks.get(k + 1) else {
                continue; // a fn-pointer type
            };
            if let Some(body) = fn_body(&toks, k) {
                defs.push(format!("{file}: extern \"{abi}\" fn {name}"));
                if !wrapped(body, boundaries) {
                    bad.push(format!(
                        "{file}: extern \"{abi}\" fn {name} is defined without std::panic::catch_unwind around its body"
                    ));
                }
            }
        }
        // `#[no_mangle]`, `#[unsafe(no_mangle)]`, `#[export_name = ...]`: the
        // next fn is an exported symbol and must be a catching extern fn.
        if let Tok::Ident(x) = t {
            if x == "no_mangle" || x == "export_name" {
                let next_fn = (i..toks.len()).find(|&j| is_ident(toks.get(j), "fn"));
                let Some(k) = next_fn else {
                    bad.push(format!("{file}: #[{x}] without a fn"));
                    continue;
                };
                let name = match toks.get(k + 1) {
                    Some(Tok::Ident(n)) => n.clone(),
                    _ => "?".into(),
                };
                let is_extern = toks
                    .get(i..k)
                    .is_some_and(|s| s.iter().any(|t| is_ident(Some(t), "extern")));
                let ok = is_extern && fn_body(&toks, k).is_some_and(|b| wrapped(b, boundaries));
                if !ok {
                    bad.push(format!(
                        "{file}: #[{x}] fn {name} is exported without being an extern fn whose body is wrapped in catch_unwind"
                    ));
                }
            }
        }
    }
    (bad, defs)
}

/// `#[pyfunction]` must sit on a plain `fn`, `#[pymethods]` on an `impl`, in a
/// file that uses PyO3 and defines no attribute of those names itself. Returns
/// (violations, number of entries found).
fn check_pyo3_entries(src: &str, file: &str) -> (Vec<String>, usize) {
    let toks = lex(src);
    let mut bad = Vec::new();
    let mut n = 0;
    let uses_pyo3 = toks.windows(1).any(|w| is_ident(w.first(), "pyo3"));
    for (i, t) in toks.iter().enumerate() {
        let Tok::Ident(x) = t else { continue };
        let attr = x == "pyfunction" || x == "pymethods";
        // Only the attribute form `#[pyfunction` / `#[pyo3::pyfunction`.
        let is_attr = attr
            && (is_punct(toks.get(i.wrapping_sub(1)), '[')
                && is_punct(toks.get(i.wrapping_sub(2)), '#')
                || is_punct(toks.get(i.wrapping_sub(1)), ':')
                    && is_ident(toks.get(i.wrapping_sub(3)), "pyo3")
                    && is_punct(toks.get(i.wrapping_sub(4)), '['));
        if attr && !is_attr {
            // A local definition named like PyO3's attribute would shadow it.
            if is_ident(toks.get(i.wrapping_sub(1)), "fn")
                || (is_punct(toks.get(i.wrapping_sub(1)), '!')
                    && is_ident(toks.get(i.wrapping_sub(2)), "macro_rules"))
            {
                bad.push(format!("{file}: defines its own `{x}`"));
            }
            continue;
        }
        if !is_attr {
            continue;
        }
        n += 1;
        if !uses_pyo3 {
            bad.push(format!("{file}: #[{x}] in a file that does not use pyo3"));
        }
        // The item the attribute applies to: skip this attribute's `]` and any
        // further attributes, then visibility.
        let mut j = i + 1;
        let mut depth = 1;
        while depth > 0 && j < toks.len() {
            match toks[j] {
                Tok::Punct('[') => depth += 1,
                Tok::Punct(']') => depth -= 1,
                _ => {}
            }
            j += 1;
        }
        loop {
            if is_punct(toks.get(j), '#') {
                let mut d = 0;
                j += 1;
                while j < toks.len() {
                    match toks[j] {
                        Tok::Punct('[') => d += 1,
                        Tok::Punct(']') => {
                            d -= 1;
                            if d == 0 {
                                j += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
            } else if is_ident(toks.get(j), "pub") {
                j += 1;
                if is_punct(toks.get(j), '(') {
                    while j < toks.len() && !is_punct(toks.get(j), ')') {
                        j += 1;
                    }
                    j += 1;
                }
            } else {
                break;
            }
        }
        let item = match toks.get(j) {
            Some(Tok::Ident(s)) => s.as_str(),
            _ => "?",
        };
        let ok = if x == "pymethods" {
            item == "impl" || (item == "unsafe" && is_ident(toks.get(j + 1), "impl"))
        } else {
            item == "fn"
        };
        if !ok {
            bad.push(format!(
                "{file}: #[{x}] on `{item}`, expected a PyO3 {}",
                if x == "pymethods" {
                    "impl block"
                } else {
                    "plain fn"
                }
            ));
        }
    }
    (bad, n)
}

/// Lines of a Cargo manifest or cargo config that set `panic = "abort"` (or
/// `-C panic=abort` rustflags), comments ignored.
fn abort_settings(toml: &str, file: &str) -> Vec<String> {
    toml.lines()
        .enumerate()
        .filter_map(|(n, line)| {
            let code = line.split('#').next().unwrap_or("");
            let flat: String = code.chars().filter(|c| !c.is_whitespace()).collect();
            (flat.contains("panic=\"abort\"")
                || flat.contains("panic='abort'")
                || flat.contains("panic=abort"))
            .then(|| format!("{file}:{}: {}", n + 1, line.trim()))
        })
        .collect()
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_checkers_catch_what_they_look_for() {
    // extern "C" definitions.
    let (bad, defs) = check_extern_fns(r#"pub extern "C" fn f(x: i32) -> i32 { g(x) }"#, "t", &[]);
    assert_eq!((bad.len(), defs.len()), (1, 1), "{bad:?}");
    let (bad, _) = check_extern_fns(r#"unsafe extern "C-unwind" fn f() { g() }"#, "t", &[]);
    assert_eq!(bad.len(), 1);
    let (bad, _) = check_extern_fns(r#"extern fn f() { g() }"#, "t", &[]);
    assert_eq!(bad.len(), 1);
    let ok = r#"#[no_mangle]
        pub extern "C" fn f(x: i32) -> i32 {
            std::panic::catch_unwind(|| g(x)).unwrap_or(-1)
        }"#;
    let (bad, defs) = check_extern_fns(ok, "t", &[]);
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(defs.len(), 1);
    // Declarations and pointer types are not definitions.
    let decls = r#"extern "C" { fn g(x: i32) -> i32; pub fn h(); }
        pub struct A { pub f: Option<unsafe extern "C" fn(*mut u8, usize) -> *mut u8> }
        // extern "C" fn commented_out() { }
        const S: &str = "extern \"C\" fn in_a_string() { }";
        fn rust_abi() { let c = '"'; }"#;
    let (bad, defs) = check_extern_fns(decls, "t", &[]);
    assert!(bad.is_empty() && defs.is_empty(), "{bad:?} {defs:?}");
    // Exported symbols.
    let (bad, _) = check_extern_fns("#[no_mangle]\npub fn f() {}", "t", &[]);
    assert_eq!(bad.len(), 1);
    let (bad, _) = check_extern_fns(
        "#[unsafe(no_mangle)]\npub unsafe extern \"C\" fn f() { g() }",
        "t",
        &[],
    );
    assert_eq!(bad.len(), 2, "{bad:?}"); // the definition and the export
    let (bad, _) = check_extern_fns(
        "#[export_name = \"x\"]\nextern \"C\" fn f() { g() }",
        "t",
        &[],
    );
    assert!(!bad.is_empty());

    // One call to a boundary fn (a plain fn that catches) is wrapped; a call
    // to a fn that does not catch, or code beside the call, is not.
    let lib = "fn guard(f: impl FnOnce()) -> i32 { finish(std::panic::catch_unwind(f)) }\n\
               fn plain(f: impl FnOnce()) -> i32 { f(); 0 }\n\
               pub extern \"C\" fn not_a_boundary() -> i32 { catch_unwind_free() }";
    let b = boundary_fns(lib);
    assert_eq!(b, vec!["guard".to_string()]);
    let export = |body: &str| format!("#[no_mangle]\npub extern \"C\" fn f() -> i32 {{ {body} }}");
    let (bad, _) = check_extern_fns(&export("guard(|| { g(); h() })"), "t", &b);
    assert!(bad.is_empty(), "{bad:?}");
    for body in [
        "plain(|| g())",
        "g(); guard(|| h())",
        "guard(|| g()); h()",
        "guard(|| g())(1)",
    ] {
        let (bad, _) = check_extern_fns(&export(body), "t", &b);
        assert_eq!(bad.len(), 2, "{body}: {bad:?}");
    }

    // PyO3 entries.
    let good = "use pyo3::prelude::*;\n#[pyfunction]\n#[pyo3(signature = (a, b=None))]\npub fn f(a: i32, b: Option<i32>) {}\n#[pymethods]\nimpl A { fn g(&self) {} }\n#[pyo3::pyfunction]\nfn h() {}";
    let (bad, n) = check_pyo3_entries(good, "t");
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(n, 3);
    let (bad, _) = check_pyo3_entries(
        "use pyo3::prelude::*;\n#[pyfunction]\npub extern \"C\" fn f() {}",
        "t",
    );
    assert_eq!(bad.len(), 1, "{bad:?}");
    let (bad, _) = check_pyo3_entries("#[pyfunction]\nfn f() {}", "t");
    assert_eq!(bad.len(), 1, "{bad:?}");
    let (bad, _) = check_pyo3_entries(
        "use pyo3::prelude::*;\nmacro_rules! pyfunction { () => {} }",
        "t",
    );
    assert_eq!(bad.len(), 1, "{bad:?}");

    // Manifests.
    assert_eq!(
        abort_settings("[profile.release]\npanic = \"abort\"\n", "t").len(),
        1
    );
    assert_eq!(
        abort_settings("rustflags = [\"-C\", \"panic=abort\"]\n", "t").len(),
        1
    );
    assert!(abort_settings(
        "[profile.release]\n# panic = \"abort\"\npanic = \"unwind\"\n",
        "t"
    )
    .is_empty());
}

#[test]
fn no_foreign_abi_function_is_defined_without_catch_unwind() {
    let r = root();
    let mut files = Vec::new();
    for d in [
        "src",
        "bindings/python/src",
        "xnnpack-sys/src",
        "bindings/c/src",
    ] {
        rust_files(&r.join(d), &mut files);
    }
    assert!(files.len() >= 20, "found only {} source files", files.len());
    let sources: Vec<(String, String)> = files
        .iter()
        .map(|f| {
            let name = f.strip_prefix(&r).unwrap_or(f).display().to_string();
            (name, fs::read_to_string(f).unwrap())
        })
        .collect();
    let boundaries: Vec<String> = sources.iter().flat_map(|(_, s)| boundary_fns(s)).collect();
    // A new boundary fn widens what counts as wrapped: review it, then list it.
    // `worker` is the attention pool's thread loop: it catches a job's panic
    // (reported as a Backend error) and no export calls it.
    assert_eq!(boundaries, ["worker", "guard"], "boundary fns changed");
    let mut bad = Vec::new();
    let mut defs = Vec::new();
    for (name, src) in &sources {
        let (b, d) = check_extern_fns(src, name, &boundaries);
        bad.extend(b);
        defs.extend(d);
    }
    assert!(
        bad.is_empty(),
        "panics could unwind into C:\n{}",
        bad.join("\n")
    );
    // The only foreign-ABI definitions are the C library's exports (each
    // checked above) and the worker pool's pthread_atfork child handler
    // (checked above too: it catches); PyO3's trampolines catch on their own.
    let outside: Vec<&String> = defs
        .iter()
        .filter(|d| !d.starts_with("bindings/c/src/"))
        .filter(|d| d.as_str() != "src/workers.rs: extern \"C\" fn forked_child")
        .collect();
    assert!(
        outside.is_empty(),
        "extern fn definitions outside bindings/c (they catch_unwind; review and update this test):\n{outside:?}"
    );
    assert!(
        defs.len() >= 60,
        "found only {} extern \"C\" definitions in bindings/c: is the lexer broken?",
        defs.len()
    );
    // xnnpack-sys really does declare its C functions in an extern block.
    let sys = fs::read_to_string(r.join("xnnpack-sys/src/lib.rs")).unwrap();
    let t = lex(&sys);
    assert!(
        t.windows(3).any(|w| is_ident(w.first(), "extern")
            && matches!(w.get(1), Some(Tok::Str(a)) if a == "C")
            && is_punct(w.get(2), '{')),
        "xnnpack-sys has no extern \"C\" {{}} block: is the lexer broken?"
    );
}

#[test]
fn every_pyo3_entry_is_a_pyo3_trampoline() {
    let r = root();
    let mut files = Vec::new();
    rust_files(&r.join("bindings/python/src"), &mut files);
    let mut bad = Vec::new();
    let mut entries = 0;
    for f in &files {
        let src = fs::read_to_string(f).unwrap();
        let name = f.strip_prefix(&r).unwrap_or(f).display().to_string();
        let (b, n) = check_pyo3_entries(&src, &name);
        bad.extend(b);
        entries += n;
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(
        entries >= 10,
        "found only {entries} #[pyfunction]/#[pymethods]: is the lexer broken?"
    );
}

#[test]
fn no_manifest_aborts_on_panic() {
    let r = root();
    let mut bad = Vec::new();
    for f in [
        "Cargo.toml",
        "bindings/python/Cargo.toml",
        "bindings/c/Cargo.toml",
        "xnnpack-sys/Cargo.toml",
        "bindings/python/pyproject.toml",
        "pyproject.toml",
        ".cargo/config.toml",
        ".cargo/config",
        "bindings/python/.cargo/config.toml",
    ] {
        if let Ok(s) = fs::read_to_string(r.join(f)) {
            bad.extend(abort_settings(&s, f));
        }
    }
    assert!(fs::read_to_string(r.join("bindings/python/Cargo.toml")).is_ok());
    assert!(
        bad.is_empty(),
        "panic = abort would turn a caught panic into a crash:\n{}",
        bad.join("\n")
    );
}
