//! The API's request and response bodies (JSON), with their OpenAPI
//! schemas generated from these types, and its errors.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{RefOr, SchemaFormat};
use utoipa::{PartialSchema, ToSchema};

use vmm_core::units::parse_size;

/// A size: a number of bytes, or text with a binary suffix (`"512M"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Size(n)),
            Raw::S(s) => parse_size(&s).map(Size).map_err(|_| {
                serde::de::Error::custom(format!(
                    "'{s}' is not a size: use e.g. 4096, 64K, 512M, 1G"
                ))
            }),
        }
    }
}

impl Serialize for Size {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl PartialSchema for Size {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .format(Some(SchemaFormat::KnownFormat(
                        utoipa::openapi::KnownFormat::Int64,
                    )))
                    .minimum(Some(0))
                    .description(Some("bytes")),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(r"^[0-9]+(\.[0-9]+)?[KMGTkmgt]?$"))
                    .description(Some("a size with a binary suffix, e.g. 512M")),
            )
            .description(Some("A size: bytes, or text such as \"512M\" or \"1G\""))
            .into()
    }
}

impl ToSchema for Size {}

/// The error body of every non-2xx answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ApiError {
    /// HTTP status (not in the body).
    #[serde(skip)]
    pub status: u16,
    /// A stable machine-readable code (`bad_request`, `not_found`,
    /// `conflict`, `payload_too_large`, `shutting_down`, ...).
    pub code: String,
    /// What went wrong.
    pub message: String,
    /// What to do about it.
    pub fix: String,
}

impl ApiError {
    pub fn new(
        status: StatusCode,
        code: &str,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            status: status.as_u16(),
            code: code.into(),
            message: message.into(),
            fix: fix.into(),
        }
    }

    /// 400: the request is malformed or a value is invalid.
    pub fn bad_request(message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message, fix)
    }

    /// 404.
    pub fn not_found(message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message, fix)
    }

    /// 405.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            message,
            "see GET /v1/openapi.json for the methods of each route",
        )
    }

    /// 409: the request conflicts with the service's state.
    pub fn conflict(message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message, fix)
    }

    /// 413.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body exceeds the {limit}-byte limit"),
            "send a smaller body (limits.max_body in the service's config)",
        )
    }

    /// 503 while the service shuts down.
    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the service is shutting down",
            "retry against the service once it is restarted",
        )
    }

    /// 408/503 when a request runs out of time.
    pub fn timeout(limit: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout",
            format!(
                "the request did not complete within {:.1} s",
                limit.as_secs_f64()
            ),
            "retry; if it persists, read the service's log",
        )
    }

    /// 500: the host failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            message,
            "read the service's log (and the VM's log in the state directory)",
        )
    }

    /// 502: a VM's worker process failed to answer.
    pub fn worker(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "worker_failed",
            message,
            "GET the VM to see its state; its log is in the state directory",
        )
    }
}

