//! What a run needs from the host's permissions, checked before anything is
//! set up, with errors that name the missing permission and the fix.
//!
//! tiervm needs no root and no capability (docs/host-requirements.md, "Running
//! as an ordinary user"): read-write access to `/dev/kvm` for every run, and
//! for tiered runs a userfaultfd that also reports kernel-mode faults (KVM
//! touches guest RAM from the kernel), obtained from `/dev/userfaultfd`
//! (read-write access) or from the `userfaultfd(2)` system call (root,
//! `CAP_SYS_PTRACE`, or `vm.unprivileged_userfaultfd=1`). This module only
//! reads: device nodes' owner and mode, `/etc/group`, `/proc/self/status`
//! and the sysctl; it never changes a setting.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use tiering::host::{self, Availability, UserfaultfdFacts, DEV_USERFAULTFD};

/// The KVM device node.
pub const DEV_KVM: &str = "/dev/kvm";

/// Who may open a device node, and who this process is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAccess {
    /// The node's path.
    pub path: String,
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
    /// Permission bits (`0o777` part of `st_mode`).
    pub mode: u32,
    /// The group's name from `/etc/group`, if listed.
    pub group: Option<String>,
    /// The owner's name from `/etc/passwd`, if listed.
    pub owner: Option<String>,
    /// Whether this process has the node's group (primary or supplementary).
    pub in_group: bool,
}

impl NodeAccess {
    /// Reads `path`'s owner and mode and this process's groups; `None` if the
    /// node cannot be examined (then it does not exist).
    pub fn of(path: &str) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        let (gid, groups) = process_groups();
        Some(Self {
            path: path.to_string(),
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode() & 0o777,
            group: name_of(Path::new("/etc/group"), meta.gid()),
            owner: name_of(Path::new("/etc/passwd"), meta.uid()),
            in_group: gid == Some(meta.gid()) || groups.contains(&meta.gid()),
        })
    }

    fn owner_group(&self) -> String {
        let owner = self.owner.clone().unwrap_or_else(|| self.uid.to_string());
        let group = self.group.clone().unwrap_or_else(|| self.gid.to_string());
        format!("{owner}:{group}")
    }

    /// How to let an ordinary user open this node (`kernel_name` is the
    /// node's name in udev rules). Running as root is the caller's to add.
    pub fn grant_fix(&self, kernel_name: &str) -> String {
        let group_rw = self.mode & 0o060 == 0o060;
        let group = self.group.clone().unwrap_or_else(|| self.gid.to_string());
        let desc = format!(
            "{} is {} mode {:04o}",
            self.path,
            self.owner_group(),
            self.mode
        );
        if group_rw && self.gid != 0 {
            if self.in_group {
                format!(
                    "{desc} and this process is in group {group}, yet the open was refused: \
                     a security module (SELinux, AppArmor) or an ACL denies it; check the audit log"
                )
            } else {
                format!(
                    "{desc}: add the user to group {group} (usermod -aG {group} $USER, then log in again)"
                )
            }
        } else {
            format!(
                "{desc}, so only {} may open it: give group kvm read-write access (e.g. the udev rule \
                 KERNEL==\"{kernel_name}\", GROUP=\"kvm\", MODE=\"0660\") and add the user to group kvm \
                 (usermod -aG kvm $USER, then log in again)",
                self.owner.clone().unwrap_or_else(|| format!("uid {}", self.uid))
            )
        }
    }
}

/// This process's real gid and supplementary groups, from `/proc/self/status`.
fn process_groups() -> (Option<u32>, Vec<u32>) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> Vec<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|rest| {
                rest.split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    (field("Gid:").first().copied(), field("Groups:"))
}

/// The name of numeric id `id` in a `name:x:id:...` file (`/etc/group`, `/etc/passwd`).
fn name_of(file: &Path, id: u32) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        let _password = f.next()?;
        (f.next()?.parse::<u32>().ok()? == id).then(|| name.to_string())
    })
}

