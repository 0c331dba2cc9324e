//! The REST API: axum handlers, each annotated for the OpenAPI document,
//! and the router that registers them only through `utoipa-axum` (so the
//! document served at `/v1/openapi.json` lists exactly the routes the
//! server has). Bodies are size-limited, requests time out, every error is
//! JSON `{code, message, fix}`.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, MatchedPath, Path, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::host::Host;
use super::metrics::ApiMetrics;
use super::types::*;

pub use super::placement_policy::check_policy;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    /// The service.
    pub host: Arc<Host>,
    /// The OpenAPI document (set once the router is built).
    pub openapi: Arc<OnceLock<String>>,
    /// Request counters and latencies.
    pub metrics: Arc<ApiMetrics>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "tiervm serve",
        description = "The host-side CXL memory expander service: shares the host's fast and slow \
                       memory tiers among VMs, one worker process per VM. Served over a Unix socket.",
        license(name = "Apache-2.0")
    ),
    tags(
        (name = "host", description = "The host's pools"),
        (name = "vms", description = "VMs and their fast-tier shares"),
        (name = "meta", description = "The API document and metrics")
    )
)]
struct ApiDoc;

/// Runs blocking service code off the async threads; a panic is a 500.
/// The host's errors become API errors here (`ApiError: From<HostError>`).
async fn blocking<T: Send + 'static, E: Into<ApiError> + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(Into::into),
        Err(e) => Err(ApiError::internal(format!("the request failed: {e}"))),
    }
}

/// A JSON body: size-limited (413), parsed with serde (400 names the field).
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let limit = req
            .extensions()
            .get::<BodyLimit>()
            .map_or(64 << 10, |l| l.0);
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(limit)
            } else {
                ApiError::bad_request(format!("reading the body: {e}"), "send a JSON body")
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// Parses a request body (exposed for the property tests).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // serde reads a JSON array as a struct's fields in order: the API
    // takes objects only (every body, and `fast` in a create).
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(
            format!("the body is not valid JSON: {e}"),
            "send a JSON object (see the request schema in GET /v1/openapi.json)",
        )
    })?;
    let fix =
        "send a JSON object with named fields (see the request schema in GET /v1/openapi.json)";
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the body must be a JSON object, not an array or a scalar",
            fix,
        ));
    }
    if v.get("fast")
        .is_some_and(|f| !f.is_object() && !f.is_null())
    {
        return Err(ApiError::bad_request(
            "the body's `fast` must be a JSON object, not an array or a scalar",
            fix,
        ));
    }
    serde_json::from_value(v).map_err(|e| {
        ApiError::bad_request(
            format!("the body is not valid for this route: {e}"),
            "see the request schema in GET /v1/openapi.json",
        )
    })
}

/// The body limit, for messages.
#[derive(Clone, Copy)]
struct BodyLimit(usize);

fn path_id(p: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    p.map(|Path(id)| id)
        .map_err(|e| ApiError::bad_request(format!("the path: {e}"), "use an id from GET /v1/vms"))
}

/// The host's tiers, pools (capacity, reserved, committed, free bytes) and VMs.
#[utoipa::path(get, path = "/v1/host", tag = "host",
    responses((status = 200, description = "The host", body = HostInfo)))]
async fn get_host(State(st): State<AppState>) -> Result<Json<HostInfo>, ApiError> {
    let h = st.host.clone();
    blocking(move || Ok::<_, ApiError>(h.host_info()))
        .await
        .map(Json)
}

/// Changes the pool sizes (not below what admission reserved).
#[utoipa::path(patch, path = "/v1/host", tag = "host", request_body = PatchHost,
    responses(
        (status = 200, description = "The host after the change", body = HostInfo),
        (status = 400, description = "Bad input, or a pool larger than its node", body = ApiError),
        (status = 409, description = "A pool below what the VMs reserve", body = ApiError),
        (status = 413, description = "Body too large", body = ApiError),
        (status = 503, description = "Shutting down", body = ApiError)))]