impl From<crate::host_error::HostError> for ApiError {
    /// The API's answer to a failure of the host: its kind decides the
    /// status and code; retryable kinds are 503 (with `Retry-After`) or
    /// 504, permanent ones 4xx.
    fn from(e: crate::host_error::HostError) -> Self {
        use crate::host_error::HostErrorKind as K;
        let (status, code) = match e.kind {
            K::Invalid => (StatusCode::BAD_REQUEST, "bad_request"),
            K::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            K::Conflict => (StatusCode::CONFLICT, "conflict"),
            K::Unresponsive => (StatusCode::CONFLICT, "unresponsive"),
            K::NotReady => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
            K::WorkerTimeout => (StatusCode::GATEWAY_TIMEOUT, "worker_timeout"),
            K::Worker => (StatusCode::BAD_GATEWAY, "worker_failed"),
            K::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            K::StateDir => (StatusCode::INTERNAL_SERVER_ERROR, "state_dir"),
            K::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        Self::new(status, code, e.message, e.fix)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let retry = status == StatusCode::SERVICE_UNAVAILABLE && self.code == "not_ready";
        let mut r = (status, axum::Json(self)).into_response();
        if retry {
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        r
    }
}

/// The fast-tier share of a VM as asked for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FastRequest {
    /// Guaranteed fast bytes (admission control: the mins of all VMs fit the pool).
    pub min: Option<Size>,
    /// Most fast bytes (default: the VM's mem).
    pub max: Option<Size>,
    /// Relative weight of the VM in the division of spare capacity (> 0).
    #[schema(exclusive_minimum = 0.0, maximum = 1e6)]
    pub weight: Option<f64>,
}

/// `POST /v1/vms` and `PUT /v1/vms/{name}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVm {
    /// A built-in image (zipf, gups, memcheck, kv, pagerank) or the file name of a static x86_64 ELF in the service's `image_dir`.
    pub image: String,
    /// Workload arguments `key=value` (`tiervm images` lists them).
    #[serde(default)]
    pub args: Vec<String>,
    /// Guest RAM (a multiple of 2M).
    pub mem: Option<Size>,
    /// vCPUs.
    #[schema(minimum = 1, maximum = 64)]
    pub vcpus: Option<u32>,
    /// Placement policy.
    #[schema(value_type = Option<PolicyName>)]
    pub policy: Option<String>,
    /// Access tracking.
    #[schema(value_type = Option<TrackingName>)]
    pub tracking: Option<String>,
    /// The fast-tier share.
    pub fast: Option<FastRequest>,
    /// Run length, e.g. "60s" (default: until deleted or the guest exits).
    pub duration: Option<String>,
    /// Seed of the guest's generators (0 to 2^53 - 1).
    #[schema(minimum = 0, maximum = 9007199254740991_i64)]
    pub seed: Option<u64>,
    /// The orchestrator's own labels (its ids): at most 32; keys of 1 to
    /// 63 characters of `A-Za-z0-9._/-`, values up to 256 characters.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Tier latency emulated in the guest (docs/emulation.md; `tiervm run
    /// --emulate-latency`): a preset (`nomad-a`, `colloid`, `mtm-pm`)
    /// and/or `fast=LAT,slow=LAT,...`, e.g. `"fast=80ns,slow=250ns"`; `""`
    /// for the default preset (nomad-a). Left out: off. On a one-node host
    /// this is what makes the tiers' latencies differ for the guest.
    #[schema(max_length = 256)]
    pub emulate_latency: Option<String>,
}

/// A placement policy.
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum PolicyName {
    /// Never migrates.
    Static,
    /// TPP.
    Tpp,
    /// Nomad.
    Nomad,
    /// Memtis.
    Memtis,
    /// Colloid.
    Colloid,
    /// MTM.
    Mtm,
    /// Adaptive.
    Adaptive,
}

/// Access tracking.
#[derive(ToSchema)]
#[allow(dead_code)]
pub enum TrackingName {
    /// Hint faults (the division needs them).
    #[schema(rename = "hint-faults")]
    HintFaults,
    /// None.
    #[schema(rename = "off")]
    Off,
}

/// `PATCH /v1/host`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchHost {
    /// New fast pool size.
    pub fast_pool: Option<Size>,
    /// New slow pool size.
    pub slow_pool: Option<Size>,
}

/// `PUT /v1/vms/{id}/policy`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutPolicy {
    /// The placement policy to switch to.
    #[schema(value_type = PolicyName)]
    pub policy: String,
}

/// One pool of the host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolInfo {
    /// Tier name (fast, slow).
    pub tier: String,
    /// Host NUMA node.
    pub node: u32,
    /// Capacity the service may hand out, bytes.
    pub capacity_bytes: u64,
    /// Reserved by admission (fast: the VMs' mins; slow: their mem), bytes.
    pub reserved_bytes: u64,
    /// Handed out to VMs now (fast: their targets, or more while a shrink
    /// converges; slow: their capacities), bytes.
    pub committed_bytes: u64,
    /// Capacity not handed out, bytes.
    pub free_bytes: u64,
    /// Host memory the VMs' tiers hold now, measured by the kernel, bytes.
    pub resident_bytes: u64,
}

/// `GET /v1/host`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct HostInfo {
    /// tiervm version.
    pub version: String,
    /// Whether both tiers are one host node (capacities real, latency
    /// differences not: emulated tiers).
    pub emulated: bool,
    /// The fast pool, then the slow pool.
    pub pools: Vec<PoolInfo>,
    /// VMs by state.
    pub vms: BTreeMap<String, u64>,
    /// VM ids.
    pub vm_ids: Vec<String>,
    /// This run of the service (a UUID, new at every start).
    pub boot_id: String,
    /// The run before on the same state directory, if any.
    pub previous_boot_id: Option<String>,
    /// Whether the service is shutting down.
    pub shutting_down: bool,
    /// Rebalancing so far.
    pub rebalance: RebalanceInfo,
}

