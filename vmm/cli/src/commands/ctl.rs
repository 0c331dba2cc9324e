//! `tiervm ctl`: a client of `tiervm serve` for every API route (like
//! Cloud Hypervisor's `ch-remote`). Prints the service's JSON answer; an
//! error answer is printed as "status code: message: fix" with exit 1.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};

use crate::error::Result;
use vmm_core::units::parse_duration;
use vmm_service::client;
use vmm_service::config::DEFAULT_SOCKET;

/// Flags of `tiervm ctl`.
#[derive(Clone, Debug, Args)]
pub struct CtlArgs {
    /// The service's socket.
    #[arg(long, default_value = DEFAULT_SOCKET, value_name = "PATH")]
    pub socket: PathBuf,
    /// Longest wait for an answer (and, with --wait, for the change).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// After an accepted change, poll GET /v1/vms/{id} until it took
    /// effect, and print the VM then: create until the VM left `starting`
    /// (with --duration: until the run ended; a VM that failed, or whose
    /// guest exited non-zero, exits 1), policy until `policy` is
    /// `policy_requested` (or a `policy_error`), fast until `converged`,
    /// delete until the VM ended.
    #[arg(long)]
    pub wait: bool,
    /// What to do.
    #[command(subcommand)]
    pub op: CtlOp,
}

/// One API call.
#[derive(Clone, Debug, Subcommand)]
pub enum CtlOp {
    /// GET /v1/host: pools and VMs.
    Host,
    /// PATCH /v1/host: change the pool sizes.
    SetPools {
        /// New fast pool, e.g. 8G.
        #[arg(long)]
        fast_pool: Option<String>,
        /// New slow pool.
        #[arg(long)]
        slow_pool: Option<String>,
    },
    /// GET /v1/vms.
    List,
    /// POST /v1/vms: create and start a VM.
    Create(Box<CreateFlags>),
    /// GET /v1/vms/{id}.
    Get {
        /// VM id.
        id: String,
    },
    /// DELETE /v1/vms/{id}: stop a VM, or remove an ended one.
    Delete {
        /// VM id.
        id: String,
        /// Kill the VM's process at once (for an unresponsive VM).
        #[arg(long)]
        force: bool,
    },
    /// PATCH /v1/vms/{id}/fast: change a VM's fast share.
    Fast {
        /// VM id.
        id: String,
        /// Guaranteed fast bytes.
        #[arg(long)]
        min: Option<String>,
        /// Most fast bytes.
        #[arg(long)]
        max: Option<String>,
        /// Weight.
        #[arg(long)]
        weight: Option<f64>,
    },
    /// PUT /v1/vms/{id}/policy: switch the policy live.
    Policy {
        /// VM id.
        id: String,
        /// static, tpp, nomad, memtis, colloid, mtm.
        policy: String,
    },
    /// GET /v1/vms/{id}/report: the run report of an ended VM.
    Report {
        /// VM id.
        id: String,
    },
    /// GET /metrics.
    Metrics,
    /// GET /v1/openapi.json.
    Openapi,
}

/// `ctl create` flags.
#[derive(Clone, Debug, Args)]
pub struct CreateFlags {
    /// Built-in image, or the file name of an image in the service's `image_dir`.
    pub image: String,
    /// Guest RAM, e.g. 1G.
    #[arg(long)]
    pub mem: Option<String>,
    /// vCPUs.
    #[arg(long)]
    pub vcpus: Option<u32>,
    /// Placement policy.
    #[arg(long)]
    pub policy: Option<String>,
    /// hint-faults or off.
    #[arg(long)]
    pub tracking: Option<String>,
    /// Guaranteed fast bytes.
    #[arg(long)]
    pub fast_min: Option<String>,
    /// Most fast bytes.
    #[arg(long)]
    pub fast_max: Option<String>,
    /// Weight.
    #[arg(long)]
    pub weight: Option<f64>,
    /// Run length, e.g. 60s.
    #[arg(long)]
    pub duration: Option<String>,
    /// Seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Workload argument key=value (repeatable).
    #[arg(long = "arg", value_name = "KEY=VALUE")]
    pub args: Vec<String>,
    /// Name the VM (PUT /v1/vms/NAME: idempotent) instead of a generated id.
    #[arg(long)]
    pub name: Option<String>,
    /// A label key=value for the VM (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Emulate tier latency in the guest (as `tiervm run
    /// --emulate-latency`): a preset and/or fast=LAT,slow=LAT,...; alone:
    /// the default preset.
    #[arg(long, value_name = "SPEC", num_args = 0..=1, default_missing_value = "")]
    pub emulate_latency: Option<String>,
}