async fn patch_host(
    State(st): State<AppState>,
    JsonBody(p): JsonBody<PatchHost>,
) -> Result<Json<HostInfo>, ApiError> {
    let h = st.host.clone();
    blocking(move || h.patch_host(&p)).await.map(Json)
}

/// Every VM.
#[utoipa::path(get, path = "/v1/vms", tag = "vms",
    responses((status = 200, description = "The VMs", body = Vec<VmInfo>)))]
async fn list_vms(State(st): State<AppState>) -> Result<Json<Vec<VmInfo>>, ApiError> {
    let h = st.host.clone();
    blocking(move || Ok::<_, ApiError>(h.list()))
        .await
        .map(Json)
}

/// Creates and starts a VM (admission control on its fast min and its mem).
#[utoipa::path(post, path = "/v1/vms", tag = "vms", request_body = CreateVm,
    responses(
        (status = 201, description = "Created; answered at once with the VM `starting` (poll GET /v1/vms/{id} for `running`, or `failed` and its error)", body = VmInfo),
        (status = 400, description = "Bad input (image, arguments, sizes, policy)", body = ApiError),
        (status = 409, description = "The fast min or mem does not fit the pools, or too many VMs", body = ApiError),
        (status = 413, description = "Body too large", body = ApiError),
        (status = 503, description = "Shutting down", body = ApiError)))]
async fn create_vm(
    State(st): State<AppState>,
    JsonBody(req): JsonBody<CreateVm>,
) -> Result<(StatusCode, Json<VmInfo>), ApiError> {
    let h = st.host.clone();
    blocking(move || h.create(&req))
        .await
        .map(|v| (StatusCode::CREATED, Json(v)))
}

/// One VM: state, live throughput, per-tier capacity and kernel-measured
/// resident bytes, the fast share's target and actual size, migration counters.
#[utoipa::path(get, path = "/v1/vms/{id}", tag = "vms",
    params(("id" = String, Path, description = "VM id")),
    responses(
        (status = 200, description = "The VM", body = VmInfo),
        (status = 404, description = "No such VM", body = ApiError)))]
async fn get_vm(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<VmInfo>, ApiError> {
    let id = path_id(id)?;
    let h = st.host.clone();
    blocking(move || h.vm_info(&id, true)).await.map(Json)
}

/// `DELETE /v1/vms/{id}` options.
#[derive(Clone, Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// Kill the VM's process at once (SIGKILL) instead of asking the guest
    /// to stop: for an `unresponsive` VM. No report is written.
    #[serde(default)]
    pub force: bool,
}

fn query<T: DeserializeOwned + Default>(uri: &axum::http::Uri) -> Result<T, ApiError> {
    match uri.query() {
        None | Some("") => Ok(T::default()),
        Some(q) => serde_urlencoded_like(q).map_err(|e| {
            ApiError::bad_request(
                format!("the query: {e}"),
                "see the route's parameters in GET /v1/openapi.json",
            )
        }),
    }
}

/// Parses `a=1&b=true` into `T` (values as JSON scalars, else strings).
fn serde_urlencoded_like<T: DeserializeOwned>(q: &str) -> Result<T, serde_json::Error> {
    let mut m = serde_json::Map::new();
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, "true"));
        let v = match v {
            "true" => serde_json::Value::Bool(true),
            "false" => serde_json::Value::Bool(false),
            n if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) => n
                .parse::<u64>()
                .map_or_else(|_| n.into(), serde_json::Value::from),
            other => serde_json::Value::from(other),
        };
        m.insert(k.to_string(), v);
    }
    serde_json::from_value(serde_json::Value::Object(m))
}

