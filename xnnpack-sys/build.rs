//! Finds Debian's `libXNNPACK.so` (package `libxnnpack-dev`) and links it.
//!
//! Search order:
//! 1. `XNNPACK_LIB_DIR` (a directory holding `libXNNPACK.so`); `XNNPACK_INCLUDE_DIR`
//!    is checked for `xnnpack.h` when set, and passed on as `DEP_XNNPACK_INCLUDE`.
//! 2. `pkg-config --libs libxnnpack` / `xnnpack`, when a `pkg-config` binary is on PATH
//!    and knows the package (Debian ships no `.pc` file for it; other distros may).
//! 3. The usual library directories (`/usr/lib/<multiarch>`, `/usr/lib64`, `/usr/lib`,
//!    `/usr/local/lib`).
//!
//! No pthreadpool symbol is used directly (operators run with a NULL thread pool),
//! so only `-lXNNPACK` is linked; `libXNNPACK.so` pulls `libpthreadpool.so.0` and
//! `libcpuinfo.so.0` in through its own `DT_NEEDED` entries, and
//! `libpthreadpool-dev` is not needed.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const HINT: &str = "libXNNPACK.so not found: install it with `apt-get install libxnnpack-dev` \
     (Debian/Ubuntu), or point XNNPACK_LIB_DIR at the directory holding libXNNPACK.so";

fn main() {
    println!("cargo:rerun-if-env-changed=XNNPACK_LIB_DIR");
    println!("cargo:rerun-if-env-changed=XNNPACK_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-changed=build.rs");

    if let Ok(dir) = env::var("XNNPACK_INCLUDE_DIR") {
        let header = Path::new(&dir).join("xnnpack.h");
        if !header.is_file() {
            fail(&format!(
                "XNNPACK_INCLUDE_DIR={dir}: expected {} to exist, got no such file",
                header.display()
            ));
        }
        println!("cargo:include={dir}");
    }

    if let Ok(dir) = env::var("XNNPACK_LIB_DIR") {
        let lib = Path::new(&dir).join("libXNNPACK.so");
        if !lib.is_file() {
            fail(&format!(
                "XNNPACK_LIB_DIR={dir}: expected {} to exist, got no such file. {HINT}",
                lib.display()
            ));
        }
        println!("cargo:rustc-link-search=native={dir}");
        println!("cargo:rustc-link-lib=dylib=XNNPACK");
        return;
    }

    if let Some(flags) = pkg_config() {
        for flag in flags.split_whitespace() {
            if let Some(dir) = flag.strip_prefix("-L") {
                println!("cargo:rustc-link-search=native={dir}");
            } else if let Some(lib) = flag.strip_prefix("-l") {
                println!("cargo:rustc-link-lib=dylib={lib}");
            }
        }
        return;
    }

    for dir in candidate_dirs() {
        if dir.join("libXNNPACK.so").is_file() {
            println!("cargo:rustc-link-search=native={}", dir.display());
            println!("cargo:rustc-link-lib=dylib=XNNPACK");
            return;
        }
    }
    fail(HINT);
}

/// `pkg-config --libs` for the first package name it knows, if the binary exists.
fn pkg_config() -> Option<String> {
    for name in ["libxnnpack", "xnnpack", "XNNPACK"] {
        let out = Command::new("pkg-config")
            .args(["--libs", name])
            .output()
            .ok()?;
        if out.status.success() {
            let s = String::from_utf8(out.stdout).ok()?;
            if s.contains("-l") {
                return Some(s);
            }
        }
    }
    None
}

fn candidate_dirs() -> Vec<PathBuf> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env_abi = env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let mut dirs = Vec::new();
    if os == "linux" && !arch.is_empty() {
        let abi = if env_abi.is_empty() {
            "gnu".to_string()
        } else {
            env_abi
        };
        dirs.push(PathBuf::from(format!("/usr/lib/{arch}-linux-{abi}")));
        dirs.push(PathBuf::from(format!("/lib/{arch}-linux-{abi}")));
    }
    for d in [
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
        "/usr/local/lib64",
    ] {
        dirs.push(PathBuf::from(d));
    }
    dirs
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    panic!("{msg}");
}
