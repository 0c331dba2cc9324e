//! Running tiervm as an ordinary user (docs/host-requirements.md, "Running
//! as an ordinary user"): without access to `/dev/kvm` (and, for tiered
//! runs, to userfaultfd) a run fails with an error that names each missing
//! permission and its fix; with read-write access to the two device nodes
//! through a supplementary group, and nothing else (no root uid, no
//! capability), a tiered run works.
//!
//! The tests drop privileges with `setpriv` (util-linux), so they need to run
//! as root; they skip with a printed reason otherwise. The positive test
//! changes no machine state: it makes group-accessible copies of the two
//! device nodes in a private temporary directory and bind-mounts them over
//! `/dev/kvm` and `/dev/userfaultfd` inside a private mount namespace
//! (`unshare --mount`), visible only to the tiervm process it starts.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The unprivileged user and group the tests run tiervm as.
const NOBODY: u32 = 65534;
/// A group id that exists only for the test's device-node copies.
const DEVICE_GROUP: u32 = 47474;

fn euid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// `true` if this test can drop privileges; otherwise prints why it skips.
fn can_drop_privileges(test: &str, tools: &[&str]) -> bool {
    if euid() != Some(0) {
        eprintln!("SKIPPED {test}: needs root to drop to uid {NOBODY} with setpriv; run the tests as root");
        return false;
    }
    for tool in tools {
        match Command::new(tool).arg("--version").output() {
            Ok(o) if o.status.success() => {}
            _ => {
                eprintln!(
                    "SKIPPED {test}: `{tool}` (util-linux) is not available; install util-linux"
                );
                return false;
            }
        }
    }
    true
}

fn kvm_or_skip(test: &str) -> bool {
    if common::kvm_available(test) {
        return true;
    }
    assert!(
        std::env::var("TIERVM_REQUIRE_KVM").as_deref() != Ok("1"),
        "{test}: TIERVM_REQUIRE_KVM=1 but /dev/kvm is not usable"
    );
    false
}

/// A temporary directory removed when dropped, also when the test fails
/// (it may hold device-node copies).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(tag: &str, mode: u32) -> TempDir {
    let d = std::env::temp_dir().join(format!("tiervm-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create temp dir");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).expect("chmod temp dir");
    TempDir(d)
}

/// A copy of the tiervm binary that uid 65534 can execute (the build
/// directory may not be reachable for it).
fn public_tiervm(dir: &Path) -> PathBuf {
    let exe = dir.join("tiervm");
    std::fs::copy(env!("CARGO_BIN_EXE_tiervm"), &exe).expect("copy tiervm");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod tiervm");
    exe
}

