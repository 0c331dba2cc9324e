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

use super::protocol::VmSpec;
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
    /// What it ran.
    pub spec: VmSpec,
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
