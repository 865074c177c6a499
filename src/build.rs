//! Links optimized builds of the `perch` binary with two things that keep it small in memory:
//!
//! - Packed relative relocations (DT_RELR), when the C toolchain and libc here support them
//!   (binutils 2.38 and glibc 2.36 or later). A position-independent binary carries one
//!   relocation per pointer in its read-only data; packed, the 2.3 MiB table becomes a few
//!   kilobytes, which the loader reads at every start and which stayed resident. Address
//!   randomization is kept. Without support the binary links as before.
//! - The symbol order in `src/symbol-order.txt`, when rustc links with its own LLD (the default
//!   on x86_64 Linux since Rust 1.90; not when a linker is configured). The functions and
//!   constants an agent touches while it starts, connects and idles are placed first, together,
//!   so the kernel maps a few megabytes of the binary instead of pages scattered across all of
//!   it. Names the build does not have (another profile, a changed dependency) are skipped
//!   silently; `tests/symbol-order.sh` writes the file again.

use std::path::PathBuf;
use std::process::{Command, Stdio};

fn main() {
    println!("cargo::rerun-if-changed=src/build.rs");
    println!("cargo::rerun-if-changed={SYMBOL_ORDER}");
    println!("cargo::rerun-if-env-changed=CC");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let target_env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let optimized = std::env::var("PROFILE").as_deref() == Ok("release");
    let native = std::env::var("TARGET").ok() == std::env::var("HOST").ok();
    if target_os == "linux" && target_env == "gnu" && optimized && native && links_packed() {
        println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    let x86_64 = std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64");
    let order =
        std::env::var_os("CARGO_MANIFEST_DIR").map(|dir| PathBuf::from(dir).join(SYMBOL_ORDER));
    if let Some(order) = order.filter(|order| order.is_file())
        && target_os == "linux"
        && target_env == "gnu"
        && x86_64
        && optimized
        && links_with_rust_lld()
    {
        println!(
            "cargo::rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo::rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}

const SYMBOL_ORDER: &str = "src/symbol-order.txt";

/// Whether rustc links with its default linker, its own LLD, which knows
/// `--symbol-ordering-file`: no linker is configured for the target and no rustflag chooses one
/// or its features.
fn links_with_rust_lld() -> bool {
    println!("cargo::rerun-if-env-changed=RUSTC_LINKER");
    if std::env::var_os("RUSTC_LINKER").is_some() {
        return false;
    }
    let rustflags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    !rustflags.contains("linker")
}

/// Whether a C program links with packed relocations: the linker knows the option (an unknown
/// `-z` option is only a warning, made fatal here) and the libc has `GLIBC_ABI_DT_RELR`, which
/// the linker then requires.
fn links_packed() -> bool {
    let Some(out_dir) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return false;
    };
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let probe = out_dir.join("relr-probe");
    let Ok(mut child) = Command::new(compiler)
        .args(["-x", "c", "-", "-o"])
        .arg(&probe)
        .args([
            "-pie",
            "-Wl,-z,pack-relative-relocs",
            "-Wl,--fatal-warnings",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        let source = "static const char *const table[] = {\"a\", \"b\"};\n\
                      int main(int argc, char **argv) { (void)argv; return table[argc & 1][0] == 'z'; }\n";
        if stdin.write_all(source.as_bytes()).is_err() {
            return false;
        }
    }
    let linked = child.wait().is_ok_and(|status| status.success());
    let runs = linked
        && Command::new(&probe)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
    let _ = std::fs::remove_file(&probe);
    runs
}