fn put(m: &mut Map<String, Value>, k: &str, v: Option<Value>) {
    if let Some(v) = v {
        m.insert(k.into(), v);
    }
}

/// The method, path and body of an operation.
pub fn request_of(op: &CtlOp) -> (&'static str, String, Option<Value>) {
    match op {
        CtlOp::Host => ("GET", "/v1/host".into(), None),
        CtlOp::SetPools {
            fast_pool,
            slow_pool,
        } => {
            let mut m = Map::new();
            put(&mut m, "fast_pool", fast_pool.clone().map(Value::from));
            put(&mut m, "slow_pool", slow_pool.clone().map(Value::from));
            ("PATCH", "/v1/host".into(), Some(Value::Object(m)))
        }
        CtlOp::List => ("GET", "/v1/vms".into(), None),
        CtlOp::Create(c) => {
            let m = create_body(c);
            match &c.name {
                Some(n) => ("PUT", format!("/v1/vms/{}", enc(n)), Some(Value::Object(m))),
                None => ("POST", "/v1/vms".into(), Some(Value::Object(m))),
            }
        }
        CtlOp::Get { id } => ("GET", format!("/v1/vms/{}", enc(id)), None),
        CtlOp::Delete { id, force } => (
            "DELETE",
            format!(
                "/v1/vms/{}{}",
                enc(id),
                if *force { "?force=true" } else { "" }
            ),
            None,
        ),
        CtlOp::Fast {
            id,
            min,
            max,
            weight,
        } => {
            let mut m = Map::new();
            put(&mut m, "min", min.clone().map(Value::from));
            put(&mut m, "max", max.clone().map(Value::from));
            put(&mut m, "weight", weight.map(Value::from));
            (
                "PATCH",
                format!("/v1/vms/{}/fast", enc(id)),
                Some(Value::Object(m)),
            )
        }
        CtlOp::Policy { id, policy } => (
            "PUT",
            format!("/v1/vms/{}/policy", enc(id)),
            Some(json!({ "policy": policy })),
        ),
        CtlOp::Report { id } => ("GET", format!("/v1/vms/{}/report", enc(id)), None),
        CtlOp::Metrics => ("GET", "/metrics".into(), None),
        CtlOp::Openapi => ("GET", "/v1/openapi.json".into(), None),
    }
}

/// The body of `POST /v1/vms` (or `PUT /v1/vms/{name}`) for `c`.
fn create_body(c: &CreateFlags) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("image".into(), json!(c.image));
    m.insert("args".into(), json!(c.args));
    put(&mut m, "mem", c.mem.clone().map(Value::from));
    put(&mut m, "vcpus", c.vcpus.map(Value::from));
    put(&mut m, "policy", c.policy.clone().map(Value::from));
    put(&mut m, "tracking", c.tracking.clone().map(Value::from));
    put(&mut m, "duration", c.duration.clone().map(Value::from));
    put(&mut m, "seed", c.seed.map(Value::from));
    put(
        &mut m,
        "emulate_latency",
        c.emulate_latency.clone().map(Value::from),
    );
    let mut f = Map::new();
    put(&mut f, "min", c.fast_min.clone().map(Value::from));
    put(&mut f, "max", c.fast_max.clone().map(Value::from));
    put(&mut f, "weight", c.weight.map(Value::from));
    if !f.is_empty() {
        m.insert("fast".into(), Value::Object(f));
    }
    if !c.labels.is_empty() {
        let l: Map<String, Value> = c
            .labels
            .iter()
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (k.to_string(), Value::from(v))
            })
            .collect();
        m.insert("labels".into(), Value::Object(l));
    }
    m
}

/// Percent-encodes a path segment.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// How often `--wait` polls.
const WAIT_POLL: Duration = Duration::from_millis(100);

/// Whether the change `op` asked for shows in the VM `v` (see `--wait`).
pub fn took_effect(op: &CtlOp, v: &Value) -> bool {
    match op {
        // A run with a duration ends by itself: wait for its end, so that
        // a guest failing after it reached `running` fails the command.
        CtlOp::Create(c) if c.duration.is_some() => ended(v),
        CtlOp::Create(_) => v["state"] != "starting",
        CtlOp::Policy { .. } => {
            v["policy"] == v["policy_requested"] || !v["policy_error"].is_null()
        }
        CtlOp::Fast { .. } => v["fast"]["converged"] == true,
        CtlOp::Delete { .. } => ended(v),
        _ => true,
    }
}