/// What rebalancing did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RebalanceInfo {
    /// Rounds run.
    pub rounds: u64,
    /// VM capacity changes made.
    pub moves: u64,
    /// Bytes of capacity moved (mandatory and optional moves).
    pub moved_bytes: u64,
    /// Bytes moved by optional moves (spare grants, exchanges).
    pub optional_bytes: u64,
    /// The most bytes optional moves changed in one round (bounded by
    /// `budget_bytes`).
    pub max_round_optional_bytes: u64,
    /// Seconds between rounds.
    pub period_s: f64,
    /// Most bytes optional moves change per round.
    pub budget_bytes: u64,
    /// A resized VM is moved again only the same way for this long (and
    /// capacity it does not use may go back after it).
    pub dwell_s: f64,
    /// A VM is not moved back the other way for this long.
    pub reverse_dwell_s: f64,
    /// What a quantum of fast capacity is valued by (`weight x rate x
    /// share`): `host-accesses` (each VM's sampled access rate as the host
    /// measures it, `fast.gain.accesses_per_sec`; the default) or
    /// `guest-ops` (the operations per second each guest reports,
    /// `ops_per_sec`: trusted guests only).
    pub value: String,
}

/// A VM's fast-tier share: the request and where the VM stands.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FastInfo {
    /// Guaranteed fast bytes.
    pub min_bytes: u64,
    /// Most fast bytes.
    pub max_bytes: u64,
    /// Weight.
    pub weight: f64,
    /// The capacity the service decided (requested).
    pub target_bytes: u64,
    /// The capacity the VM applied (its limit now).
    pub capacity_bytes: u64,
    /// Fast bytes the VM uses now (follows a shrink as it converges).
    pub used_bytes: u64,
    /// Kernel-measured host memory of the VM's fast tier.
    pub resident_bytes: Option<u64>,
    /// Whether the used size reached the target (`used <= target`).
    pub converged: bool,
    /// What the division reads from the VM's access profile: the share of
    /// its sampled accesses the next quantum of fast capacity would
    /// capture, and the last quantum would lose, and the VM's sampled
    /// access rate (`None` before the VM has enough samples).
    pub gain: Option<GainInfo>,
}

/// The marginal gain of fast capacity for one VM (see docs/service.md).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GainInfo {
    /// Share of sampled accesses the next quantum would capture.
    pub next_quantum_share: f64,
    /// Share of sampled accesses the last quantum would lose.
    pub last_quantum_share: f64,
    /// Weighted samples behind the estimate (decayed).
    pub samples: f64,
    /// The VM's sampled accesses per second as the host measures them (the
    /// sum over guest pages of the weight of each page's latest hint fault
    /// in a sampler window, extrapolated until the sampler covered all of
    /// guest memory once): by
    /// default a quantum is worth `weight x accesses_per_sec x share`
    /// (`GET /v1/host`, `rebalance.value`). `None` before the sampler
    /// covered any memory, or with tracking off.
    pub accesses_per_sec: Option<f64>,
    /// Standard error of `accesses_per_sec`.
    pub accesses_per_sec_se: Option<f64>,
}

/// One tier of a VM.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VmTierInfo {
    /// Tier name.
    pub name: String,
    /// Host node.
    pub node: u32,
    /// Capacity (limit), bytes.
    pub capacity_bytes: u64,
    /// Guest pages and shadows on the tier, bytes.
    pub used_bytes: u64,
    /// Kernel-measured resident host memory, bytes.
    pub resident_bytes: Option<u64>,
}

/// Migration counters of a VM (the kernel's names in the metrics).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MigrationInfo {
    /// Pages promoted (pgpromote_success).
    pub promotions: u64,
    /// Pages demoted (pgdemote).
    pub demotions: u64,
    /// Committed transactional migrations.
    pub tpm_commits: u64,
    /// Aborted transactional migrations.
    pub tpm_aborts: u64,
    /// Demotions that remapped a shadow.
    pub shadow_demotions: u64,
    /// Shadows reclaimed.
    pub shadow_reclaims: u64,
    /// Guest stall in migration faults, seconds.
    pub guest_stall_seconds: f64,
    /// Hint faults.
    pub hint_faults: u64,
}

/// How a VM's process ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExitInfoBody {
    /// Exit code, if it exited.
    pub code: Option<i32>,
    /// Signal that ended it, if one did.
    pub signal: Option<i32>,
}