/// The error of a failed `/dev/kvm` open, naming the fix.
pub fn kvm_open_error(err: &io::Error) -> String {
    match Availability::from_io_error(err) {
        Availability::Ok => format!("cannot open {DEV_KVM}: {err}"),
        Availability::Absent => format!(
            "cannot open {DEV_KVM}: no such device ({err}): load the KVM module (modprobe kvm_intel, \
             kvm_amd or kvm_pvm) or enable virtualization in the firmware (`tiervm info` shows what \
             this host offers)"
        ),
        Availability::PermissionDenied => {
            let fix = NodeAccess::of(DEV_KVM).map_or_else(
                || "run as a user with read-write access to /dev/kvm (usually group kvm)".into(),
                |n| n.grant_fix("kvm"),
            );
            format!("cannot open {DEV_KVM}: permission denied: {fix}; or run as root")
        }
        Availability::Failed { message } => {
            format!("cannot open {DEV_KVM}: {message}: check dmesg for KVM errors")
        }
    }
}

/// Why tiered memory cannot get a userfaultfd, naming the fix; `None` when a
/// userfaultfd can be created.
pub fn userfaultfd_error(facts: &UserfaultfdFacts, dev: Option<&NodeAccess>) -> Option<String> {
    if facts.usable() {
        return None;
    }
    let untiered = "(--policy none runs untiered, without userfaultfd)";
    let denied = Availability::PermissionDenied;
    if facts.dev_userfaultfd != denied && facts.syscall != denied {
        if facts.dev_userfaultfd == Availability::Absent && facts.syscall == Availability::Absent {
            return Some(format!(
                "userfaultfd: not available: this kernel is built without userfaultfd; tiered guest RAM \
                 needs Linux >= 6.8 with CONFIG_USERFAULTFD {untiered}"
            ));
        }
        return facts
            .api_error
            .as_ref()
            .map(|e| format!("userfaultfd: {e} {untiered}"));
    }
    let sysctl = facts
        .unprivileged_userfaultfd
        .map_or_else(|| "unreadable".to_string(), |v| v.to_string());
    let device = match (&facts.dev_userfaultfd, dev) {
        (Availability::PermissionDenied, Some(n)) => n.grant_fix("userfaultfd"),
        (Availability::Absent, _) => format!("{DEV_USERFAULTFD} does not exist (Linux < 6.1)"),
        (a, _) => format!("{DEV_USERFAULTFD}: {}", a.describe()),
    };
    Some(format!(
        "userfaultfd: permission denied: tiered guest RAM needs a userfaultfd that also sees KVM's \
         kernel-mode accesses, from {DEV_USERFAULTFD} (read-write access) or from the userfaultfd(2) \
         system call (root or CAP_SYS_PTRACE while vm.unprivileged_userfaultfd is {sysctl}). Fix one: \
         {device}; or have an administrator set vm.unprivileged_userfaultfd=1 (machine-wide); or run \
         as root {untiered}"
    ))
}

/// A host permission a run needs and this process lacks; the message names
/// it and the fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MissingPermission {
    /// `/dev/kvm` cannot be opened read-write.
    #[error("{0}")]
    Kvm(String),
    /// No userfaultfd can be created (tiered runs).
    #[error("{0}")]
    Userfaultfd(String),
}

/// The host permissions a run lacks (at least one), each with its fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PermissionError {
    /// What is missing, `/dev/kvm` first.
    pub missing: Vec<MissingPermission>,
}

