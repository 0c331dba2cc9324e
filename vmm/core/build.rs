//! Builds the guest images (`guest-images`, feature `image`) with a nested
//! `cargo build` for the host target with `panic=abort`, no start files and
//! the guest linker script, and exposes their paths to `include_bytes!` as
//! `TIERVM_IMAGE_<NAME>`. Only the host Rust target is needed.

use std::path::PathBuf;
use std::process::Command;

const IMAGES: &[&str] = &["zipf", "gups", "memcheck", "kv", "pagerank"];
const TARGET: &str = "x86_64-unknown-linux-gnu";

fn main() {
    let manifest_dir =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let guest_dir = manifest_dir.join("../../guest-images");
    let guest_dir = guest_dir.canonicalize().unwrap_or(guest_dir);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let target_dir = out_dir.join("guest-target");
    let linker_script = guest_dir.join("link.ld");
    for p in ["src", "Cargo.toml", "link.ld"] {
        println!("cargo:rerun-if-changed={}", guest_dir.join(p).display());
    }

    let flags = [
        "-Cpanic=abort".to_string(),
        "-Crelocation-model=static".to_string(),
        "-Cdebuginfo=0".to_string(),
        "-Clink-arg=-nostartfiles".to_string(),
        "-Clink-arg=-static".to_string(),
        "-Clink-arg=-no-pie".to_string(),
        "-Clink-arg=-Wl,--build-id=none".to_string(),
        format!("-Clink-arg=-T{}", linker_script.display()),
    ];
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&guest_dir)
        .args([
            "build",
            "--release",
            "--features",
            "image",
            "--bins",
            "--target",
            TARGET,
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"))
        // Do not run the outer build's wrappers (clippy, coverage) on the guests.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET");
    let status = cmd
        .status()
        .expect("failed to run cargo for the guest images");
    assert!(
        status.success(),
        "building the guest images failed (see the output above)"
    );
    for name in IMAGES {
        let path = target_dir.join(TARGET).join("release").join(name);
        assert!(
            path.exists(),
            "guest image {} missing at {}",
            name,
            path.display()
        );
        println!(
            "cargo:rustc-env=TIERVM_IMAGE_{}={}",
            name.to_uppercase(),
            path.display()
        );
    }
}