/// Runs `cmd` with a bound on its wall time.
fn run_bounded(mut cmd: Command, bound: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("collect output");
        }
        if start.elapsed() > bound {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect output");
            panic!(
                "{cmd:?} still running after {bound:?} (killed):\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `setpriv` dropping to uid/gid 65534 with `groups` as the only
/// supplementary groups (none: cleared).
fn as_nobody(groups: &[u32]) -> Vec<String> {
    let mut v = vec![
        "setpriv".to_string(),
        format!("--reuid={NOBODY}"),
        format!("--regid={NOBODY}"),
    ];
    if groups.is_empty() {
        v.push("--clear-groups".into());
    } else {
        let list: Vec<String> = groups.iter().map(u32::to_string).collect();
        v.push(format!("--groups={}", list.join(",")));
    }
    // No capability may survive the uid change (setpriv keeps none by
    // default; say so explicitly).
    v.push("--inh-caps=-all".into());
    v.push("--".into());
    v
}

const SMALL_TIERED_RUN: &[&str] = &[
    "run",
    "memcheck",
    "--mem",
    "64M",
    "--fast",
    "32M",
    "--arg",
    "region=16M",
    "--duration",
    "1s",
    "--report",
    "json",
    "--quiet",
];

#[test]
fn without_access_the_error_names_the_missing_permission() {
    let test = "without_access_the_error_names_the_missing_permission";
    if !can_drop_privileges(test, &["setpriv"]) {
        return;
    }
    let kvm = std::fs::metadata("/dev/kvm");
    if kvm.as_ref().is_ok_and(|m| m.mode() & 0o006 == 0o006) {
        eprintln!("SKIPPED {test}: /dev/kvm is world read-write here, so every user may open it");
        return;
    }
    let dir = temp_dir("nopriv", 0o755);
    let exe = public_tiervm(&dir.0);

    // Untiered: only /dev/kvm is needed.
    let argv = as_nobody(&[]);
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).arg(&exe).args([
        "run",
        "memcheck",
        "--mem",
        "64M",
        "--arg",
        "region=16M",
        "--duration",
        "1s",
        "--quiet",
    ]);
    let out = run_bounded(cmd, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    if kvm.is_err() {
        assert!(
            err.contains("cannot open /dev/kvm: no such device"),
            "{err}"
        );
        return;
    }
    assert!(
        err.contains("tiervm: error: cannot open /dev/kvm: permission denied: /dev/kvm is "),
        "the error names /dev/kvm and the refusal: {err}"
    );
    assert!(
        err.contains("usermod -aG") && err.contains("; or run as root"),
        "the error names the fix: {err}"
    );
    assert!(
        !err.contains("userfaultfd"),
        "an untiered run needs no userfaultfd: {err}"
    );

    // Tiered: userfaultfd is needed too (unless this host lets every user
    // have one); both are named in one error.
    let argv = as_nobody(&[]);
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).arg(&exe).args(SMALL_TIERED_RUN);
    let out = run_bounded(cmd, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot open /dev/kvm: permission denied"),
        "{err}"
    );
    let open_uffd = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
        .is_ok_and(|v| v.trim() == "1")
        || std::fs::metadata("/dev/userfaultfd").is_ok_and(|m| m.mode() & 0o006 == 0o006);
    if open_uffd {
        eprintln!("note: this host gives every user a userfaultfd; only /dev/kvm is missing");
    } else {
        assert!(err.contains("lacks 2 host permissions"), "{err}");
        assert!(
            err.contains("userfaultfd: permission denied: ")
                && err.contains("vm.unprivileged_userfaultfd is 0")
                && err.contains("/dev/userfaultfd"),
            "the error names userfaultfd and its fixes: {err}"
        );
    }
}

/// Makes `dst` a character device node with the numbers of `src`, owned by
/// root:`gid` with mode 0660.
fn group_copy_of_node(src: &str, dst: &Path, gid: u32) -> Result<(), String> {
    let meta = std::fs::metadata(src).map_err(|e| format!("{src}: {e}"))?;
    let rdev = meta.rdev();
    // Linux dev_t encoding of major/minor (glibc's gnu_dev_major/minor).
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    let out = Command::new("mknod")
        .arg(dst)
        .args(["c", &major.to_string(), &minor.to_string()])
        .output()
        .map_err(|e| format!("mknod: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mknod {}: {}",
            dst.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    std::os::unix::fs::chown(dst, Some(0), Some(gid)).map_err(|e| format!("chown: {e}"))?;
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| format!("chmod: {e}"))
}

/// Runs tiervm as uid 65534 with supplementary `groups`, in a private mount
/// namespace where `/dev/kvm` and `/dev/userfaultfd` are root:DEVICE_GROUP
/// 0660 copies of the real nodes.
fn run_in_namespace(nodes: &Path, exe: &Path, groups: &[u32], args: &[&str]) -> Output {
    let mut script = format!(
        "set -e; mount --bind {n}/kvm /dev/kvm; mount --bind {n}/userfaultfd /dev/userfaultfd; exec",
        n = nodes.display()
    );
    for w in as_nobody(groups) {
        script += &format!(" '{w}'");
    }
    script += &format!(" '{}'", exe.display());
    for a in args {
        script += &format!(" '{a}'");
    }
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
    run_bounded(cmd, Duration::from_secs(90))
}

#[test]
fn a_user_in_the_device_group_runs_tiered_vms_without_root() {
    let test = "a_user_in_the_device_group_runs_tiered_vms_without_root";
    if !kvm_or_skip(test) || !can_drop_privileges(test, &["setpriv", "unshare", "mknod"]) {
        return;
    }
    if !Path::new("/dev/userfaultfd").exists() {
        eprintln!("SKIPPED {test}: no /dev/userfaultfd (Linux < 6.1) to give a group access to");
        return;
    }
    // Only root may enter this directory; the bind mounts refer to the
    // nodes themselves, so uid 65534 reaches them only through /dev.
    let nodes = temp_dir("devnodes", 0o700);
    for (src, name) in [("/dev/kvm", "kvm"), ("/dev/userfaultfd", "userfaultfd")] {
        if let Err(e) = group_copy_of_node(src, &nodes.0.join(name), DEVICE_GROUP) {
            eprintln!("SKIPPED {test}: cannot make a device node copy here ({e})");
            return;
        }
    }
    let bin = temp_dir("nopriv-bin", 0o755);
    let exe = public_tiervm(&bin.0);

    // Negative control: the same uid without the group is refused, and the
    // error names the group that would let it in.
    let out = run_in_namespace(&nodes.0, &exe, &[], SMALL_TIERED_RUN);
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("mount") && !err.contains("tiervm") {
        eprintln!("SKIPPED {test}: cannot bind-mount in a private mount namespace here: {err}");
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "cannot open /dev/kvm: permission denied: /dev/kvm is root:{DEVICE_GROUP} mode 0660: add the user to group {DEVICE_GROUP}"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!("/dev/userfaultfd is root:{DEVICE_GROUP} mode 0660: add the user to group {DEVICE_GROUP}")),
        "{err}"
    );

    // With the group: a tiered memcheck runs to the end as uid 65534.
    let out = run_in_namespace(&nodes.0, &exe, &[DEVICE_GROUP], SMALL_TIERED_RUN);
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "as uid {NOBODY} in group {DEVICE_GROUP}:\n{stdout}\n{err}"
    );
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).expect("a JSON report");
    assert_eq!(r["stop_reason"], "duration", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(r["ops"].as_u64() > Some(0), "{r}");
    assert!(r["tiering"].is_object(), "it ran on tiered memory: {r}");
}
