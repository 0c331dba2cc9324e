//! The connections of the API socket and of the metrics listener: accepted
//! without ever blocking the accept loop, bounded per client and in total
//! so that one local user cannot starve the service (issue 32, defect 6).
//!
//! - A client is a peer uid: on the Unix socket from `SO_PEERCRED`, on TCP
//!   from the kernel's socket table when the peer is on this host (a
//!   `sock_diag` lookup of the peer's socket: local users share loopback
//!   addresses and may pick any of 127/8), else the source address. A
//!   client holds at most `per_client` connections: its
//!   next one closes its own oldest idle connection, or is refused with a
//!   JSON 429 when all of them are in a request.
//! - In all, at most `total` connections: when full, a new connection closes
//!   the oldest idle connection of the client that holds the most, so a
//!   new client always gets in while any connection is idle (only when
//!   every connection is in a request is it refused, 503). A connection is
//!   idle while no request is in progress on it: a client that sends its
//!   request right after connecting is the newest and the last one closed.
//! - Every connection must send its request headers within
//!   [`HEADER_TIMEOUT`] of connecting or of its last response (hyper's
//!   header read timeout, which covers an idle keep-alive connection too),
//!   and a request ends within `limits.request_timeout` (the router's guard).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};

/// Time a client gets to send its request headers, from connecting or from
/// its last response.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Connection bounds of one listener.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Connections served at once.
    pub total: usize,
    /// Connections one client holds at once.
    pub per_client: usize,
}

/// The API socket: clients are local users (uids), each up to 32
/// connections (a node agent's watches and requests), 256 in all.
pub const API_LIMITS: ConnLimits = ConnLimits {
    total: 256,
    per_client: 32,
};

/// The metrics listener: clients are source addresses (a Prometheus
/// server needs one connection), each up to 8, 64 in all.
pub const METRICS_LIMITS: ConnLimits = ConnLimits {
    total: 64,
    per_client: 8,
};

/// Who a connection is from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    /// A local user (the peer's uid).
    Uid(u32),
    /// A source address.
    Addr(std::net::IpAddr),
    /// Not known (the kernel did not say): all such connections are one client.
    Unknown,
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Uid(u) => write!(f, "uid {u}"),
            Self::Addr(a) => write!(f, "address {a}"),
            Self::Unknown => f.write_str("an unknown peer"),
        }
    }
}

/// Connection counters of one listener (for `/metrics`).
#[derive(Debug, Default)]
pub struct ConnStats {
    /// Connections accepted and served.
    pub accepted: AtomicU64,
    /// Idle connections closed to make room for a new one.
    pub evicted: AtomicU64,
    /// Connections refused: their client had `per_client` in requests.
    pub refused_client: AtomicU64,
    /// Connections refused: every connection was in a request.
    pub refused_full: AtomicU64,
    /// Connections open now.
    pub open: AtomicUsize,
}

/// The API socket's and the metrics listener's counters.
pub static API_CONNS: ConnStats = ConnStats {
    accepted: AtomicU64::new(0),
    evicted: AtomicU64::new(0),
    refused_client: AtomicU64::new(0),
    refused_full: AtomicU64::new(0),
    open: AtomicUsize::new(0),
};

/// The metrics listener's counters.
pub static METRICS_CONNS: ConnStats = ConnStats {
    accepted: AtomicU64::new(0),
    evicted: AtomicU64::new(0),
    refused_client: AtomicU64::new(0),
    refused_full: AtomicU64::new(0),
    open: AtomicUsize::new(0),
};

struct Entry {
    client: Client,
    opened: Instant,
    /// Requests in progress on the connection.
    busy: Arc<AtomicUsize>,
    /// Told to close (idle connections only).
    close: Arc<tokio::sync::Notify>,
}

/// Why a connection was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Its client has `per_client` connections, all in a request.
    Client,
    /// Every connection is in a request.
    Full,
}

/// The open connections of one listener.
pub struct Tracker {
    limits: ConnLimits,
    stats: &'static ConnStats,
    conns: Mutex<(u64, HashMap<u64, Entry>)>,
}