/// Stops a running VM (202; it writes its report; `?force=true` kills its
/// process) or removes an ended one and its record (204). A VM asked to
/// stop releases its capacity at once.
#[utoipa::path(delete, path = "/v1/vms/{id}", tag = "vms",
    params(("id" = String, Path, description = "VM id"), DeleteQuery),
    responses(
        (status = 202, description = "Stopping"),
        (status = 204, description = "Removed"),
        (status = 400, description = "A bad query", body = ApiError),
        (status = 404, description = "No such VM", body = ApiError),
        (status = 409, description = "The VM is unresponsive (use ?force=true)", body = ApiError),
        (status = 502, description = "The VM's process failed", body = ApiError),
        (status = 504, description = "The VM's process did not answer in time", body = ApiError)))]
async fn delete_vm(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    uri: axum::http::Uri,
) -> Result<StatusCode, ApiError> {
    let id = path_id(id)?;
    let q: DeleteQuery = query(&uri)?;
    let h = st.host.clone();
    blocking(move || h.delete(&id, q.force))
        .await
        .map(|stopping| {
            if stopping {
                StatusCode::ACCEPTED
            } else {
                StatusCode::NO_CONTENT
            }
        })
}

/// Creates the VM `name` (201), or answers the VM of that name unchanged
/// when it was created by the same request (200: idempotent, as
/// Firecracker's `PUT`s are); another request for an existing name is a 409.
#[utoipa::path(put, path = "/v1/vms/{id}", tag = "vms", request_body = CreateVm,
    params(("id" = String, Path, description = "The VM's name: 1 to 63 characters of a-z, 0-9, '.', '_', '-' (not vm-N, the form of generated ids)")),
    responses(
        (status = 200, description = "The VM exists from the same request", body = VmInfo),
        (status = 201, description = "Created; answered at once with the VM `starting`", body = VmInfo),
        (status = 400, description = "Bad input (name, image, arguments, sizes, policy)", body = ApiError),
        (status = 409, description = "The name exists with another request, the fast min or mem does not fit the pools, or too many VMs", body = ApiError),
        (status = 413, description = "Body too large", body = ApiError),
        (status = 503, description = "Shutting down", body = ApiError)))]
async fn put_vm(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    JsonBody(req): JsonBody<CreateVm>,
) -> Result<(StatusCode, Json<VmInfo>), ApiError> {
    let id = path_id(id)?;
    let h = st.host.clone();
    blocking(move || h.put_vm(&id, &req))
        .await
        .map(|(created, v)| {
            (
                if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                },
                Json(v),
            )
        })
}

/// `GET /v1/events` options.
#[derive(Clone, Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Events after this sequence number (0: every event kept).
    #[serde(default)]
    #[param(minimum = 0)]
    pub since: u64,
    /// Seconds to wait for an event when there is none yet (long poll; at
    /// most the request timeout less a second; 0: answer at once).
    #[serde(default)]
    #[param(minimum = 0, maximum = 60)]
    pub wait: u64,
}

/// VM state changes and division moves, as a long poll: answered at once
/// with the events after `since`, or when the next one happens, or after
/// `wait` seconds with none.
#[utoipa::path(get, path = "/v1/events", tag = "vms", params(EventsQuery),
    responses(
        (status = 200, description = "The events after `since`", body = Events),
        (status = 400, description = "A bad query", body = ApiError)))]
async fn get_events(
    State(st): State<AppState>,
    uri: axum::http::Uri,
) -> Result<Json<Events>, ApiError> {
    let q: EventsQuery = query(&uri)?;
    let limit = st
        .host
        .cfg
        .request_timeout
        .saturating_sub(std::time::Duration::from_secs(1));
    let wait = std::time::Duration::from_secs(q.wait).min(limit);
    let mut rx = st.host.subscribe();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let (events, next) = st.host.events_since(q.since);
        if !events.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(Json(Events { events, next }));
        }
        if tokio::time::timeout_at(deadline, rx.changed())
            .await
            .is_err()
        {
            let (events, next) = st.host.events_since(q.since);
            return Ok(Json(Events { events, next }));
        }
    }
}

/// Liveness: 200 while the service answers.
#[utoipa::path(get, path = "/healthz", tag = "meta",
    responses((status = 200, description = "The service answers", body = Health)))]