/// Whether the VM `v` ended (or never started).
fn ended(v: &Value) -> bool {
    !["starting", "running", "unresponsive", "stopping"]
        .iter()
        .any(|s| v["state"] == *s)
}

/// The VM an accepted change concerns.
fn changed_vm<'a>(op: &'a CtlOp, answer: &'a Value) -> Option<&'a str> {
    match op {
        CtlOp::Create(_) => answer["id"].as_str(),
        CtlOp::Policy { id, .. } | CtlOp::Fast { id, .. } | CtlOp::Delete { id, .. } => Some(id),
        _ => None,
    }
}

/// Why the VM `v` ended badly, if it did: failed, crashed or lost, or its
/// guest exited with a non-zero code.
pub fn failed_run(v: &Value) -> Option<String> {
    let state = v["state"].as_str().unwrap_or("");
    if ["failed", "crashed", "lost"].contains(&state) {
        return Some(format!(
            "{state}: {}",
            v["error"].as_str().unwrap_or("see GET /v1/vms/{id}")
        ));
    }
    match v["guest_exit_code"].as_u64() {
        Some(c) if c != 0 => Some(format!("ended: its guest exited with code {c:#x}")),
        _ => None,
    }
}

/// Polls the VM until the change took effect or `timeout` passed; `None`
/// when the VM is gone (a removed VM).
fn wait_for_change(args: &CtlArgs, id: &str) -> Result<Option<(bool, Value)>> {
    let deadline = std::time::Instant::now() + args.timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let a = client::request(
            &args.socket,
            "GET",
            &format!("/v1/vms/{}", enc(id)),
            None,
            left.max(Duration::from_millis(100)),
        )
        .map_err(vmm_service::ServeError::from)?;
        if a.status == 404 {
            return Ok(None);
        }
        let v = a.json();
        if took_effect(&args.op, &v) {
            return Ok(Some((true, v)));
        }
        if left.is_zero() {
            return Ok(Some((false, v)));
        }
        std::thread::sleep(WAIT_POLL.min(left));
    }
}

/// Runs one `tiervm ctl` operation; returns the exit code.
pub fn run(args: &CtlArgs) -> Result<i32> {
    let (method, path, body) = request_of(&args.op);
    let body = body.map(|b| b.to_string());
    let a = client::request(
        &args.socket,
        method,
        &path,
        body.as_deref().map(str::as_bytes),
        args.timeout,
    )
    .map_err(vmm_service::ServeError::from)?;
    let out = if a.content_type.starts_with("application/json") && !a.body.is_empty() {
        serde_json::to_string_pretty(&a.json()).unwrap_or_else(|_| a.text())
    } else {
        a.text()
    };
    if (200..300).contains(&a.status) {
        let answer = if a.body.is_empty() {
            Value::Null
        } else {
            a.json()
        };
        if args.wait {
            if let Some(id) = changed_vm(&args.op, &answer).map(str::to_string) {
                match wait_for_change(args, &id)? {
                    Some((true, v)) => {
                        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
                        // A created VM that failed, crashed, or whose guest
                        // exited non-zero is a failure of the command.
                        if matches!(args.op, CtlOp::Create(_)) {
                            if let Some(why) = failed_run(&v) {
                                eprintln!("tiervm ctl: {id} {why}");
                                return Ok(1);
                            }
                        }
                        return Ok(0);
                    }
                    Some((false, v)) => {
                        eprintln!(
                            "tiervm ctl: {id}'s change did not take effect within {:?} (--timeout): {v}",
                            args.timeout
                        );
                        return Ok(1);
                    }
                    None => {
                        println!("{{\"status\": {}, \"removed\": \"{id}\"}}", a.status);
                        return Ok(0);
                    }
                }
            }
        }
        if !out.is_empty() {
            println!("{}", out.trim_end());
        } else {
            println!("{{\"status\": {}}}", a.status);
        }
        Ok(0)
    } else {
        let e = a.json();
        eprintln!(
            "tiervm ctl: {} {}: {}: {}",
            a.status,
            e["code"].as_str().unwrap_or("error"),
            e["message"].as_str().unwrap_or(&out),
            e["fix"].as_str().unwrap_or("")
        );
        Ok(1)
    }
}