/// A connection's place in its tracker (given back on drop).
pub struct Slot {
    tracker: Arc<Tracker>,
    id: u64,
    /// Requests in progress.
    pub busy: Arc<AtomicUsize>,
    /// Notified when the connection must close.
    pub close: Arc<tokio::sync::Notify>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut g = self
            .tracker
            .conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if g.1.remove(&self.id).is_some() {
            self.tracker.stats.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Tracker {
    /// A tracker with these bounds, counting into `stats`.
    pub fn new(limits: ConnLimits, stats: &'static ConnStats) -> Arc<Self> {
        Arc::new(Self {
            limits,
            stats,
            conns: Mutex::new((0, HashMap::new())),
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .1
            .len()
    }

    /// Admits a connection of `client`, closing an idle one to make room
    /// (module documentation), or refuses it.
    pub fn admit(self: &Arc<Self>, client: Client) -> Result<Slot, Refused> {
        let mut g = self
            .conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (next, conns) = &mut *g;
        let idle = |e: &Entry| e.busy.load(Ordering::Acquire) == 0;
        let oldest_idle = |conns: &HashMap<u64, Entry>, of: &Client| {
            conns
                .iter()
                .filter(|(_, e)| &e.client == of && idle(e))
                .min_by_key(|(id, e)| (e.opened, **id))
                .map(|(id, _)| *id)
        };
        let mine = conns.values().filter(|e| e.client == client).count();
        let victim = if mine >= self.limits.per_client {
            Some(oldest_idle(conns, &client).ok_or(Refused::Client)?)
        } else if conns.len() >= self.limits.total {
            // The client holding most connections with one idle.
            let mut counts: HashMap<&Client, (usize, bool)> = HashMap::new();
            for e in conns.values() {
                let c = counts.entry(&e.client).or_default();
                c.0 += 1;
                c.1 |= idle(e);
            }
            let top = counts
                .into_iter()
                .filter(|(_, (_, has_idle))| *has_idle)
                .max_by_key(|(_, (n, _))| *n)
                .map(|(c, _)| c.clone())
                .ok_or(Refused::Full)?;
            oldest_idle(conns, &top)
        } else {
            None
        };
        if let Some(v) = victim.and_then(|id| conns.remove(&id)) {
            v.close.notify_one();
            self.stats.evicted.fetch_add(1, Ordering::Relaxed);
            self.stats.open.fetch_sub(1, Ordering::Relaxed);
        }
        let id = *next;
        *next += 1;
        let busy = Arc::new(AtomicUsize::new(0));
        let close = Arc::new(tokio::sync::Notify::new());
        conns.insert(
            id,
            Entry {
                client,
                opened: Instant::now(),
                busy: busy.clone(),
                close: close.clone(),
            },
        );
        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        self.stats.open.fetch_add(1, Ordering::Relaxed);
        Ok(Slot {
            tracker: self.clone(),
            id,
            busy,
            close,
        })
    }

    fn refused(&self, why: &Refused) {
        let c = match why {
            Refused::Client => &self.stats.refused_client,
            Refused::Full => &self.stats.refused_full,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// The answer to a refused connection: a JSON error, then close.
fn refusal(why: &Refused, client: &Client, limits: ConnLimits) -> Vec<u8> {
    let e = match why {
        Refused::Client => crate::types::ApiError::new(
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            "too_many_connections",
            format!(
                "{client} has {} connections in requests, the most one client may hold",
                limits.per_client
            ),
            "wait for an answer before sending more requests, or reuse a connection",
        ),
        Refused::Full => crate::types::ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "too_many_connections",
            format!(
                "all {} connections the service serves are in requests",
                limits.total
            ),
            "retry in a second",
        ),
    };
    http_error(&e)
}

/// A whole HTTP/1.1 response carrying `e`, closing the connection.
pub fn http_error(e: &crate::types::ApiError) -> Vec<u8> {
    let body = serde_json::to_vec(e).unwrap_or_default();
    let status = axum::http::StatusCode::from_u16(e.status)
        .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{}\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len(),
        if status == axum::http::StatusCode::SERVICE_UNAVAILABLE
            || status == axum::http::StatusCode::TOO_MANY_REQUESTS
        {
            "retry-after: 1\r\n"
        } else {
            ""
        }
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Decrements a connection's in-request count when a request ends.
struct BusyGuard(Arc<AtomicUsize>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves HTTP/1.1 on an admitted connection until it ends or is told to
/// close (then it finishes a request in progress, bounded).
fn serve<S>(stream: S, router: axum::Router, slot: Slot)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let busy = slot.busy.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        busy.fetch_add(1, Ordering::AcqRel);
        let guard = BusyGuard(busy.clone());
        let router = router.clone();
        async move {
            let _guard = guard;
            let r = tower::ServiceExt::oneshot(router, req).await;
            Ok::<_, Infallible>(match r {
                Ok(r) => r,
                Err(never) => match never {},
            })
        }
    });
    tokio::spawn(async move {
        let close = slot.close.clone();
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .max_buf_size(64 << 10)
            .serve_connection(TokioIo::new(JsonErrors::new(stream)), service);
        tokio::pin!(conn);
        let ended = tokio::select! {
            r = conn.as_mut() => Some(r),
            () = close.notified() => None,
        };
        let r = match ended {
            Some(r) => r,
            // Idle (no request dispatched): closed at once.
            None if slot.busy.load(Ordering::Acquire) == 0 => Ok(()),
            None => {
                conn.as_mut().graceful_shutdown();
                match tokio::time::timeout(HEADER_TIMEOUT, conn).await {
                    Ok(r) => r,
                    Err(_) => Ok(()),
                }
            }
        };
        if let Err(e) = r {
            tracing::debug!("connection: {e}");
        }
        drop(slot);
    });
}

/// A connection's byte stream that turns hyper's own answers to a request
/// it could not parse (400, 414, 431 with an empty body, written before any
/// handler runs) into the API's JSON errors. Everything else passes through.
pub struct JsonErrors<S> {
    inner: S,
    /// A rewritten answer still to write, and how much of it is written.
    pending: Vec<u8>,
    written: usize,
}

impl<S> JsonErrors<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            pending: Vec::new(),
            written: 0,
        }
    }
}

/// The JSON answer for a head hyper wrote for a request it could not parse,
/// or `None` when `buf` is anything else (every answer of the router has a
/// content type; hyper's own have none and no body).
pub fn rewrite_parse_error(buf: &[u8]) -> Option<Vec<u8>> {
    let rest = buf
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| buf.strip_prefix(b"HTTP/1.0 "))?;
    let status = rest.get(..3)?;
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    if end != buf.len() {
        return None;
    }
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    if head.contains("\r\ncontent-type:") || !head.contains("\r\ncontent-length: 0\r\n") {
        return None;
    }
    use axum::http::StatusCode;
    let e = match status {
        b"400" => crate::types::ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "the request is not valid HTTP/1.1: its request line or a header could not be parsed",
            "send an HTTP/1.1 request: a method, a path and the version, then headers",
        ),
        b"414" => crate::types::ApiError::new(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            "the request's path is longer than the service reads",
            "the API's paths are short: see GET /v1/openapi.json",
        ),
        b"431" => crate::types::ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            "the request's headers exceed 64 KiB, or 100 headers",
            "send fewer or shorter headers",
        ),
        _ => return None,
    };
    Some(http_error(&e))
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonErrors<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> JsonErrors<S> {
    /// Writes what is pending; ready when nothing is.
    fn drain(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        while self.written < self.pending.len() {
            match std::pin::Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..])
            {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => self.written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonErrors<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::task::Poll;
        std::task::ready!(self.drain(cx))?;
        if let Some(answer) = rewrite_parse_error(buf) {
            self.pending = answer;
            self.written = 0;
            // Taken whole; written by this drain, or by the flush hyper does next.
            if let Poll::Ready(Err(e)) = self.drain(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::ready!(self.drain(cx))?;
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::ready!(self.drain(cx))?;
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Writes a refusal to a connection and closes it (bounded; never blocks
/// the accept loop).
fn refuse<S>(mut stream: S, answer: Vec<u8>)
where
    S: AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            let _ = stream.write_all(&answer).await;
            let _ = stream.shutdown().await;
        })
        .await;
    });
}

