//! `tiervm serve`: the host-side memory-expander service. It shares the
//! host's fast and slow capacity among many VMs, one supervised worker
//! process per VM (`commands::worker`), and is driven over a REST API on a
//! Unix socket (docs/service.md).
//!
//! ```text
//!  client (curl, tiervm ctl) --HTTP/1.1, Unix socket 0600--> api (axum, utoipa)
//!                                                              |
//!  rebalancer thread: stats every 1 s, division every period --+--> host (pools, VMs,
//!                                                                    admission)
//!                                         worker link (socketpair, JSON lines)
//!                                                                      |
//!                               tiervm __worker (one process per VM: runner, tiering)
//! ```

pub mod api;
pub mod client;
pub mod config;
pub mod conn;
pub mod division;
pub mod host;
pub mod host_error;
pub mod metrics;
pub mod modeled;
pub mod paths;
pub mod placement_policy;
pub mod protocol;
pub mod records;
pub mod types;
pub mod vm_process;
pub mod worker;

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use self::api::AppState;
use self::config::{ServeConfig, ServeConfigError};
use self::host::Host;

/// The service could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A setting is invalid.
    #[error(transparent)]
    Config(#[from] ServeConfigError),
    /// The socket or a directory could not be set up.
    #[error("{what} {path}")]
    Setup {
        /// What.
        what: &'static str,
        /// Where.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A directory or file the service would not trust.
    #[error(transparent)]
    UnsafePath(#[from] paths::UnsafePath),
    /// Another service holds the state directory's lock.
    #[error("another tiervm serve (pid {pid}) uses the state directory {dir}: stop it, or give another --state-dir")]
    StateDirInUse {
        /// The directory.
        dir: String,
        /// The holder's pid, as it wrote it.
        pid: String,
    },
    /// Another service listens on the socket.
    #[error("another tiervm serve listens on {0}: stop it, or give another --socket")]
    InUse(String),
    /// The async runtime could not start.
    #[error("starting the runtime")]
    Runtime(#[source] std::io::Error),
    /// The worker mode failed.
    #[error(transparent)]
    Worker(#[from] crate::vm_process::WorkerError),
    /// A `tiervm ctl` request failed.
    #[error(transparent)]
    Client(#[from] client::ClientError),
    /// The seccomp filters could not be prepared.
    #[error("preparing the service's seccomp filters")]
    Seccomp(#[source] vmm_core::seccomp::SeccompError),
}

impl ServeError {
    /// Whether the user's input is at fault.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Self::Config(_) | Self::InUse(_) | Self::UnsafePath(_) | Self::StateDirInUse { .. }
        )
    }
}

fn setup<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ServeError + 'a {
    move |source| ServeError::Setup {
        what,
        path: path.display().to_string(),
        source,
    }
}

/// The checked directories of the service (docs/service.md, "Files").
pub struct StateDirs {
    /// The state directory (its lock, the service's record).
    pub root: std::os::fd::OwnedFd,
    /// VM logs and records.
    pub vms: std::os::fd::OwnedFd,
    /// Run reports.
    pub reports: std::os::fd::OwnedFd,
    /// `STATE_DIR/lock`, locked (`flock`) for the service's life: a
    /// second service on the same state directory refuses to start.
    pub lock: std::fs::File,
}

/// Opens (creating) the state directory and its subdirectories, each
/// checked (docs/service.md: owner, mode, no link on the path).
pub fn open_state_dirs(state_dir: &Path) -> Result<StateDirs, ServeError> {
    let root = paths::open_private_dir("the state directory", state_dir, 0o700)?;
    let lock = lock_state_dir(&root, state_dir)?;
    let vms = paths::open_private_subdir("the VM log directory", state_dir, "vms")?;
    let reports = paths::open_private_subdir("the report directory", state_dir, "reports")?;
    Ok(StateDirs {
        root,
        vms,
        reports,
        lock,
    })
}

/// Locks `STATE_DIR/lock` (held until the service exits; the kernel
/// releases it if the service dies) and writes the service's pid in it.
fn lock_state_dir(
    root: &std::os::fd::OwnedFd,
    state_dir: &Path,
) -> Result<std::fs::File, ServeError> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let path = state_dir.join("lock");
    let mut f = paths::create_file_at(root, "lock", true, 0o600)
        .map_err(setup("opening the lock file", &path))?;
    // SAFETY: flock on an open descriptor.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let mut pid = String::new();
            let _ = paths::open_read_at(root, "lock").map(|mut r| r.read_to_string(&mut pid));
            return Err(ServeError::StateDirInUse {
                dir: state_dir.display().to_string(),
                pid: pid.trim().to_string(),
            });
        }
        return Err(setup("locking", &path)(e));
    }
    f.set_len(0).map_err(setup("writing", &path))?;
    let _ = f.seek(std::io::SeekFrom::Start(0));
    writeln!(f, "{}", std::process::id()).map_err(setup("writing", &path))?;
    Ok(f)
}

