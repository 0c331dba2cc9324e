//! Directories and files a root service can trust: created or checked
//! (owner, mode, no symbolic link anywhere on the path), then used through
//! their descriptors only (`openat` with `O_NOFOLLOW`), so a local user
//! cannot plant a link or a directory that turns the service's writes
//! against another file (issue 32).
//!
//! The rules, for every directory the service writes in (the state
//! directory, its subdirectories, the socket's directory):
//! - every component of the path, from `/`, is a real directory (a
//!   symbolic link anywhere is refused: give the real path);
//! - every ancestor is owned by root or by the service's user, and is not
//!   writable by others unless it is sticky (`/tmp`): otherwise its owner
//!   or writers could rename the directory away and put another in its
//!   place;
//! - the directory itself is owned by the service's user and writable by
//!   nobody else (created `0700` when missing).
//!
//! Files in them are opened relative to the directory's descriptor with
//! `O_NOFOLLOW` (a link is refused with `ELOOP`).

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// A directory or file the service will not use.
#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {problem}: {fix}", path.display())]
pub struct UnsafePath {
    /// What it is for ("the state directory", ...).
    pub what: &'static str,
    /// The path.
    pub path: PathBuf,
    /// What is wrong.
    pub problem: String,
    /// What to do.
    pub fix: String,
}

fn cstr(name: &std::ffi::OsStr) -> std::io::Result<CString> {
    CString::new(name.as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
}

fn fstat(fd: RawFd) -> std::io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value; fstat only writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into `st`, which lives for the call.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: the entry itself, never
/// what a link points to; `None` if there is no such entry.
pub fn lstat_at(dir: &OwnedFd, name: &str) -> std::io::Result<Option<libc::stat>> {
    let c = cstr(std::ffi::OsStr::new(name))?;
    // SAFETY: as in `fstat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` lives for the call.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        return if e.kind() == std::io::ErrorKind::NotFound {
            Ok(None)
        } else {
            Err(e)
        };
    }
    Ok(Some(st))
}