async fn healthz(State(st): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        boot_id: st.host.boot_id.clone(),
        reasons: Vec::new(),
    })
}

/// Readiness: 200 when the service takes changes (not shutting down, its
/// rebalancer going round); 503 with the reasons otherwise.
#[utoipa::path(get, path = "/readyz", tag = "meta",
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Not ready, and why", body = Health)))]
async fn readyz(State(st): State<AppState>) -> (StatusCode, Json<Health>) {
    let mut reasons = Vec::new();
    if st.host.shutting_down() {
        reasons.push("the service is shutting down".to_string());
    }
    let age = st.host.heartbeat_age_s();
    if age > READY_HEARTBEAT_S {
        reasons.push(format!("the rebalancer has not gone round for {age:.0} s"));
    }
    let status = if reasons.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(Health {
            status: if reasons.is_empty() {
                "ready"
            } else {
                "not_ready"
            }
            .into(),
            boot_id: st.host.boot_id.clone(),
            reasons,
        }),
    )
}

/// Longest silence of the rebalancer before `/readyz` says not ready.
const READY_HEARTBEAT_S: f64 = 30.0;

/// Changes a VM's fast share; answered while the VM converges (GET shows
/// `target_bytes` next to `used_bytes`).
#[utoipa::path(patch, path = "/v1/vms/{id}/fast", tag = "vms", request_body = FastRequest,
    params(("id" = String, Path, description = "VM id")),
    responses(
        (status = 202, description = "Accepted; converging", body = FastInfo),
        (status = 400, description = "Bad input", body = ApiError),
        (status = 404, description = "No such VM", body = ApiError),
        (status = 409, description = "The min does not fit, or the VM is not running or unresponsive (nothing was changed)", body = ApiError),
        (status = 413, description = "Body too large", body = ApiError),
        (status = 503, description = "Shutting down", body = ApiError)))]
async fn patch_fast(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    JsonBody(p): JsonBody<FastRequest>,
) -> Result<(StatusCode, Json<FastInfo>), ApiError> {
    let id = path_id(id)?;
    let h = st.host.clone();
    blocking(move || h.patch_fast(&id, &p))
        .await
        .map(|f| (StatusCode::ACCEPTED, Json(f)))
}

/// Switches a VM's placement policy live (the engine hands its state over).
/// Answered once the VM queued the switch; GET shows `policy` (running)
/// next to `policy_requested` until the VM took it (or `policy_error`).
#[utoipa::path(put, path = "/v1/vms/{id}/policy", tag = "vms", request_body = PutPolicy,
    params(("id" = String, Path, description = "VM id")),
    responses(
        (status = 202, description = "Accepted; the VM takes the switch at its next sample", body = VmInfo),
        (status = 400, description = "Not a placement policy", body = ApiError),
        (status = 404, description = "No such VM", body = ApiError),
        (status = 409, description = "The VM is not running", body = ApiError),
        (status = 413, description = "Body too large", body = ApiError),
        (status = 503, description = "Shutting down", body = ApiError)))]
async fn put_policy(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    JsonBody(p): JsonBody<PutPolicy>,
) -> Result<(StatusCode, Json<VmInfo>), ApiError> {
    let id = path_id(id)?;
    let h = st.host.clone();
    blocking(move || h.put_policy(&id, &p))
        .await
        .map(|v| (StatusCode::ACCEPTED, Json(v)))
}

/// The VM's run report: the same JSON as `tiervm run --report json` (docs/report.md).
#[utoipa::path(get, path = "/v1/vms/{id}/report", tag = "vms",
    params(("id" = String, Path, description = "VM id")),
    responses(
        (status = 200, description = "The run report (docs/report.md)", body = Object),
        (status = 404, description = "No such VM, or it left no report", body = ApiError),
        (status = 409, description = "The VM still runs", body = ApiError)))]
