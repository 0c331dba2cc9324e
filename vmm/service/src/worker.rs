//! The service's side of one worker process: spawning it with its private
//! channel, sending commands and waiting (bounded) for their replies,
//! reading its events, and reaping it.
//!
//! The one place of the service with raw system calls: `dup2` in the child
//! between fork and exec, to place the channel at a known fd number.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command as Process, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vmm_core::liveness::proc_state;

use super::protocol::{encode, Command, FromWorker, Refusal, Reply, ToWorker, WorkerStart};

/// The fd number the channel has in the worker.
pub const CHANNEL_FD: i32 = 3;
/// Writes to a worker give up after this long.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Talking to a worker failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerLinkError {
    /// The process could not be started.
    #[error("starting the worker process {exe}")]
    Spawn {
        /// The executable.
        exe: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The channel failed (the worker is gone).
    #[error("the worker's channel")]
    Channel(#[source] std::io::Error),
    /// No reply in time.
    #[error("the worker did not answer within {0:?}")]
    Timeout(Duration),
    /// The worker refused the command (retryable or not).
    #[error("{0}")]
    Refused(Refusal),
}

type Pending = HashMap<u64, mpsc::Sender<Result<Reply, Refusal>>>;

/// A running worker.
#[derive(Debug)]
pub struct WorkerLink {
    writer: Mutex<UnixStream>,
    pending: Arc<Mutex<Pending>>,
    next_id: AtomicU64,
    child: Mutex<Child>,
    pid: u32,
    /// When the worker last sent a line (a reply or an event).
    last_heard: Arc<Mutex<Instant>>,
}

/// A request sent, its reply not yet read ([`WorkerLink::start`]).
pub struct PendingReply<'a> {
    link: &'a WorkerLink,
    id: u64,
    rx: mpsc::Receiver<Result<Reply, Refusal>>,
}

impl PendingReply<'_> {
    /// Waits up to `timeout` for the reply.
    pub fn wait(self, timeout: Duration) -> Result<Reply, WorkerLinkError> {
        let r = self.rx.recv_timeout(timeout);
        lock(&self.link.pending).remove(&self.id);
        match r {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(why)) => Err(WorkerLinkError::Refused(why)),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(WorkerLinkError::Timeout(timeout)),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(WorkerLinkError::Channel(
                std::io::Error::from(std::io::ErrorKind::BrokenPipe),
            )),
        }
    }
}

/// How a worker process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExitInfo {
    /// Its exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
}

impl From<ExitStatus> for ExitInfo {
    fn from(s: ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        Self {
            code: s.code(),
            signal: s.signal(),
        }
    }
}