/// Admits, or refuses, one accepted connection.
fn dispatch<S>(tracker: &Arc<Tracker>, stream: S, client: Client, router: &axum::Router)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match tracker.admit(client.clone()) {
        Ok(slot) => serve(stream, router.clone(), slot),
        Err(why) => {
            tracker.refused(&why);
            tracing::warn!("refused a connection of {client}: {why:?}");
            refuse(stream, refusal(&why, &client, tracker.limits));
        }
    }
}

/// Accepts connections on the API socket and serves each (module
/// documentation: clients are peer uids).
pub async fn serve_unix(listener: tokio::net::UnixListener, router: axum::Router) {
    let tracker = Tracker::new(API_LIMITS, &API_CONNS);
    loop {
        match listener.accept().await {
            Ok((s, _)) => {
                let client = s
                    .peer_cred()
                    .map_or(Client::Unknown, |c| Client::Uid(c.uid()));
                dispatch(&tracker, s, client, &router);
            }
            Err(e) => {
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Accepts connections on the metrics listener and serves each (clients
/// are source addresses).
pub async fn serve_tcp(listener: tokio::net::TcpListener, router: axum::Router) {
    let tracker = Tracker::new(METRICS_LIMITS, &METRICS_CONNS);
    loop {
        match listener.accept().await {
            Ok((s, addr)) => {
                let _ = s.set_nodelay(true);
                let client = s
                    .local_addr()
                    .ok()
                    .and_then(|local| local_peer_uid(addr, local))
                    .map_or(Client::Addr(addr.ip()), Client::Uid);
                dispatch(&tracker, s, client, &router);
            }
            Err(e) => {
                tracing::warn!("accepting a metrics connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The uid owning the peer's end of a TCP connection from `peer` to
/// `local`, when the peer is a socket of this host: the kernel's exact
/// socket lookup (`NETLINK_SOCK_DIAG`, `SOCK_DIAG_BY_FAMILY` without
/// `NLM_F_DUMP`: one socket by its addresses and ports). `None` for a
/// remote peer, or when the lookup fails.
pub fn local_peer_uid(peer: std::net::SocketAddr, local: std::net::SocketAddr) -> Option<u32> {
    let req = sock_diag_request(peer, local)?;
    let fd = sock_diag_socket()?;
    sock_diag_uid(&fd, &req)
}

/// `sock_diag`'s message type for one socket of a family.
const SOCK_DIAG_BY_FAMILY: u16 = 20;

/// The `SOCK_DIAG_BY_FAMILY` request for the TCP socket whose source is
/// `peer` and destination `local` (`None` when their families differ).
fn sock_diag_request(peer: std::net::SocketAddr, local: std::net::SocketAddr) -> Option<[u8; 72]> {
    use std::net::IpAddr;
    let words = |ip: IpAddr| -> [u8; 16] {
        match ip {
            IpAddr::V4(a) => {
                let mut w = [0u8; 16];
                w[..4].copy_from_slice(&a.octets());
                w
            }
            IpAddr::V6(a) => a.octets(),
        }
    };
    let family = match (peer.ip(), local.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => libc::AF_INET,
        (IpAddr::V6(_), IpAddr::V6(_)) => libc::AF_INET6,
        _ => return None,
    };
    // nlmsghdr (16 bytes), then inet_diag_req_v2 (56 bytes).
    let mut req = [0u8; 72];
    req[0..4].copy_from_slice(&72u32.to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    req[16] = family as u8;
    req[17] = libc::IPPROTO_TCP as u8;
    // Every state.
    req[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
    // The peer's socket: its source is the peer, its destination us.
    req[24..26].copy_from_slice(&peer.port().to_be_bytes());
    req[26..28].copy_from_slice(&local.port().to_be_bytes());
    req[28..44].copy_from_slice(&words(peer.ip()));
    req[44..60].copy_from_slice(&words(local.ip()));
    // INET_DIAG_NOCOOKIE.
    req[64..72].copy_from_slice(&[0xff; 8]);
    Some(req)
}

/// A `NETLINK_SOCK_DIAG` socket whose receives time out after 100 ms.
fn sock_diag_socket() -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::AsRawFd;
    // SAFETY: a new netlink socket, owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a descriptor this function just opened and owns.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: setsockopt with a timeval that lives for the call.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            std::ptr::from_ref(&tv).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    Some(fd)
}

/// Sends `req` to the kernel over `fd` and reads the socket's uid from
/// the answer (`None` when there is no such socket or no answer).
fn sock_diag_uid(fd: &std::os::fd::OwnedFd, req: &[u8; 72]) -> Option<u32> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero sockaddr_nl is the kernel's address (pid 0).
    let mut to: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    to.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: sendto with a buffer and an address that live for the call.
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            std::ptr::from_ref(&to).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent != req.len() as isize {
        return None;
    }
    let mut buf = [0u8; 512];
    // SAFETY: recv into a buffer that lives for the call.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    let n = usize::try_from(n).ok()?;
    // nlmsghdr, then inet_diag_msg: family, state, timer, retrans (4),
    // the socket id (48), expires, rqueue, wqueue (12), uid.
    let ty = u16::from_ne_bytes(buf.get(4..6)?.try_into().ok()?);
    if ty != SOCK_DIAG_BY_FAMILY || n < 16 + 68 {
        return None;
    }
    Some(u32::from_ne_bytes(buf.get(80..84)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    static STATS: ConnStats = ConnStats {
        accepted: AtomicU64::new(0),
        evicted: AtomicU64::new(0),
        refused_client: AtomicU64::new(0),
        refused_full: AtomicU64::new(0),
        open: AtomicUsize::new(0),
    };

    #[test]
    fn a_client_over_its_bound_closes_its_own_oldest_idle_connection() {
        let t = Tracker::new(
            ConnLimits {
                total: 10,
                per_client: 3,
            },
            &STATS,
        );
        let hog = Client::Uid(65534);
        let slots: Vec<Slot> = (0..3).map(|_| t.admit(hog.clone()).unwrap()).collect();
        slots[1].busy.store(1, Ordering::Release);
        slots[0].busy.store(1, Ordering::Release);
        let fourth = t.admit(hog.clone()).unwrap();
        assert_eq!(t.open(), 3, "one closed");
        // The oldest idle one (the third) was told to close.
        assert!(tokio_notified(&slots[2].close));
        // All busy: refused.
        fourth.busy.store(1, Ordering::Release);
        assert_eq!(t.admit(hog).err(), Some(Refused::Client));
        // Another client is not affected.
        assert!(t.admit(Client::Uid(0)).is_ok());
    }

    #[test]
    fn a_full_listener_closes_an_idle_connection_of_the_biggest_client() {
        let t = Tracker::new(
            ConnLimits {
                total: 6,
                per_client: 4,
            },
            &STATS,
        );
        let a: Vec<Slot> = (0..4)
            .map(|i| t.admit(Client::Addr([127, 0, 0, i].into())).unwrap())
            .collect();
        let b: Vec<Slot> = (0..2)
            .map(|_| t.admit(Client::Addr([10, 0, 0, 1].into())).unwrap())
            .collect();
        let _new = t.admit(Client::Addr([10, 0, 0, 2].into())).unwrap();
        assert!(tokio_notified(&b[0].close), "the biggest client's oldest");
        assert!(!a.iter().any(|s| tokio_notified(&s.close)));
        for s in a.iter().chain(&b[1..]) {
            s.busy.store(1, Ordering::Release);
        }
        _new.busy.store(1, Ordering::Release);
        assert_eq!(
            t.admit(Client::Addr([10, 0, 0, 3].into())).err(),
            Some(Refused::Full)
        );
    }

    #[test]
    fn a_local_tcp_peer_is_known_by_its_uid() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, peer) = l.accept().unwrap();
        assert_eq!(peer, c.local_addr().unwrap());
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert_eq!(local_peer_uid(peer, s.local_addr().unwrap()), Some(me));
        // A peer that is not a socket of this host.
        let far = std::net::SocketAddr::from(([192, 0, 2, 1], 9));
        assert_eq!(local_peer_uid(far, s.local_addr().unwrap()), None);
    }

    /// Whether `n` has a stored notification.
    fn tokio_notified(n: &tokio::sync::Notify) -> bool {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(1), n.notified())
                .await
                .is_ok()
        })
    }
}