async fn get_report(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = path_id(id)?;
    let h = st.host.clone();
    blocking(move || h.report(&id)).await.map(Json)
}

/// This document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "meta",
    responses((status = 200, description = "The OpenAPI 3 document", body = Object, content_type = "application/json")))]
async fn openapi_json(State(st): State<AppState>) -> Response {
    let doc = st.openapi.get().cloned().unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/json")], doc).into_response()
}

/// Prometheus metrics (text exposition format 0.0.4).
#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses((status = 200, description = "The metrics", body = String,
        content_type = "text/plain; version=0.0.4; charset=utf-8")))]
async fn metrics(State(st): State<AppState>) -> Result<Response, ApiError> {
    let h = st.host.clone();
    let m = st.metrics.clone();
    let text = blocking(move || super::metrics::render(&h, &m)).await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(
        format!("no route {} {}", req.method(), req.uri().path()),
        "the API is under /v1 (GET /v1/openapi.json lists the routes)",
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::method_not_allowed(format!(
        "{} is not allowed on {}",
        req.method(),
        req.uri().path()
    ))
}

/// The most bytes of a request's head (request line and headers) the
/// service serves: 431 `headers_too_large` above. The HTTP layer's own
/// limit is on its read buffer, which one read may overrun (a single
/// 100 KB header was served), so the head is measured here too.
pub const MAX_HEAD_BYTES: usize = 64 << 10;

/// The size of a request's head as it was sent: the request line and
/// every `name: value` line.
fn head_bytes(req: &Request) -> usize {
    let line = req.method().as_str().len() + req.uri().to_string().len() + 12;
    line + req
        .headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + v.as_bytes().len() + 4)
        .sum::<usize>()
}