impl std::fmt::Display for PermissionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.missing.as_slice() {
            [one] => write!(f, "{one}"),
            all => {
                write!(f, "this run lacks {} host permissions:", all.len())?;
                for m in all {
                    write!(f, "\n  - {m}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for PermissionError {}

/// Checks that this process may do what a run needs: open `/dev/kvm`, and
/// (`tiered`) create a userfaultfd. Every missing permission is named in one
/// error, each with its fix.
pub fn check_run(tiered: bool) -> Result<(), PermissionError> {
    let mut missing = Vec::new();
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(DEV_KVM)
    {
        missing.push(MissingPermission::Kvm(kvm_open_error(&e)));
    }
    if tiered {
        let facts = host::userfaultfd();
        let dev = NodeAccess::of(DEV_USERFAULTFD);
        if let Some(e) = userfaultfd_error(&facts, dev.as_ref()) {
            missing.push(MissingPermission::Userfaultfd(e));
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(PermissionError { missing })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(mode: u32, gid: u32, group: Option<&str>, in_group: bool) -> NodeAccess {
        NodeAccess {
            path: DEV_KVM.into(),
            uid: 0,
            gid,
            mode,
            group: group.map(str::to_string),
            owner: Some("root".into()),
            in_group,
        }
    }

    #[test]
    fn grant_fix_names_the_group_or_the_udev_rule() {
        let fix = node(0o660, 108, Some("kvm"), false).grant_fix("kvm");
        assert!(fix.contains("root:kvm mode 0660"), "{fix}");
        assert!(
            fix.contains("add the user to group kvm (usermod -aG kvm $USER"),
            "{fix}"
        );
        let fix = node(0o600, 0, Some("root"), false).grant_fix("kvm");
        assert!(
            fix.contains("root:root mode 0600, so only root may open it"),
            "{fix}"
        );
        assert!(
            fix.contains("KERNEL==\"kvm\", GROUP=\"kvm\", MODE=\"0660\""),
            "{fix}"
        );
        let fix = node(0o660, 0, Some("root"), false).grant_fix("userfaultfd");
        assert!(
            fix.contains("KERNEL==\"userfaultfd\""),
            "group root is no fix: {fix}"
        );
        let fix = node(0o660, 108, None, true).grant_fix("kvm");
        assert!(
            fix.contains("group 108") && fix.contains("security module"),
            "{fix}"
        );
    }

    #[test]
    fn kvm_errors_say_what_is_missing() {
        let absent = kvm_open_error(&io::Error::from_raw_os_error(libc::ENOENT));
        assert!(absent.contains("no such device") && absent.contains("load the KVM module"));
        let denied = kvm_open_error(&io::Error::from_raw_os_error(libc::EACCES));
        assert!(
            denied.starts_with("cannot open /dev/kvm: permission denied: "),
            "{denied}"
        );
    }

    fn facts(dev: Availability, syscall: Availability) -> UserfaultfdFacts {
        UserfaultfdFacts {
            dev_userfaultfd: dev,
            syscall,
            unprivileged_userfaultfd: Some(0),
            api: None,
            api_error: Some("no userfaultfd".into()),
        }
    }

    #[test]
    fn userfaultfd_errors_say_what_is_missing() {
        let dev = node(0o600, 0, Some("root"), false);
        let e = userfaultfd_error(
            &facts(
                Availability::PermissionDenied,
                Availability::PermissionDenied,
            ),
            Some(&dev),
        )
        .unwrap();
        assert!(e.starts_with("userfaultfd: permission denied: "), "{e}");
        assert!(e.contains("vm.unprivileged_userfaultfd is 0"), "{e}");
        assert!(e.contains("KERNEL==\"userfaultfd\""), "the device fix: {e}");
        assert!(e.contains("--policy none"), "{e}");
        let e = userfaultfd_error(
            &facts(Availability::Absent, Availability::PermissionDenied),
            None,
        )
        .unwrap();
        assert!(e.contains("/dev/userfaultfd does not exist"), "{e}");
        let e =
            userfaultfd_error(&facts(Availability::Absent, Availability::Absent), None).unwrap();
        assert!(e.contains("built without userfaultfd"), "{e}");
    }

    #[test]
    fn one_or_all_missing_permissions_in_one_message() {
        let one = PermissionError {
            missing: vec![MissingPermission::Kvm("cannot open /dev/kvm: x".into())],
        };
        assert_eq!(one.to_string(), "cannot open /dev/kvm: x");
        let two = PermissionError {
            missing: vec![
                MissingPermission::Kvm("a".into()),
                MissingPermission::Userfaultfd("b".into()),
            ],
        };
        assert_eq!(
            two.to_string(),
            "this run lacks 2 host permissions:\n  - a\n  - b"
        );
    }

    #[test]
    fn names_come_from_the_id_files() {
        assert_eq!(name_of(Path::new("/etc/group"), 0).as_deref(), Some("root"));
        assert_eq!(name_of(Path::new("/nonexistent"), 0), None);
        let (gid, _) = process_groups();
        assert!(gid.is_some());
    }
}