impl WorkerLink {
    /// Starts `exe __worker` for `spec`, its stderr to `log` (opened for
    /// appending);
    /// `on_event` gets every event (from the reader thread), and `on_eof`
    /// once the channel closes.
    pub fn spawn(
        exe: &Path,
        spec: &WorkerStart,
        log: std::fs::File,
        on_event: impl Fn(FromWorker) + Send + 'static,
        on_eof: impl FnOnce() + Send + 'static,
    ) -> Result<Arc<Self>, WorkerLinkError> {
        let spawn_err = |source| WorkerLinkError::Spawn {
            exe: exe.display().to_string(),
            source,
        };
        let (ours, theirs) = UnixStream::pair().map_err(spawn_err)?;
        let stderr = log;
        let child_fd = theirs.as_raw_fd();
        let mut cmd = Process::new(exe);
        cmd.arg("__worker")
            .arg("--channel-fd")
            .arg(CHANNEL_FD.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr))
            // Its own process group: a terminal's Ctrl-C goes to the
            // service, which stops its VMs in order.
            .process_group(0);
        // SAFETY: runs in the child between fork and exec, where only
        // async-signal-safe calls are allowed: dup2 is one. It places the
        // channel (whose descriptor is open in the parent, so in the child)
        // at CHANNEL_FD without close-on-exec; every other descriptor of the
        // service keeps its close-on-exec flag.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(child_fd, CHANNEL_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(spawn_err)?;
        drop(theirs);
        let pid = child.id();
        ours.set_write_timeout(Some(WRITE_TIMEOUT))
            .map_err(WorkerLinkError::Channel)?;
        let reader = ours.try_clone().map_err(WorkerLinkError::Channel)?;
        let link = Arc::new(Self {
            writer: Mutex::new(ours),
            pending: Arc::new(Mutex::new(HashMap::new())),
            next_id: AtomicU64::new(1),
            child: Mutex::new(child),
            pid,
            last_heard: Arc::new(Mutex::new(Instant::now())),
        });
        link.send(&ToWorker::Start(Box::new(spec.clone())))?;
        let pending = link.pending.clone();
        let heard = link.last_heard.clone();
        std::thread::Builder::new()
            .name(format!("serve-{}", spec.id))
            .spawn(move || {
                super::confine(tiering::threads::ThreadRole::ServeReader);
                read_loop(reader, &pending, &heard, on_event, on_eof)
            })
            .map_err(WorkerLinkError::Channel)?;
        Ok(link)
    }

    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    fn send(&self, msg: &ToWorker) -> Result<(), WorkerLinkError> {
        let line = encode(msg).map_err(|e| WorkerLinkError::Channel(std::io::Error::other(e)))?;
        lock(&self.writer)
            .write_all(&line)
            .map_err(WorkerLinkError::Channel)
    }

    /// Sends `command` and waits up to `timeout` for the reply.
    pub fn request(&self, command: Command, timeout: Duration) -> Result<Reply, WorkerLinkError> {
        self.start(command)?.wait(timeout)
    }

    /// Sends `command`; the reply is waited for with [`PendingReply::wait`]
    /// (so one thread can ask many workers at once).
    pub fn start(&self, command: Command) -> Result<PendingReply<'_>, WorkerLinkError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        lock(&self.pending).insert(id, tx);
        if let Err(e) = self.send(&ToWorker::Request { id, command }) {
            lock(&self.pending).remove(&id);
            return Err(e);
        }
        Ok(PendingReply { link: self, id, rx })
    }

    /// How long the worker has sent nothing.
    pub fn silent_for(&self) -> Duration {
        lock(&self.last_heard).elapsed()
    }

    /// What `/proc` says the process is doing, when that explains its
    /// silence: stopped by a signal or a tracer, exited and not yet
    /// reaped, or a thread waiting uninterruptibly in the kernel (and
    /// where). `None` when it runs or sleeps as any busy process may, when
    /// `/proc` cannot say, or while a reap holds the process (the process
    /// is read only while it is ours and unreaped, so its pid is not
    /// another's).
    pub fn condition(&self) -> Option<String> {
        let mut child = self.child.try_lock().ok()?;
        if !matches!(child.try_wait(), Ok(None)) {
            return None;
        }
        process_condition(Path::new("/proc"), self.pid)
    }

    /// Kills the process (SIGKILL: works on a stopped process too); its
    /// reader reaps it when the channel closes.
    pub fn kill(&self) {
        let _ = lock(&self.child).kill();
    }

    /// Waits up to `timeout` for the process to end, then kills it (and
    /// waits for that, bounded too). `None` if it could not be reaped.
    pub fn reap(&self, timeout: Duration) -> Option<ExitInfo> {
        let mut child = lock(&self.child);
        let deadline = Instant::now() + timeout;
        loop {
            match child.try_wait() {
                Ok(Some(s)) => return Some(s.into()),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) => break,
                Err(_) => return None,
            }
        }
        let _ = child.kill();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(s)) = child.try_wait() {
                return Some(s.into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Whether the process has ended (reaping it if so).
    pub fn exited(&self) -> Option<ExitInfo> {
        lock(&self.child).try_wait().ok().flatten().map(Into::into)
    }
}

/// See [`WorkerLink::condition`]; `proc` is `/proc` (a copy in tests).
fn process_condition(proc: &Path, pid: u32) -> Option<String> {
    let dir = proc.join(pid.to_string());
    match proc_state(&dir.join("stat"))? {
        'T' => return Some("its process is stopped by a signal (SIGCONT resumes it)".into()),
        't' => return Some("its process is stopped by a tracer".into()),
        'Z' | 'X' => return Some("its process has exited".into()),
        _ => {}
    }
    let tasks = std::fs::read_dir(dir.join("task")).ok()?;
    let blocked = tasks
        .flatten()
        .map(|t| t.path())
        .find(|t| proc_state(&t.join("stat")) == Some('D'))?;
    let read = |f: &str| std::fs::read_to_string(blocked.join(f)).unwrap_or_default();
    let (wchan, comm) = (read("wchan"), read("comm"));
    let tid = blocked
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let at = match wchan.trim() {
        "" | "0" => String::new(),
        w => format!(" in {w}"),
    };
    Some(format!(
        "its thread {tid} ({}) waits uninterruptibly in the kernel{at}",
        comm.trim()
    ))
}

fn read_loop(
    stream: UnixStream,
    pending: &Mutex<Pending>,
    heard: &Mutex<Instant>,
    on_event: impl Fn(FromWorker),
    on_eof: impl FnOnce(),
) {
    let mut r = BufReader::new(stream);
    while let Ok(Some(line)) = crate::protocol::read_line(&mut r) {
        *lock(heard) = Instant::now();
        match serde_json::from_slice::<FromWorker>(&line) {
            Ok(FromWorker::Reply { id, result }) => {
                if let Some(tx) = lock(pending).remove(&id) {
                    let _ = tx.send(result);
                }
            }
            Ok(event) => on_event(event),
            Err(e) => tracing::warn!("a line from a worker that does not parse: {e}"),
        }
    }
    // Fail the requests still waiting.
    lock(pending).clear();
    on_eof();
}

/// Bounds glibc's malloc arenas to two: glibc gives each new thread an arena
/// of its own up to 8 per core, and memory freed in an arena stays there; the
/// service's threads come and go with VMs and API calls (per-VM readers,
/// the runtime's blocking pool), so without a bound its heap grows with the
/// number of threads that ever ran. Called once at start-up.
pub fn limit_heap_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; M_ARENA_MAX with a
    // positive value has no other effect.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Gives the heap's free memory back to the kernel (glibc keeps freed
/// memory of every thread's arena otherwise): called when a VM ends, so the
/// service's RSS returns to its baseline after many VMs came and went.
pub fn release_free_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions; it only returns free
    // memory of the allocator's arenas to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task of a fake process: `(tid, stat state, comm, wchan)`.
    type Task = (u32, char, &'static str, &'static str);

    /// A copy of `/proc/7` under `root` with the given process state and
    /// tasks.
    fn fake_proc(root: &Path, state: char, tasks: &[Task]) {
        let _ = std::fs::remove_dir_all(root);
        let dir = root.join("7");
        // A command with a parenthesis and a space, as a process may name itself.
        std::fs::create_dir_all(dir.join("task")).unwrap();
        std::fs::write(dir.join("stat"), format!("7 (a) b) {state} 1 7 7")).unwrap();
        for (tid, st, comm, wchan) in tasks {
            let t = dir.join("task").join(tid.to_string());
            std::fs::create_dir_all(&t).unwrap();
            std::fs::write(t.join("stat"), format!("{tid} ({comm}) {st} 1")).unwrap();
            std::fs::write(t.join("comm"), format!("{comm}\n")).unwrap();
            std::fs::write(t.join("wchan"), wchan).unwrap();
        }
    }

    #[test]
    fn the_condition_names_a_stopped_process_or_a_thread_stuck_in_the_kernel() {
        let cases: [(char, Vec<Task>, Option<&str>); 7] = [
            (
                'T',
                vec![],
                Some("its process is stopped by a signal (SIGCONT resumes it)"),
            ),
            ('t', vec![], Some("its process is stopped by a tracer")),
            ('Z', vec![], Some("its process has exited")),
            (
                'S',
                vec![(7, 'S', "tiervm", "0"), (9, 'R', "vcpu 0", "0")],
                None,
            ),
            (
                'S',
                vec![(7, 'S', "tiervm", "0"), (9, 'D', "vcpu 0", "hugetlb_fault")],
                Some("its thread 9 (vcpu 0) waits uninterruptibly in the kernel in hugetlb_fault"),
            ),
            (
                'D',
                vec![(7, 'D', "tiervm", "0")],
                Some("its thread 7 (tiervm) waits uninterruptibly in the kernel"),
            ),
            ('R', vec![], None),
        ];
        let root = std::env::temp_dir().join(format!("tiervm-proc-{}", std::process::id()));
        for (state, tasks, want) in cases {
            fake_proc(&root, state, &tasks);
            assert_eq!(
                process_condition(&root, 7).as_deref(),
                want,
                "state {state}, tasks {tasks:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(process_condition(&root, 7), None);
    }
}