/// Refuses changes while shutting down, bounds the time of every request,
/// and counts requests and latencies.
async fn guard(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    req.extensions_mut().insert(BodyLimit(st.host.cfg.max_body));
    let response = if head_bytes(&req) > MAX_HEAD_BYTES {
        ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!(
                "the request's headers are {} bytes, over the {} KiB the service reads",
                head_bytes(&req),
                MAX_HEAD_BYTES >> 10
            ),
            "send fewer or shorter headers",
        )
        .into_response()
    } else if method == Method::HEAD {
        // Not in the API document, so not served (axum would answer HEAD
        // for every GET route).
        ApiError::method_not_allowed(format!("HEAD is not allowed on {}", req.uri().path()))
            .into_response()
    } else if st.host.shutting_down() && method != Method::GET {
        ApiError::shutting_down().into_response()
    } else {
        let limit = st.host.cfg.request_timeout;
        match tokio::time::timeout(limit, next.run(req)).await {
            Ok(r) => r,
            Err(_) => ApiError::timeout(limit).into_response(),
        }
    };
    st.metrics.observe(
        method.as_str(),
        &route,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

/// The router of the TCP metrics listener: `GET /metrics` only.
pub fn metrics_router(st: AppState) -> axum::Router {
    axum::Router::new()
        .route("/metrics", axum::routing::get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(st.clone(), guard))
        .with_state(st)
}

/// The router and the OpenAPI document it implies.
pub fn router(st: AppState) -> (axum::Router, utoipa::openapi::OpenApi) {
    let limit = st.host.cfg.max_body;
    let (router, doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(get_host, patch_host))
        .routes(routes!(list_vms, create_vm))
        .routes(routes!(get_vm, put_vm, delete_vm))
        .routes(routes!(get_events))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(patch_fast))
        .routes(routes!(put_policy))
        .routes(routes!(get_report))
        .routes(routes!(openapi_json))
        .routes(routes!(metrics))
        .split_for_parts();
    let router = router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(st.clone(), guard))
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .with_state(st.clone());
    let json = doc.to_pretty_json().unwrap_or_default();
    let _ = st.openapi.set(json);
    (router, doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use proptest::prelude::*;
    use tower::ServiceExt;

    fn app() -> (axum::Router, Arc<Host>) {
        let cfg = super::super::config::ServeConfig::for_tests();
        let host = Host::new(cfg);
        let st = AppState {
            host: host.clone(),
            openapi: Arc::new(OnceLock::new()),
            metrics: Arc::new(ApiMetrics::default()),
        };
        (router(st).0, host)
    }

    fn call(app: &axum::Router, method: &str, uri: &str, body: Vec<u8>) -> Option<(u16, Vec<u8>)> {
        let req = axum::http::Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::from(body))
            .ok()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        rt.block_on(async {
            let resp = app.clone().oneshot(req).await.ok()?;
            let status = resp.status().as_u16();
            let bytes = axum::body::to_bytes(resp.into_body(), 1 << 24).await.ok()?;
            Some((status, bytes.to_vec()))
        })
    }

    fn check_answer(status: u16, body: &[u8]) -> Result<(), TestCaseError> {
        prop_assert!(
            [200, 201, 202, 204, 400, 404, 405, 409, 413].contains(&status),
            "status {status}: {}",
            String::from_utf8_lossy(body)
        );
        if status >= 400 {
            let e: serde_json::Value = serde_json::from_slice(body)
                .map_err(|_| TestCaseError::fail("an error body is JSON"))?;
            for k in ["code", "message", "fix"] {
                prop_assert!(
                    e[k].as_str().is_some_and(|s| !s.is_empty()),
                    "error field {k}: {e}"
                );
            }
        }
        Ok(())
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(|f| serde_json::json!(f)),
            "[a-zA-Z0-9 ._/-]{0,12}".prop_map(serde_json::Value::from),
            prop_oneof![
                Just("512M"),
                Just("3M"),
                Just("1G"),
                Just("-1"),
                Just("99999T"),
                Just("zipf"),
                Just("nomad")
            ]
            .prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            let keys = prop_oneof![
                Just("image".to_string()),
                Just("mem".to_string()),
                Just("fast".to_string()),
                Just("min".to_string()),
                Just("max".to_string()),
                Just("weight".to_string()),
                Just("policy".to_string()),
                Just("args".to_string()),
                Just("fast_pool".to_string()),
                Just("slow_pool".to_string()),
                Just("vcpus".to_string()),
                Just("duration".to_string()),
                "[a-z_]{1,8}",
            ];
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map(keys, inner, 0..5)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn path() -> impl Strategy<Value = String> {
        let seg = "[a-zA-Z0-9%._~{}-]{0,10}";
        prop_oneof![
            Just("/v1/host".to_string()),
            Just("/v1/vms".to_string()),
            Just("/metrics".to_string()),
            Just("/v1/openapi.json".to_string()),
            seg.prop_map(|s| format!("/v1/vms/{s}")),
            seg.prop_map(|s| format!("/v1/vms/{s}/fast")),
            seg.prop_map(|s| format!("/v1/vms/{s}/policy")),
            seg.prop_map(|s| format!("/v1/vms/{s}/report")),
            proptest::collection::vec(seg, 0..5).prop_map(|v| format!("/{}", v.join("/"))),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn arbitrary_json_and_paths_get_a_json_answer(
            method in prop_oneof![Just("GET"), Just("POST"), Just("PUT"), Just("PATCH"), Just("DELETE"), Just("HEAD")],
            path in path(),
            body in prop_oneof![
                json_value().prop_map(|v| v.to_string().into_bytes()),
                proptest::collection::vec(any::<u8>(), 0..64),
            ],
        ) {
            let (app, _host) = app();
            if let Some((status, body)) = call(&app, method, &path, body) {
                if method != "HEAD" {
                    check_answer(status, &body)?;
                }
            }
        }

        #[test]
        fn body_parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256), v in json_value()) {
            let _ = parse_json::<CreateVm>(&bytes);
            let _ = parse_json::<FastRequest>(&bytes);
            let s = v.to_string();
            for r in [
                parse_json::<CreateVm>(s.as_bytes()).err(),
                parse_json::<PatchHost>(s.as_bytes()).err(),
                parse_json::<PutPolicy>(s.as_bytes()).err(),
            ].into_iter().flatten() {
                prop_assert_eq!(r.status, 400);
            }
        }
    }

    /// docs/openapi.json is the document the server serves (regenerate it
    /// with `TIERVM_UPDATE_OPENAPI=1 cargo test -p tiervm-service --lib openapi_copy`).
    #[test]
    fn the_openapi_copy_in_docs_is_what_the_server_serves() {
        let (_, host) = app();
        let st = AppState {
            host,
            openapi: Arc::new(OnceLock::new()),
            metrics: Arc::new(ApiMetrics::default()),
        };
        let (_, doc) = router(st);
        let served = doc.to_pretty_json().unwrap() + "\n";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
        if std::env::var_os("TIERVM_UPDATE_OPENAPI").is_some() {
            std::fs::write(&path, &served).unwrap();
        }
        let copy = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            copy == served,
            "docs/openapi.json differs from the served document: regenerate it with \
             TIERVM_UPDATE_OPENAPI=1 cargo test -p tiervm-service --lib openapi_copy"
        );
    }

    #[test]
    fn changes_are_refused_with_503_while_shutting_down() {
        let (app, host) = app();
        host.shutdown();
        let (st, body) = call(&app, "POST", "/v1/vms", br#"{"image":"zipf"}"#.to_vec()).unwrap();
        assert_eq!(st, 503, "{}", String::from_utf8_lossy(&body));
        let e: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(e["code"], "shutting_down");
        let (st, _) = call(&app, "GET", "/v1/host", Vec::new()).unwrap();
        assert_eq!(st, 200, "reads still work while the VMs stop");
    }

    #[test]
    fn host_paths_are_not_images_without_an_image_dir() {
        let (app, _host) = app();
        for image in ["/proc/kmsg", "/etc/passwd", "../zipf", "."] {
            let body = format!(r#"{{"image":"{image}"}}"#).into_bytes();
            let (st, body) = call(&app, "POST", "/v1/vms", body).unwrap();
            let e: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(st, 400, "{image}: {e}");
            assert!(
                e["message"]
                    .as_str()
                    .unwrap()
                    .contains("not a built-in image"),
                "{e}"
            );
            assert!(e["fix"].as_str().unwrap().contains("image_dir"), "{e}");
        }
    }

    #[test]
    fn only_plain_file_names_reach_the_image_dir() {
        let dir = std::env::temp_dir().join(format!("tiervm-images-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("mine.elf"), b"\x7fELF").unwrap();
        std::fs::write(dir.join("secret"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc/shadow", dir.join("shadow")).unwrap();
        std::os::unix::fs::symlink(dir.join("mine.elf"), dir.join("link.elf")).unwrap();
        let mut cfg = super::super::config::ServeConfig::for_tests();
        cfg.image_dir = Some(dir.clone());
        let host = Host::new(cfg);
        assert_eq!(host.image_of("zipf").unwrap(), "zipf");
        assert_eq!(
            host.image_of("mine.elf").unwrap(),
            dir.join("mine.elf").to_string_lossy()
        );
        for bad in ["", ".", "..", "../x", "/proc/kmsg", "a/b", "a\0b"] {
            assert!(host.image_of(bad).is_err(), "{bad:?} accepted");
        }
        // A missing file names no host path; a link is refused with one
        // answer whatever it points to.
        let e = host.image_of("nothere").unwrap_err();
        assert!(!e.message.contains(&*dir.to_string_lossy()), "{e:?}");
        let (a, b) = (
            host.image_of("shadow").unwrap_err(),
            host.image_of("link.elf").unwrap_err(),
        );
        assert_eq!(
            a.message.replace("shadow", "X"),
            b.message.replace("link.elf", "X"),
            "links answer alike"
        );
        assert!(!a.message.contains(&*dir.to_string_lossy()), "{a:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