/// `openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC, mode)`.
fn openat(dir: RawFd, name: &std::ffi::OsStr, flags: i32, mode: u32) -> std::io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: `c` is a valid C string; openat returns a new descriptor or -1.
    let fd = unsafe {
        libc::openat(
            dir,
            c.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens (creating, `mode`) a file in `dir` for writing, never through a
/// symbolic link; `append` or truncate.
pub fn create_file_at(dir: &OwnedFd, name: &str, append: bool, mode: u32) -> std::io::Result<File> {
    let flags = libc::O_WRONLY
        | libc::O_CREAT
        | if append {
            libc::O_APPEND
        } else {
            libc::O_TRUNC
        };
    let fd = openat(dir.as_raw_fd(), std::ffi::OsStr::new(name), flags, mode)?;
    Ok(File::from(fd))
}

/// Opens a file in `dir` for reading, never through a symbolic link, and
/// without blocking on a FIFO or a device.
pub fn open_read_at(dir: &OwnedFd, name: &str) -> std::io::Result<File> {
    let fd = openat(
        dir.as_raw_fd(),
        std::ffi::OsStr::new(name),
        libc::O_RDONLY | libc::O_NONBLOCK,
        0,
    )?;
    Ok(File::from(fd))
}

/// Writes `bytes` to `name` in `dir` atomically (a temporary file renamed
/// over it; neither followed if a link).
pub fn write_file_at(dir: &OwnedFd, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = format!(".{name}.tmp");
    let mut f = create_file_at(dir, &tmp, false, 0o600)?;
    f.write_all(bytes)?;
    drop(f);
    let (a, b) = (
        cstr(std::ffi::OsStr::new(&tmp))?,
        cstr(std::ffi::OsStr::new(name))?,
    );
    // SAFETY: both names are valid C strings; renameat only reads them.
    let r = unsafe { libc::renameat(dir.as_raw_fd(), a.as_ptr(), dir.as_raw_fd(), b.as_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Removes `name` from `dir` (a link itself, never its target).
pub fn remove_at(dir: &OwnedFd, name: &str) -> std::io::Result<()> {
    let c = cstr(std::ffi::OsStr::new(name))?;
    // SAFETY: `c` is a valid C string.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Who may own the service's directories: its user (and, for ancestors,
/// root).
fn owner_name(uid: u32) -> String {
    if uid == 0 {
        "root".into()
    } else {
        format!("uid {uid}")
    }
}

/// Opens directory `path` through real directories only, creating what is
/// missing (`0700`, or `mode` for the last component), and checks every
/// component (see the module's rules). `what` names it in errors.
pub fn open_private_dir(what: &'static str, path: &Path, mode: u32) -> Result<OwnedFd, UnsafePath> {
    let abs = std::path::absolute(path).map_err(|e| UnsafePath {
        what,
        path: path.into(),
        problem: format!("cannot be made absolute ({e})"),
        fix: "give an absolute path".into(),
    })?;
    let bad = |at: &Path, problem: String, fix: String| unsafe_path(what, at, problem, fix);
    let me = euid();
    let mut dir = open_root(what)?;
    let parts: Vec<Component<'_>> = abs.components().collect();
    let mut at = PathBuf::from("/");
    for (i, c) in parts.iter().enumerate() {
        let name = match c {
            Component::RootDir | Component::CurDir => continue,
            Component::ParentDir => {
                return Err(bad(
                    &abs,
                    "has a '..' component".into(),
                    "give the path without '..'".into(),
                ))
            }
            Component::Prefix(_) => continue,
            Component::Normal(n) => *n,
        };
        at.push(name);
        let last = i + 1 == parts.len();
        let m = if last { mode } else { 0o700 };
        let opened = open_or_create(what, &dir, name, &at, m)?;
        let st = fstat(opened.as_raw_fd())
            .map_err(|e| bad(&at, format!("cannot be read ({e})"), "check it".into()))?;
        if last {
            check_last(what, &st, &at, me)?;
        } else {
            check_ancestor(what, &st, &at, me)?;
        }
        dir = opened;
    }
    Ok(dir)
}

/// An [`UnsafePath`] about `at`.
fn unsafe_path(what: &'static str, at: &Path, problem: String, fix: String) -> UnsafePath {
    UnsafePath {
        what,
        path: at.to_path_buf(),
        problem,
        fix,
    }
}

/// Opens `/`, where every walk starts.
fn open_root(what: &'static str) -> Result<OwnedFd, UnsafePath> {
    let root = CString::new("/").unwrap_or_default();
    // SAFETY: a valid C string; open returns a new descriptor or -1.
    let fd = unsafe {
        libc::open(
            root.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(unsafe_path(
            what,
            Path::new("/"),
            format!("cannot be opened ({})", std::io::Error::last_os_error()),
            "check the host".into(),
        ));
    }
    // SAFETY: just returned by open, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens directory `name` (at path `at`) in `dir` without following a
/// link, creating it with `mode` when it is missing.
fn open_or_create(
    what: &'static str,
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    at: &Path,
    mode: u32,
) -> Result<OwnedFd, UnsafePath> {
    let bad = |problem: String, fix: String| unsafe_path(what, at, problem, fix);
    let flags = libc::O_RDONLY | libc::O_DIRECTORY;
    match openat(dir.as_raw_fd(), name, flags, 0) {
        Ok(fd) => Ok(fd),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let c = cstr(name).map_err(|e| bad(e.to_string(), "rename it".into()))?;
            // SAFETY: `c` is a valid C string.
            if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::AlreadyExists {
                    return Err(bad(
                        format!("cannot be created ({e})"),
                        "create it, owned by the service's user, mode 0700".into(),
                    ));
                }
            }
            openat(dir.as_raw_fd(), name, flags, 0)
                .map_err(|e| bad(format!("cannot be opened ({e})"), "check it".into()))
        }
        Err(e)
            if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            let link = lstat_at(dir, &name.to_string_lossy())
                .ok()
                .flatten()
                .is_some_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFLNK);
            Err(if link {
                bad(
                    "is a symbolic link: the service follows no link on the path of its directories".into(),
                    "give the real path (readlink -f), or replace the link with a directory".into(),
                )
            } else {
                bad(
                    "is not a directory".into(),
                    "remove it, or give another path".into(),
                )
            })
        }
        Err(e) => Err(bad(
            format!("cannot be opened ({e})"),
            "check its permissions".into(),
        )),
    }
}

/// The directory itself (`st`, at `at`): owned by the service's user `me`
/// and writable by nobody else.
fn check_last(what: &'static str, st: &libc::stat, at: &Path, me: u32) -> Result<(), UnsafePath> {
    if st.st_uid != me {
        return Err(unsafe_path(
            what,
            at,
            format!(
                "is owned by {}, not by the service's user ({})",
                owner_name(st.st_uid),
                owner_name(me)
            ),
            format!(
                "remove it (the service creates it) or chown it to {} and chmod it 0700",
                owner_name(me)
            ),
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(unsafe_path(
            what,
            at,
            format!(
                "is writable by its group or others (mode {:04o})",
                st.st_mode & 0o7777
            ),
            "chmod go-w it (0700), or remove it and let the service create it".into(),
        ));
    }
    Ok(())
}

/// An ancestor (`st`, at `at`): owned by root or the service's user `me`,
/// and writable by nobody else unless sticky.
fn check_ancestor(
    what: &'static str,
    st: &libc::stat,
    at: &Path,
    me: u32,
) -> Result<(), UnsafePath> {
    if st.st_uid != 0 && st.st_uid != me {
        return Err(unsafe_path(
            what,
            at,
            format!(
                "is owned by {}: its owner could replace what lies below it",
                owner_name(st.st_uid)
            ),
            if me == 0 {
                "put the service's directories under directories owned by root".to_string()
            } else {
                format!(
                    "put the service's directories under directories owned by root or {}",
                    owner_name(me)
                )
            },
        ));
    }
    let others_write = st.st_mode & 0o022 != 0;
    let sticky = st.st_mode & libc::S_ISVTX != 0;
    if others_write && !sticky {
        return Err(unsafe_path(
            what,
            at,
            format!(
                "is writable by its group or others and not sticky (mode {:04o}): they could replace what lies below it",
                st.st_mode & 0o7777
            ),
            "chmod go-w it, or put the service's directories elsewhere".into(),
        ));
    }
    Ok(())
}

/// Opens (creating) subdirectory `name` of the checked directory `parent`
/// with the same checks.
pub fn open_private_subdir(
    what: &'static str,
    parent: &Path,
    name: &str,
) -> Result<OwnedFd, UnsafePath> {
    open_private_dir(what, &parent.join(name), 0o700)
}

/// Sets the mode and, optionally, the group of the directory `dir`.
pub fn set_dir_access(dir: &OwnedFd, mode: u32, gid: Option<u32>) -> std::io::Result<()> {
    if let Some(g) = gid {
        // SAFETY: fchown on an open descriptor; -1 leaves the owner.
        if unsafe { libc::fchown(dir.as_raw_fd(), u32::MAX, g) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: fchmod on an open descriptor.
    if unsafe { libc::fchmod(dir.as_raw_fd(), mode as libc::mode_t) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Sets the mode and group of `name` in `dir` (the socket: never
/// through a link).
pub fn set_access_at(
    dir: &OwnedFd,
    name: &str,
    mode: u32,
    gid: Option<u32>,
) -> std::io::Result<()> {
    let c = cstr(std::ffi::OsStr::new(name))?;
    if let Some(g) = gid {
        // SAFETY: a valid C string; AT_SYMLINK_NOFOLLOW changes the entry itself.
        if unsafe {
            libc::fchownat(
                dir.as_raw_fd(),
                c.as_ptr(),
                u32::MAX,
                g,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        } != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: a valid C string (fchmodat does not follow a socket: it is
    // not a link, checked by the caller who just bound it in its own
    // directory).
    if unsafe { libc::fchmodat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A group by name or number.
pub fn group_id(group: &str) -> Option<u32> {
    if let Ok(n) = group.parse::<u32>() {
        return Some(n);
    }
    let c = CString::new(group).ok()?;
    let mut buf = vec![0u8; 16 << 10];
    // SAFETY: an all-zero `group` is a valid value; getgrnam_r fills it.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; `buf` outlives it.
    let r = unsafe {
        libc::getgrnam_r(
            c.as_ptr(),
            &mut grp,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut out,
        )
    };
    (r == 0 && !out.is_null()).then_some(grp.gr_gid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tiervm-paths-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    #[test]
    fn files_are_never_opened_through_a_link() {
        let d = temp("nofollow");
        let dir = open_private_dir("test dir", &d.join("state"), 0o700).unwrap();
        let target = d.join("target");
        std::fs::write(&target, "precious").unwrap();
        std::os::unix::fs::symlink(&target, d.join("state/vm-1.json")).unwrap();
        let e = create_file_at(&dir, "vm-1.json", false, 0o600).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        let e = create_file_at(&dir, "vm-1.json", true, 0o600).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        assert!(open_read_at(&dir, "vm-1.json").is_err());
        // An atomic write replaces the link itself, never its target.
        write_file_at(&dir, "vm-1.json", b"report").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
        assert_eq!(
            std::fs::read_to_string(d.join("state/vm-1.json")).unwrap(),
            "report"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn links_and_open_directories_on_the_path_are_refused() {
        let d = temp("links");
        std::fs::create_dir(d.join("real")).unwrap();
        std::os::unix::fs::symlink(d.join("real"), d.join("link")).unwrap();
        let e = open_private_dir("the state directory", &d.join("link/state"), 0o700).unwrap_err();
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        assert_eq!(e.path, d.join("link"));
        let e = open_private_dir("the state directory", &d.join("link"), 0o700).unwrap_err();
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        std::fs::create_dir(d.join("open")).unwrap();
        std::fs::set_permissions(d.join("open"), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = open_private_dir("the state directory", &d.join("open"), 0o700).unwrap_err();
        assert!(
            e.to_string().contains("writable by its group or others"),
            "{e}"
        );
        let e = open_private_dir("the state directory", &d.join("open/state"), 0o700).unwrap_err();
        assert!(e.to_string().contains("not sticky"), "{e}");
        // Created when missing, 0700.
        open_private_dir("the state directory", &d.join("new/state"), 0o700).unwrap();
        let m = std::fs::metadata(d.join("new/state"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(m & 0o777, 0o700);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// An ancestor owned by another user is refused; a root service's fix
    /// names root once (it said "owned by root or root").
    #[test]
    fn an_ancestor_of_another_user_is_refused_in_plain_words() {
        if euid() != 0 {
            return; // chown needs root
        }
        let d = temp("owner");
        std::fs::create_dir(d.join("theirs")).unwrap();
        std::os::unix::fs::chown(d.join("theirs"), Some(65534), Some(65534)).unwrap();
        let e =
            open_private_dir("the state directory", &d.join("theirs/state"), 0o700).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("its owner could replace"), "{text}");
        assert!(
            text.contains("owned by root") && !text.contains("root or root"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
