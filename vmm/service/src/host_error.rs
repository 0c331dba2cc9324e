//! What the service's domain layer (`host`) answers when an operation
//! cannot be done: a kind the API layer maps to an HTTP status
//! (`api::status_of`), a message and a fix, all in the API's words. The
//! host knows nothing of HTTP.

/// Why an operation of the host failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostErrorKind {
    /// The request is malformed or a value is invalid (permanent).
    Invalid,
    /// No such VM.
    NotFound,
    /// The request conflicts with a VM's state or the pools (permanent
    /// until the state changes).
    Conflict,
    /// Not yet: the VM is still starting (retry in a moment).
    NotReady,
    /// The VM's process has been silent beyond the bound (stopped,
    /// frozen, or stuck): nothing can be delivered to it.
    Unresponsive,
    /// The VM's process failed to answer in time.
    WorkerTimeout,
    /// The VM's process failed.
    Worker,
    /// The service is shutting down.
    ShuttingDown,
    /// The state directory holds something the service did not put
    /// there (a link planted in place of a VM's log): the operator's to
    /// fix.
    StateDir,
    /// The host failed.
    Internal,
}

impl HostErrorKind {
    /// Whether the same request may succeed later without any change.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            Self::NotReady | Self::WorkerTimeout | Self::Unresponsive
        )
    }
}

/// A failed operation of the host.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct HostError {
    /// What kind of failure.
    pub kind: HostErrorKind,
    /// What went wrong (API words: fields and routes, no host paths).
    pub message: String,
    /// What to do about it.
    pub fix: String,
}

impl HostError {
    /// A failure of `kind`.
    pub fn new(kind: HostErrorKind, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            fix: fix.into(),
        }
    }

    /// A malformed request or an invalid value.
    pub fn bad_request(message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(HostErrorKind::Invalid, message, fix)
    }

    /// No such thing.
    pub fn not_found(message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(HostErrorKind::NotFound, message, fix)
    }

    /// A conflict with the state.
    pub fn conflict(message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(HostErrorKind::Conflict, message, fix)
    }

    /// The service is stopping.
    pub fn shutting_down() -> Self {
        Self::new(
            HostErrorKind::ShuttingDown,
            "the service is shutting down",
            "retry against the service once it is restarted",
        )
    }

    /// The host failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            HostErrorKind::Internal,
            message,
            "read the service's log (and the VM's log in the state directory)",
        )
    }
}