/// Binds the API socket (mode `socket_mode`, group `socket_group`) in its
/// checked directory; refuses a socket another service answers on, and
/// anything at the path that is not a socket.
fn bind_socket(cfg: &ServeConfig) -> Result<std::os::unix::net::UnixListener, ServeError> {
    let path = &cfg.socket;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| {
            ServeError::Config(ServeConfigError::OutOfRange(format!(
                "socket {}: give the path of a socket file",
                path.display()
            )))
        })?;
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let gid = match &cfg.socket_group {
        None => None,
        Some(g) => Some(paths::group_id(g).ok_or_else(|| {
            ServeError::Config(ServeConfigError::OutOfRange(format!(
                "socket_group '{g}' is not a group of this host: give a group name or number"
            )))
        })?),
    };
    // The directory: the owner's only, or with the socket's group let in
    // to reach the socket (search only).
    let dir_mode = if gid.is_some() { 0o710 } else { 0o700 };
    let dir = paths::open_private_dir("the socket's directory", parent, dir_mode)?;
    if gid.is_some() {
        paths::set_dir_access(&dir, dir_mode, gid)
            .map_err(setup("setting the group of", parent))?;
    }
    match paths::lstat_at(&dir, &name).map_err(setup("checking", path))? {
        None => {}
        Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFSOCK => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ServeError::InUse(path.display().to_string()));
            }
            paths::remove_at(&dir, &name).map_err(setup("removing the stale socket", path))?;
        }
        Some(_) => {
            return Err(paths::UnsafePath {
                what: "the socket",
                path: path.clone(),
                problem: "exists and is not a socket (a file, a link or a directory)".into(),
                fix: "remove it, or give another --socket".into(),
            }
            .into())
        }
    }
    let l = std::os::unix::net::UnixListener::bind(path).map_err(setup("binding", path))?;
    // The directory (the owner's, writable by nobody else) closes the
    // window between bind and chmod.
    paths::set_access_at(&dir, &name, cfg.socket_mode, gid)
        .map_err(setup("setting the mode of", path))?;
    l.set_nonblocking(true)
        .map_err(setup("configuring", path))?;
    Ok(l)
}

/// Whether the service's threads (and its VMs') install seccomp filters.
static SECCOMP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the service runs with seccomp filters.
pub fn seccomp_on() -> bool {
    SECCOMP.load(std::sync::atomic::Ordering::Acquire)
}

/// Installs `role`'s seccomp filter on the calling service thread (first
/// thing in the thread), when the service runs with filters. A thread that
/// cannot install its filter says so and runs on (the filters compiled at
/// start-up, so this is not expected).
pub fn confine(role: tiering::threads::ThreadRole) {
    if !seccomp_on() {
        return;
    }
    if let Err(e) = vmm_core::seccomp::install(role) {
        tracing::error!("{}", vmm_core::exit::chain(&e));
        eprintln!("tiervm serve: {}", vmm_core::exit::chain(&e));
    }
}

