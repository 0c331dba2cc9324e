//! The private channel between the service and one worker process (the
//! `tiervm` binary in its hidden worker mode, running one VM): JSON lines
//! over an inherited Unix socketpair.
//!
//! ```text
//!  service                                worker
//!  Start(WorkerStart)               ->
//!                                   <-    Event::Started { pid } | Event::Failed
//!  Request { id, SetCapacity | SwitchPolicy | Stats | Report | Stop | Exit }  ->
//!                                   <-    Reply { id, Ok(Reply) | Err(message) }
//!                                   <-    Event::Finished { .. } (the VM ended)
//! ```
//!
//! A worker that reads end-of-file stops its VM and exits: the service
//! going away never leaves a VM behind.

use std::io::{BufRead, Read};

use serde::{Deserialize, Serialize};
use tiering::engine::profile::{AccessRate, GainCurve};
use tiering::mem::{MemStats, ResizeDriverReport};
use vmm_core::config::VmRequest;

/// Longest line either side accepts (a report with a long timeline fits).
pub const MAX_LINE: usize = 64 << 20;

/// What the service asks a worker to run: the VM (as `tiervm run` would
/// take it) and what only the service needs of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerStart {
    /// The service's id of the VM.
    pub id: String,
    /// The VM: its image, size, tiers (`tiering.fast`: the fast tier's
    /// starting capacity), policy, run length.
    pub vm: VmRequest,
    /// How the worker measures the VM's access profile.
    pub profile: ProfileSettings,
}

/// How a worker keeps its VM's access profile and gain curve (the
/// service's division of the fast pool reads them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileSettings {
    /// Pages per step of the gain curve.
    pub quantum_pages: u64,
    /// Steps of the gain curve each way.
    pub curve_steps: usize,
    /// Half-life of the access profile, seconds.
    pub half_life_s: f64,
}

impl WorkerStart {
    /// The slow tier's capacity, bytes (without `tiering.slow`, the slow
    /// tier holds the whole guest).
    pub fn slow_bytes(&self) -> u64 {
        self.vm.tiering.slow.unwrap_or(self.vm.mem_bytes)
    }
}

/// A command to the worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Command {
    /// Set a tier's capacity (bytes, a multiple of 4 KiB).
    SetCapacity {
        /// Tier index (0 = fast).
        tier: u8,
        /// Capacity, bytes.
        bytes: u64,
    },
    /// Switch the placement policy (answered once queued: the VM's main
    /// thread takes it at its next sample; `WorkerStats::policy` shows it).
    SwitchPolicy {
        /// A `--policy` name.
        policy: String,
    },
    /// Live statistics.
    Stats,
    /// The run report (after the VM ended).
    Report,
    /// Ask the guest to stop (as at the end of `--duration`).
    Stop,
    /// End the worker process (after the VM ended).
    Exit,
}

/// One line from the service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum ToWorker {
    /// The first line: what to run.
    Start(Box<WorkerStart>),
    /// A command with the id its reply carries.
    Request {
        /// Request id.
        id: u64,
        /// The command.
        command: Command,
    },
}

/// The answer to a command.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "kebab-case")]
pub enum Reply {
    /// Done.
    Ok,
    /// A capacity change was applied: the capacity now, bytes.
    Capacity {
        /// Capacity now, bytes.
        bytes: u64,
    },
    /// Live statistics.
    Stats(Box<WorkerStats>),
    /// The run report (`tiervm run --report json`).
    Report {
        /// The report.
        report: serde_json::Value,
    },
}

/// Why a worker refused a command: whether retrying can help.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RefusalKind {
    /// The VM is still starting: the same command works in a moment.
    NotReady,
    /// The VM has ended: the command will never work.
    Ended,
    /// The command itself is invalid (permanent).
    Invalid,
    /// The VM refused it (a failure of the VM, permanent).
    Failed,
}

/// A command the worker refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// Whether retrying can help.
    pub kind: RefusalKind,
    /// Why.
    pub message: String,
}

