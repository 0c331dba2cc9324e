//! What survives a restart of the service, in its state directory:
//! `service.json` (the boot id of the run that wrote it, the next
//! generated VM number) and one record per VM, `vms/ID.json` (identity,
//! labels, spec, and how it ended). A restarted service lists the VMs of
//! the runs before it (`GET /v1/vms`) with how each ended, and never
//! generates an id it generated before.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;

use serde::{Deserialize, Serialize};

use vmm_core::config::VmRequest;
use vmm_core::tiering_config::{PolicyArg, TieringRequest, TrackingArg};

use super::protocol::{ProfileSettings, WorkerStart};
use super::types::CreateVm;

/// `STATE_DIR/service.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServiceRecord {
    /// The run of the service that wrote it.
    pub boot_id: String,
    /// Its start, Unix seconds.
    pub started_unix: f64,
    /// The number of the next generated id (`vm-N`).
    pub next_id: u64,
    /// Its process id.
    pub pid: u32,
}

/// One VM, `STATE_DIR/vms/ID.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VmRecord {
    /// Id (name).
    pub id: String,
    /// UUID.
    pub uuid: String,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The service run that created it.
    pub boot_id: String,
    /// Creation, Unix seconds.
    pub created_unix: f64,
    /// End, Unix seconds.
    pub ended_unix: Option<f64>,
    /// State when written.
    pub state: String,
    /// How it ended.
    pub stop_reason: Option<String>,
    /// The worker's exit code.
    pub exit_code: Option<i32>,
    /// The signal that ended the worker.
    pub exit_signal: Option<i32>,
    /// The guest's exit code.
    pub guest_exit_code: Option<u32>,
    /// The failure.
    pub error: Option<String>,
    /// What it ran (records of services before the VM description was
    /// one type hold the flat form, `LegacyVmSpec`: read, never written).
    #[serde(deserialize_with = "current_or_legacy")]
    pub spec: WorkerStart,
    /// Fast min, bytes.
    pub min: u64,
    /// Fast max, bytes.
    pub max: u64,
    /// Weight.
    pub weight: f64,
    /// The policy last running.
    pub policy: String,
    /// The request that created it.
    pub request: Option<CreateVm>,
}

/// A record's `spec`, in the form this service writes or the one before.
#[derive(Deserialize)]
#[serde(untagged)]
enum StoredSpec {
    Current(Box<WorkerStart>),
    Legacy(Box<LegacyVmSpec>),
}

/// Reads a record's `spec` in either form.
fn current_or_legacy<'de, D: serde::Deserializer<'de>>(d: D) -> Result<WorkerStart, D::Error> {
    Ok(match StoredSpec::deserialize(d)? {
        StoredSpec::Current(s) => *s,
        StoredSpec::Legacy(s) => (*s).into(),
    })
}

/// The flat VM description older services wrote in records (then called
/// `VmSpec`, also their start message to the worker): read only, to list
/// the VMs of those runs.
#[derive(Deserialize)]
struct LegacyVmSpec {
    id: String,
    image: String,
    args: Vec<String>,
    mem_bytes: u64,
    vcpus: u32,
    seed: u64,
    policy: String,
    tracking: Option<String>,
    fast_bytes: u64,
    slow_bytes: u64,
    fast_node: u32,
    slow_node: u32,
    duration_s: f64,
    stop_grace_s: f64,
    quantum_pages: u64,
    curve_steps: usize,
    profile_half_life_s: f64,
    #[serde(default = "seccomp_on")]
    seccomp: bool,
    #[serde(default)]
    emulate_latency: Option<String>,
}

fn seccomp_on() -> bool {
    true
}

impl From<LegacyVmSpec> for WorkerStart {
    /// As the worker of those services read it: every tier setting given,
    /// a duration that is no duration 0 (until the guest exits), a stop
    /// grace that is none the default 10 s. A policy or tracking name that
    /// is none (those services wrote only valid ones) is left out: the
    /// record still loads, and its own `policy` names what ran.
    fn from(s: LegacyVmSpec) -> Self {
        let secs = |x: f64| vmm_core::units::duration_of_secs(x.max(0.0)).ok();
        let vm = VmRequest {
            image: s.image,
            args: s.args,
            mem_bytes: s.mem_bytes,
            vcpus: s.vcpus,
            duration: secs(s.duration_s).unwrap_or_default(),
            seed: s.seed,
            stop_grace: secs(s.stop_grace_s).unwrap_or(vmm_core::config::DEFAULT_STOP_GRACE),
            seccomp: s.seccomp,
            tiering: TieringRequest {
                fast: Some(s.fast_bytes),
                slow: Some(s.slow_bytes),
                fast_node: Some(s.fast_node),
                slow_node: Some(s.slow_node),
                policy: s.policy.parse::<PolicyArg>().ok(),
                tracking: s.tracking.and_then(|t| t.parse::<TrackingArg>().ok()),
                ..TieringRequest::default()
            },
            emulate_latency: s.emulate_latency,
            ..VmRequest::default()
        };
        Self {
            id: s.id,
            vm,
            profile: ProfileSettings {
                quantum_pages: s.quantum_pages,
                curve_steps: s.curve_steps,
                half_life_s: s.profile_half_life_s,
            },
        }
    }
}