/// One change on the event stream (`GET /v1/events`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EventInfo {
    /// Sequence number (increasing; `since` takes it).
    pub seq: u64,
    /// Unix time, seconds.
    pub time_unix: f64,
    /// `vm_state` (a VM changed state), `division` (its fast target
    /// moved), `vm_removed`.
    pub kind: String,
    /// The VM's id.
    pub vm: String,
    /// The VM's UUID.
    pub uuid: String,
    /// The new state (`vm_state`).
    pub state: Option<String>,
    /// The state before (`vm_state`).
    pub previous_state: Option<String>,
    /// The new fast target (`division`).
    pub fast_target_bytes: Option<u64>,
    /// The target before (`division`).
    pub previous_target_bytes: Option<u64>,
}

/// `GET /healthz`, `GET /readyz`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok`, `ready` or `not_ready`.
    pub status: String,
    /// This run of the service.
    pub boot_id: String,
    /// Why not ready.
    pub reasons: Vec<String>,
}

/// `GET /v1/events`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Events {
    /// The events after `since`, oldest first (the service keeps the
    /// latest 4096).
    pub events: Vec<EventInfo>,
    /// The `since` of the next call.
    pub next: u64,
}

/// `GET /v1/vms/{id}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VmInfo {
    /// The VM's id: the name a client chose (`PUT /v1/vms/{name}`) or a
    /// generated `vm-N` (never reused on the same state directory).
    pub id: String,
    /// A UUID generated by the service, unique to this VM.
    pub uuid: String,
    /// The orchestrator's labels.
    pub labels: BTreeMap<String, String>,
    /// The run of the service that created the VM (`GET /v1/host` shows
    /// the current one).
    pub boot_id: String,
    /// Creation, Unix seconds.
    pub created_unix: f64,
    /// End, Unix seconds.
    pub ended_unix: Option<f64>,
    /// starting, running, unresponsive (its process silent beyond
    /// `limits.unresponsive_after`), stopping, stopped, crashed, failed,
    /// lost (a VM of an earlier run of the service that ended without
    /// recording the VM's end).
    pub state: String,
    /// Seconds since the VM's process last answered (while it runs).
    pub silent_s: Option<f64>,
    /// While the VM is unresponsive, what `/proc` says its process is
    /// doing when that explains the silence: stopped by a signal or a
    /// tracer, or a thread waiting uninterruptibly in the kernel, and
    /// where; `null` otherwise (a busy or sleeping process).
    pub process_condition: Option<String>,
    /// The worker's process id while it runs.
    pub pid: Option<u32>,
    /// Image.
    pub image: String,
    /// Workload arguments.
    pub args: Vec<String>,
    /// Guest RAM, bytes.
    pub mem_bytes: u64,
    /// vCPUs.
    pub vcpus: u32,
    /// The placement policy running now.
    pub policy: String,
    /// The policy asked for last (at creation or by `PUT .../policy`); it
    /// differs from `policy` until the VM took the switch.
    pub policy_requested: String,
    /// Why the last switch failed, if it did (the VM keeps `policy`).
    pub policy_error: Option<String>,
    /// Policy switches requested through the API.
    pub policy_switches: u64,
    /// The fast-tier share.
    pub fast: FastInfo,
    /// Per tier, fastest first (while it runs).
    pub tiers: Vec<VmTierInfo>,
    /// Seconds the VM has run.
    pub uptime_s: f64,
    /// Guest operations so far.
    pub ops: u64,
    /// Guest operations per second now, as the guest reports them on its
    /// status page (its own counter, not measured by the host: the fast-tier
    /// division reads it only with `[division] value = "guest-ops"`).
    pub ops_per_sec: f64,
    /// Migration counters.
    pub migration: MigrationInfo,
    /// Whether the tiers are emulated (one host node).
    pub emulated: bool,
    /// Tier latency emulated in the guest (the create's `emulate_latency`;
    /// `null`: off, the guest sees one latency on a one-node host).
    pub emulate_latency: Option<String>,
    /// How the worker process ended.
    pub exit: Option<ExitInfoBody>,
    /// Why the VM stopped, once it did: `deleted` (an API DELETE),
    /// `force_deleted` (DELETE ?force=true), `service_stopped` (the
    /// service's SIGTERM), or the run's own `duration`, `guest_exited`,
    /// `forced`, `crashed`; `service_lost` for `lost` VMs.
    pub stop_reason: Option<String>,
    /// The exit code the guest wrote (0: success), once it ended.
    pub guest_exit_code: Option<u32>,
    /// The guest crash, or the failure that stopped the VM.
    pub error: Option<String>,
    /// Advice about the settings.
    pub notes: Vec<String>,
    /// Whether the run report can be read (GET /v1/vms/{id}/report).
    pub report_ready: bool,
}