impl Refusal {
    /// A refusal of `kind`.
    pub fn new(kind: RefusalKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// One line from the worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum FromWorker {
    /// The answer to request `id`.
    Reply {
        /// Request id.
        id: u64,
        /// The answer, or why the command was refused.
        result: Result<Reply, Refusal>,
    },
    /// The VM is built and its vCPUs run.
    Started {
        /// Worker process id.
        pid: u32,
        /// Advice about the settings.
        notes: Vec<String>,
    },
    /// The VM could not be built (the worker then exits).
    Failed {
        /// What failed, why, and the fix.
        error: String,
        /// Whether the request was at fault (else the host).
        usage: bool,
    },
    /// The VM ended; its report can be asked for.
    Finished {
        /// `stop_reason` of the report.
        stop_reason: String,
        /// The guest's exit code, if it wrote one.
        exit_code: Option<u32>,
        /// The crash, if the guest crashed.
        crash: Option<String>,
        /// The exit code the worker will end with (as `tiervm run`).
        process_exit: i32,
    },
}

/// One tier of a running VM.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TierNow {
    /// Tier name.
    pub name: String,
    /// Host node.
    pub node: u32,
    /// Capacity (the target after a resize), bytes.
    pub capacity_bytes: u64,
    /// Guest pages and shadows on the tier (the actual size), bytes.
    pub used_bytes: u64,
    /// Host memory of the tier measured from the kernel, bytes.
    pub resident_bytes: Option<u64>,
}

/// What a worker reports about its running VM.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerStats {
    /// Seconds since the vCPUs started.
    pub t_s: f64,
    /// Guest operations so far.
    pub ops: u64,
    /// Operations per second over the last second or so, from the
    /// guest's own counter (untrusted).
    pub ops_per_sec: f64,
    /// The VM's sampled access rate as the host measures it
    /// (`tiering::engine::profile::access_rate`; `None` before the
    /// hint-fault sampler covered any memory, or without it).
    #[serde(default)]
    pub accesses: Option<AccessRate>,
    /// The policy running now.
    pub policy: String,
    /// Why the last policy switch failed (cleared by one that works).
    #[serde(default)]
    pub policy_error: Option<String>,
    /// Per tier, fastest first.
    pub tiers: Vec<TierNow>,
    /// Every memory-layer counter.
    pub mem: MemStats,
    /// The resize driver's account.
    pub resize: ResizeDriverReport,
    /// The marginal gain of fast capacity (shares of sampled accesses).
    pub gain: GainCurve,
    /// Whether both tiers are one host node (latencies not real).
    pub emulated: bool,
}

/// Encodes one line (with its newline).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, serde_json::Error> {
    let mut v = serde_json::to_vec(msg)?;
    v.push(b'\n');
    Ok(v)
}

/// One line, at most [`MAX_LINE`] bytes; `None` at end of file.
pub fn read_line(r: &mut impl BufRead) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::new();
    let n = r
        .by_ref()
        .take(MAX_LINE as u64)
        .read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') && n >= MAX_LINE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "a line longer than the channel allows",
        ));
    }
    Ok(Some(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let m = ToWorker::Request {
            id: 7,
            command: Command::SetCapacity {
                tier: 0,
                bytes: 1 << 20,
            },
        };
        let line = encode(&m).unwrap();
        assert_eq!(line.last(), Some(&b'\n'));
        let back: ToWorker = serde_json::from_slice(&line).unwrap();
        assert_eq!(back, m);
        let r = FromWorker::Reply {
            id: 7,
            result: Err(Refusal::new(RefusalKind::NotReady, "no")),
        };
        let back: FromWorker = serde_json::from_slice(&encode(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn the_start_line_carries_the_vm_request() {
        let mut vm = VmRequest::default();
        vm.tiering.fast = Some(64 << 20);
        vm.tiering.policy = Some(vmm_core::tiering_config::PolicyArg::Tpp);
        let m = ToWorker::Start(Box::new(WorkerStart {
            id: "vm-1".into(),
            vm,
            profile: ProfileSettings {
                quantum_pages: 512,
                curve_steps: 64,
                half_life_s: 20.0,
            },
        }));
        let line = encode(&m).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["type"], "start");
        assert_eq!(v["vm"]["tiering"]["policy"], "tpp");
        assert_eq!(v["vm"]["duration_s"], 5.0);
        let back: ToWorker = serde_json::from_slice(&line).unwrap();
        assert_eq!(back, m);
        let ToWorker::Start(s) = back else {
            unreachable!()
        };
        assert_eq!(
            s.slow_bytes(),
            1 << 30,
            "without --slow the slow tier holds the guest"
        );
    }
}