const MAX_RECORD: u64 = 1 << 20;

fn read_small(dir: &OwnedFd, name: &str) -> Option<Vec<u8>> {
    let f = super::paths::open_read_at(dir, name).ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_RECORD {
        return None;
    }
    let mut v = Vec::new();
    f.take(MAX_RECORD).read_to_end(&mut v).ok()?;
    Some(v)
}

/// The record of the run before, if any.
pub fn load_service(root: &OwnedFd) -> Option<ServiceRecord> {
    serde_json::from_slice(&read_small(root, "service.json")?).ok()
}

/// Writes this run's record.
pub fn save_service(root: &OwnedFd, r: &ServiceRecord) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?;
    super::paths::write_file_at(root, "service.json", &bytes)
}

/// The newest `keep` VM records of `STATE_DIR/vms` (oldest first); files
/// that do not parse are skipped with a warning.
pub fn load_vms(state_dir: &Path, dir: &OwnedFd, keep: usize) -> Vec<VmRecord> {
    let Ok(entries) = std::fs::read_dir(state_dir.join("vms")) else {
        return Vec::new();
    };
    let mut out: Vec<VmRecord> = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".json") || name.starts_with('.') {
            continue;
        }
        match read_small(dir, &name).map(|b| serde_json::from_slice::<VmRecord>(&b)) {
            Some(Ok(r)) if format!("{}.json", r.id) == name => out.push(r),
            _ => tracing::warn!("vms/{name}: not a VM record; left alone"),
        }
    }
    out.sort_by(|a, b| a.created_unix.total_cmp(&b.created_unix));
    let drop = out.len().saturating_sub(keep);
    out.drain(..drop);
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A record as the service wrote it before the VM description was one
    /// type (`spec` the flat `VmSpec`), copied from that code's output.
    const OLD_RECORD: &str = r#"{
  "id": "vm-7",
  "uuid": "0b7c4d1e-6f55-4c1a-9e0e-3a8f2d9c1b77",
  "labels": {
    "team": "mem"
  },
  "boot_id": "4f1e2d3c-aaaa-bbbb-cccc-000011112222",
  "created_unix": 1760000000.5,
  "ended_unix": 1760000061.25,
  "state": "stopped",
  "stop_reason": "duration",
  "exit_code": 0,
  "exit_signal": null,
  "guest_exit_code": 0,
  "error": null,
  "spec": {
    "id": "vm-7",
    "image": "gups",
    "args": [
      "wss=64M",
      "hot=0.1"
    ],
    "mem_bytes": 536870912,
    "vcpus": 2,
    "seed": 42,
    "policy": "nomad",
    "tracking": "hint-faults",
    "fast_bytes": 134217728,
    "slow_bytes": 536870912,
    "fast_node": 0,
    "slow_node": 1,
    "duration_s": 60.0,
    "stop_grace_s": 10.0,
    "quantum_pages": 16384,
    "curve_steps": 64,
    "profile_half_life_s": 20.0,
    "seccomp": true,
    "emulate_latency": "nomad-a"
  },
  "min": 134217728,
  "max": 268435456,
  "weight": 2.0,
  "policy": "nomad",
  "request": {
    "image": "gups",
    "args": [
      "wss=64M",
      "hot=0.1"
    ],
    "mem": 536870912,
    "vcpus": 2,
    "policy": "nomad",
    "tracking": "hint-faults",
    "fast": {
      "min": 134217728,
      "max": 268435456,
      "weight": 2.0
    },
    "duration": "60s",
    "seed": 42,
    "labels": {
      "team": "mem"
    },
    "emulate_latency": ""
  }
}"#;

    /// What [`OLD_RECORD`]'s spec says, in the current form.
    fn old_record_spec() -> WorkerStart {
        WorkerStart {
            id: "vm-7".into(),
            vm: VmRequest {
                image: "gups".into(),
                args: vec!["wss=64M".into(), "hot=0.1".into()],
                mem_bytes: 512 << 20,
                vcpus: 2,
                seed: 42,
                duration: Duration::from_secs(60),
                stop_grace: Duration::from_secs(10),
                seccomp: true,
                emulate_latency: Some("nomad-a".into()),
                tiering: TieringRequest {
                    fast: Some(128 << 20),
                    slow: Some(512 << 20),
                    fast_node: Some(0),
                    slow_node: Some(1),
                    policy: Some(PolicyArg::Nomad),
                    tracking: Some(TrackingArg::HintFaults),
                    ..TieringRequest::default()
                },
                ..VmRequest::default()
            },
            profile: ProfileSettings {
                quantum_pages: 16384,
                curve_steps: 64,
                half_life_s: 20.0,
            },
        }
    }

    #[test]
    fn an_old_record_loads_with_every_field() {
        let r: VmRecord = serde_json::from_str(OLD_RECORD).unwrap();
        assert_eq!(r.spec, old_record_spec());
        assert_eq!(
            (r.id.as_str(), r.uuid.as_str()),
            ("vm-7", "0b7c4d1e-6f55-4c1a-9e0e-3a8f2d9c1b77")
        );
        assert_eq!(r.labels["team"], "mem");
        assert_eq!(r.boot_id, "4f1e2d3c-aaaa-bbbb-cccc-000011112222");
        assert_eq!(
            (r.created_unix, r.ended_unix),
            (1760000000.5, Some(1760000061.25))
        );
        assert_eq!(
            (r.state.as_str(), r.stop_reason.as_deref()),
            ("stopped", Some("duration"))
        );
        assert_eq!(
            (r.exit_code, r.exit_signal, r.guest_exit_code),
            (Some(0), None, Some(0))
        );
        assert_eq!(r.error, None);
        assert_eq!((r.min, r.max, r.weight), (128 << 20, 256 << 20, 2.0));
        assert_eq!(r.policy, "nomad");
        let req = r.request.unwrap();
        assert_eq!((req.image.as_str(), req.seed), ("gups", Some(42)));
        assert_eq!(req.emulate_latency.as_deref(), Some(""));
        // Written again, it is in the current form, and reads back the same.
        let again = serde_json::to_value(VmRecord {
            request: Some(req),
            ..r
        })
        .unwrap();
        assert_eq!(again["spec"]["vm"]["image"], "gups");
        assert!(again["spec"].get("image").is_none());
        let back: VmRecord = serde_json::from_value(again).unwrap();
        assert_eq!(back.spec, old_record_spec());
    }

    #[test]
    fn older_records_without_seccomp_or_emulation_load_too() {
        let mut v: serde_json::Value = serde_json::from_str(OLD_RECORD).unwrap();
        let spec = v["spec"].as_object_mut().unwrap();
        spec.remove("seccomp");
        spec.remove("emulate_latency");
        spec.insert("tracking".into(), serde_json::Value::Null);
        spec.insert("duration_s".into(), 0.into());
        let r: VmRecord = serde_json::from_value(v).unwrap();
        assert!(r.spec.vm.seccomp);
        assert_eq!(r.spec.vm.emulate_latency, None);
        assert_eq!(r.spec.vm.tiering.tracking, None);
        assert_eq!(r.spec.vm.duration, Duration::ZERO);
    }

    #[test]
    fn a_new_record_round_trips() {
        let mut r: VmRecord = serde_json::from_str(OLD_RECORD).unwrap();
        r.spec.vm.tiering.tracking = Some(TrackingArg::Off);
        r.spec.vm.duration = Duration::from_millis(1500);
        r.spec.vm.emulate_latency = None;
        let text = serde_json::to_string_pretty(&r).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["spec"]["id"], "vm-7");
        assert_eq!(v["spec"]["vm"]["duration_s"], 1.5);
        assert_eq!(v["spec"]["vm"]["tiering"]["tracking"], "off");
        assert_eq!(v["spec"]["profile"]["half_life_s"], 20.0);
        let back: VmRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(back.spec, r.spec);
        assert_eq!(serde_json::to_string_pretty(&back).unwrap(), text);
    }

    #[test]
    fn a_spec_of_neither_form_is_refused() {
        let mut v: serde_json::Value = serde_json::from_str(OLD_RECORD).unwrap();
        v["spec"]["vm"] = serde_json::json!({"tiering": {"policy": "bogus"}});
        v["spec"].as_object_mut().unwrap().remove("policy");
        assert!(serde_json::from_value::<VmRecord>(v).is_err());
        for spec in [
            serde_json::json!(null),
            serde_json::json!({}),
            serde_json::json!([1]),
        ] {
            let mut v: serde_json::Value = serde_json::from_str(OLD_RECORD).unwrap();
            v["spec"] = spec;
            assert!(serde_json::from_value::<VmRecord>(v).is_err());
        }
    }
}