/// Runs the service until SIGTERM or SIGINT; returns the exit code.
/// `seccomp`: its rebalancer, channel readers and report collector, and
/// every VM's threads, install seccomp filters (docs/security.md).
///
/// Stopping waits at most the stop grace plus [`SHUTDOWN_SLACK`] for the VMs.
pub fn run(cfg: ServeConfig, seccomp: bool) -> Result<i32, ServeError> {
    worker::limit_heap_arenas();
    if seccomp {
        vmm_core::seccomp::prepare().map_err(ServeError::Seccomp)?;
        SECCOMP.store(true, std::sync::atomic::Ordering::Release);
    }
    let dirs = open_state_dirs(&cfg.state_dir)?;
    let listener = bind_socket(&cfg)?;
    let host = Host::with_dirs(cfg, dirs);
    host.start_records();
    let socket = host.cfg.socket.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(64)
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    let h = host.clone();
    let rebalancer = spawn_confined(
        "serve-rebalance",
        tiering::threads::ThreadRole::ServeRebalance,
        move || h.run_rebalancer(),
    )?;
    let h = host.clone();
    let collector = spawn_confined(
        "serve-reports",
        tiering::threads::ThreadRole::ServeReports,
        move || h.run_report_collector(),
    )?;
    announce(&host.cfg);
    let state = AppState {
        host: host.clone(),
        openapi: Arc::new(OnceLock::new()),
        metrics: Arc::new(metrics::ApiMetrics::default()),
    };
    let metrics_router = api::metrics_router(state.clone());
    let metrics_listener = bind_metrics(host.cfg.metrics_listen)?;
    let (router, _doc) = api::router(state);
    let served = host.clone();
    let result = rt.block_on(async move {
        let listener =
            tokio::net::UnixListener::from_std(listener).map_err(setup("listening on", &socket))?;
        let server = tokio::spawn(conn::serve_unix(listener, router));
        let metrics_server = match metrics_listener {
            Some(l) => {
                let l = tokio::net::TcpListener::from_std(l).map_err(ServeError::Runtime)?;
                Some(tokio::spawn(conn::serve_tcp(l, metrics_router)))
            }
            None => None,
        };
        wait_for_stop_signal().await;
        eprintln!("tiervm serve: stopping the VMs");
        stop_vms(&host).await;
        server.abort();
        if let Some(m) = metrics_server {
            m.abort();
        }
        let _ = std::fs::remove_file(&socket);
        Ok::<_, ServeError>(0)
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    let _ = rebalancer.join();
    served.stop_report_collector();
    let _ = collector.join();
    eprintln!("tiervm serve: stopped");
    result
}

/// Spawns the service thread `name`, confined to `role` (when seccomp is on).
fn spawn_confined<T: Send + 'static>(
    name: &str,
    role: tiering::threads::ThreadRole,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<std::thread::JoinHandle<T>, ServeError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            confine(role);
            f()
        })
        .map_err(ServeError::Runtime)
}

/// Says where the service listens and what its pools are.
fn announce(cfg: &ServeConfig) {
    eprintln!(
        "tiervm serve: listening on {} (fast pool {} on node {}, slow pool {} on node {}{})",
        cfg.socket.display(),
        vmm_core::units::format_size(cfg.fast_pool),
        cfg.fast_node,
        vmm_core::units::format_size(cfg.slow_pool),
        cfg.slow_node,
        if cfg.emulated {
            "; one node: tiers emulated, latency differences not real"
        } else {
            ""
        }
    );
}

/// Binds the metrics address, if one is configured (non-blocking, for tokio).
fn bind_metrics(
    addr: Option<std::net::SocketAddr>,
) -> Result<Option<std::net::TcpListener>, ServeError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let l = std::net::TcpListener::bind(addr).map_err(|source| ServeError::Setup {
        what: "binding the metrics address",
        path: addr.to_string(),
        source,
    })?;
    l.set_nonblocking(true)
        .map_err(|source| ServeError::Setup {
            what: "configuring the metrics address",
            path: addr.to_string(),
            source,
        })?;
    eprintln!("tiervm serve: metrics on http://{addr}/metrics");
    Ok(Some(l))
}

/// Stops the VMs, waiting at most their stop grace plus [`SHUTDOWN_SLACK`].
async fn stop_vms(host: &Arc<Host>) {
    // On a thread of its own: the blocking pool may be full of
    // requests, and shutdown must not queue behind them. `shutdown`
    // bounds its own waits; this deadline covers the state lock too.
    let h = host.clone();
    let deadline = host.cfg.defaults.stop_grace + SHUTDOWN_SLACK;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("serve-shutdown".into())
        .spawn(move || {
            h.shutdown();
            let _ = done_tx.send(());
        });
    if spawned.is_err() || tokio::time::timeout(deadline, done_rx).await.is_err() {
        eprintln!(
            "tiervm serve: the VMs did not all stop within {} s; leaving the rest",
            deadline.as_secs()
        );
    }
}

/// Time beyond the VMs' stop grace that stopping the service may take (the
/// host's own shutdown allows 20 s of it).
const SHUTDOWN_SLACK: Duration = Duration::from_secs(30);

async fn wait_for_stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut int = signal(SignalKind::interrupt()).ok();
    tokio::select! {
        _ = async { match &mut term { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {}
        _ = async { match &mut int { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {}
    }
}
