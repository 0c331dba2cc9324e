//! A VM's life in the service (`host.rs`) on stand-in workers
//! (`stand_in/mod.rs`): started, polled, stopped, ended in each way a
//! worker ends (stopped, guest exit, crash, killed, failed to build,
//! silent), its report collected and its record removed; events; the
//! service's shutdown. In process, no KVM (issue 34: the part of host.rs
//! its unit tests cannot reach; `tests/serve.rs` runs the same API on
//! real VMs).

mod stand_in;

use std::time::Duration;

use stand_in::{create, zipf, Service, M, OPS_PER_SEC, PROMOTIONS};
use vmm_service::host_error::HostErrorKind;
use vmm_service::types::{FastRequest, PutPolicy};

/// Not a test: the stand-in worker's entry (`stand_in::worker_main`).
#[test]
fn stand_in_worker() {
    stand_in::worker_main();
}

#[test]
fn a_vm_runs_is_polled_stops_on_delete_leaves_its_report_and_is_removed() {
    let svc = Service::new("lifecycle");
    let mut woken = svc.host.subscribe();
    let v = svc.running(None, &zipf(128, 64, 128));
    assert!(
        woken.has_changed().unwrap_or(false),
        "an event wakes its subscribers"
    );
    assert_eq!(*woken.borrow_and_update(), svc.host.events_since(0).1);
    assert_eq!(v.id, "vm-1");
    assert_eq!(v.notes, ["stand-in worker"]);
    assert_eq!(v.ended_unix, None, "a running VM has not ended");
    assert!(v.pid.is_some_and(|p| p > 1));
    // Statistics within a second or two (the rebalancer polls).
    let v = svc.wait_vm(&v.id, "polled", |v| v.ops_per_sec > 0.0);
    assert_eq!(v.ops_per_sec, OPS_PER_SEC);
    let m = &v.migration;
    assert_eq!(
        (m.promotions, m.demotions, m.tpm_commits),
        (PROMOTIONS, 8, 9)
    );
    assert_eq!(
        (m.tpm_aborts, m.shadow_demotions, m.shadow_reclaims),
        (10, 12, 13)
    );
    assert_eq!((m.hint_faults, m.guest_stall_seconds), (11, 2.5));
    assert_eq!(v.tiers.len(), 2);
    assert_eq!(
        v.tiers[1].capacity_bytes,
        128 * M,
        "the slow tier holds the guest"
    );
    assert_eq!(v.silent_s.map(|s| s < 5.0), Some(true));
    let record = svc.dir.join("state/vms/vm-1.json");
    assert!(record.exists(), "the VM's record is written");
    match svc.host.report("vm-1") {
        Err(e) => assert_eq!(e.kind, HostErrorKind::Conflict, "{e:?}"),
        Ok(r) => panic!("a running VM's report: {r}"),
    }
    // A graceful delete: the VM stops, says who asked, leaves its report.
    assert_eq!(svc.host.delete("vm-1", false), Ok(true));
    let v = svc.wait_vm("vm-1", "stopped with its report", |v| {
        v.state == "stopped" && v.report_ready
    });
    assert_eq!(v.stop_reason.as_deref(), Some("deleted"));
    assert_eq!(v.guest_exit_code, Some(0));
    assert_eq!(v.error, None);
    assert!(v.ended_unix.is_some());
    assert!(v.tiers.is_empty(), "an ended VM has no tiers");
    assert_eq!(v.ops_per_sec, 0.0, "an ended VM does no ops");
    // The report fetched, the worker is let go and reaped.
    let v = svc.wait_vm("vm-1", "reaped", |v| v.exit.is_some());
    assert_eq!(v.exit.and_then(|e| e.code), Some(0));
    assert!(v.pid.is_none());
    let report = svc.host.report("vm-1").expect("the report");
    assert_eq!(
        report["stop_reason"], "deleted",
        "the service says who stopped it"
    );
    let written = std::fs::read_to_string(svc.dir.join("state/reports/vm-1.json"))
        .expect("the report is written");
    assert!(written.contains("\"deleted\""), "{written}");
    assert_eq!(svc.host.state().fast_reserved(), 0, "its min is released");
    // Deleted again: removed, with its record.
    assert_eq!(svc.host.delete("vm-1", false), Ok(false));
    assert_eq!(
        svc.host.vm_info("vm-1", false).map_err(|e| e.kind),
        Err(HostErrorKind::NotFound)
    );
    assert!(svc.host.list().is_empty());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while record.exists() {
        assert!(std::time::Instant::now() < deadline, "the record stays");
        std::thread::sleep(Duration::from_millis(10));
    }
    one_lifes_events(&svc, &v.uuid);
}

/// The events of the one VM `vm-1` (`uuid`) created, run, deleted and
/// removed: in order, each naming it, with consecutive numbers and times.
fn one_lifes_events(svc: &Service, uuid: &str) {
    let (events, last) = svc.host.events_since(0);
    let seen: Vec<(String, Option<String>, Option<String>)> = (events.iter())
        .filter(|e| e.kind != "division")
        .map(|e| (e.kind.clone(), e.state.clone(), e.previous_state.clone()))
        .collect();
    let ev = |k: &str, s: Option<&str>, p: Option<&str>| {
        (k.to_string(), s.map(String::from), p.map(String::from))
    };
    assert_eq!(
        seen,
        [
            ev("vm_state", Some("starting"), None),
            ev("vm_state", Some("running"), Some("starting")),
            ev("vm_state", Some("stopping"), Some("running")),
            ev("vm_state", Some("stopped"), Some("stopping")),
            ev("vm_removed", None, None),
        ]
    );
    assert_eq!(last, events.last().map_or(0, |e| e.seq));
    assert!(events.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    assert!(
        events.iter().all(|e| e.vm == "vm-1" && e.uuid == uuid),
        "each event names its VM: {events:?}"
    );
    let (first, end) = (events[0].time_unix, events[events.len() - 1].time_unix);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    assert!(
        first > now - 60.0 && first <= end && end <= now,
        "{events:?}"
    );
    let (after, _) = svc.host.events_since(last - 1);
    assert_eq!(after.len(), 1, "events after a sequence number only");
}

#[test]
fn a_vm_that_ends_before_the_answer_to_its_stop_still_says_it_was_deleted() {
    // The worker's `finished` arrives on the reader thread, possibly
    // before DELETE has its answer: who asked is recorded before.
    let svc = Service::new("quick");
    for n in 0..5 {
        let id = format!("quick-{n}");
        svc.running(Some(&id), &zipf(64, 0, 64));
        assert_eq!(svc.host.delete(&id, false), Ok(true));
        let v = svc.wait_vm(&id, "stopped with its report", |v| v.report_ready);
        assert_eq!(v.stop_reason.as_deref(), Some("deleted"), "{id}");
        let report = svc.host.report(&id).expect("the report");
        assert_eq!(report["stop_reason"], "deleted", "{id}");
    }
}

#[test]
fn a_guest_exit_a_crash_and_a_failed_build_end_the_vm_each_its_way() {
    let svc = Service::new("endings");
    svc.running(Some("exit3-a"), &zipf(64, 0, 64));
    svc.running(Some("crash-b"), &zipf(64, 0, 64));
    create(&svc.host, Some("fail-c"), &zipf(64, 32, 64)).expect("admitted");
    let v = svc.wait_state("fail-c", "failed");
    assert_eq!(
        v.error.as_deref(),
        Some("stand-in: the VM could not be built")
    );
    assert_eq!(
        svc.host.state().fast_reserved(),
        0,
        "a failed VM holds no min"
    );
    assert_eq!(svc.host.delete("exit3-a", false), Ok(true));
    assert_eq!(svc.host.delete("crash-b", false), Ok(true));
    let v = svc.wait_vm("exit3-a", "stopped with its report", |v| v.report_ready);
    assert_eq!(v.state, "stopped");
    assert_eq!(v.stop_reason.as_deref(), Some("guest_exited"));
    assert_eq!(v.guest_exit_code, Some(3));
    assert_eq!(v.error.as_deref(), Some("the guest exited with code 0x3"));
    let v = svc.wait_state("crash-b", "crashed");
    assert_eq!(v.stop_reason.as_deref(), Some("crashed"));
    assert_eq!(v.error.as_deref(), Some("stand-in: the guest crashed"));
    assert_eq!(svc.host.state().counters.crashes, 1);
    // A failed VM left no report.
    let e = svc.host.report("fail-c").expect_err("no report");
    assert_eq!(e.kind, HostErrorKind::NotFound);
    assert!(e.message.contains("is failed and left no report"), "{e:?}");
    assert_eq!(e.fix, "GET /v1/vms/fail-c shows why (error, exit)");
    let i = svc.host.host_info();
    assert_eq!(i.vms["stopped"], 1);
    assert_eq!(i.vms["crashed"], 1);
    assert_eq!(i.vms["failed"], 1);
    assert_eq!(i.vms["running"], 0);
}

#[test]
fn a_killed_worker_is_crashed_and_a_forced_delete_is_stopped() {
    let svc = Service::new("killed");
    let a = svc.running(None, &zipf(64, 0, 64));
    let b = svc.running(None, &zipf(64, 0, 64));
    // SAFETY: kill(2) of the stand-in worker this test's service started.
    unsafe { libc::kill(a.pid.expect("a pid") as i32, libc::SIGKILL) };
    let v = svc.wait_state(&a.id, "crashed");
    assert_eq!(v.stop_reason.as_deref(), Some("crashed"));
    assert_eq!(
        v.error.as_deref(),
        Some("the VM process was killed by signal 9")
    );
    assert_eq!(v.exit.and_then(|e| e.signal), Some(9));
    assert_eq!(svc.host.state().counters.crashes, 1);
    let v = svc.force_delete(&b.id);
    assert_eq!(v.stop_reason.as_deref(), Some("force_deleted"));
    assert_eq!(v.error, None, "killed on request is no crash");
    assert_eq!(svc.host.state().counters.crashes, 1);
    assert!(v.pid.is_none());
}

#[test]
fn a_silent_worker_is_unresponsive_refuses_changes_and_runs_again_once_it_answers() {
    let svc = Service::with("silent", |cfg| {
        cfg.unresponsive_after = Duration::from_millis(1500);
    });
    let v = svc.polled(None, &zipf(64, 0, 64));
    svc.mute(&v.id, true);
    let u = svc.wait_state(&v.id, "unresponsive");
    assert!(u.silent_s.is_some_and(|s| s > 1.5), "{u:?}");
    // A process that sleeps tells nothing more than its silence.
    assert_eq!(u.process_condition, None);
    refused_as_unresponsive(&svc, &v.id, "(stopped, frozen or stuck)");
    svc.mute(&v.id, false);
    svc.wait_state(&v.id, "running");
    assert_eq!(svc.info(&v.id).process_condition, None);
    // A process stopped by a signal is named so, in the VM and its errors.
    let pid = v.pid.expect("a pid") as i32;
    // SAFETY: kill(2) of the stand-in worker this test's service started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let u = svc.wait_state(&v.id, "unresponsive");
    let stopped = "its process is stopped by a signal (SIGCONT resumes it)";
    assert_eq!(u.process_condition.as_deref(), Some(stopped), "{u:?}");
    refused_as_unresponsive(&svc, &v.id, stopped);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    svc.wait_state(&v.id, "running");
    let (events, _) = svc.host.events_since(0);
    let states: Vec<_> = events.iter().filter_map(|e| e.state.as_deref()).collect();
    assert_eq!(
        states,
        [
            "starting",
            "running",
            "unresponsive",
            "running",
            "unresponsive",
            "running"
        ]
    );
}

/// Every change to unresponsive VM `id` is refused, with an error that
/// says why (`why`) and how to go on.
fn refused_as_unresponsive(svc: &Service, id: &str, why: &str) {
    let refused = |r: Result<(), vmm_service::host_error::HostError>| match r {
        Err(e) => {
            assert_eq!(e.kind, HostErrorKind::Unresponsive, "{e:?}");
            assert!(e.message.contains("is unresponsive"), "{e:?}");
            assert!(e.message.contains(why), "{e:?}");
            assert!(e.fix.contains("force=true"), "{e:?}");
        }
        Ok(()) => panic!("an unresponsive VM changed"),
    };
    refused(svc.host.delete(id, false).map(|_| ()));
    let fast: FastRequest = serde_json::from_str(r#"{"max":"32M"}"#).unwrap();
    refused(svc.host.patch_fast(id, &fast).map(|_| ()));
    let tpp = PutPolicy {
        policy: "tpp".into(),
    };
    refused(svc.host.put_policy(id, &tpp).map(|_| ()));
}

#[test]
fn a_vm_still_starting_refuses_a_stop_as_not_ready_and_is_killed_on_force() {
    let svc = Service::new("starting");
    let v = create(&svc.host, Some("starting-a"), &zipf(64, 0, 64)).expect("admitted");
    assert_eq!(v.state, "starting");
    let e = svc.host.delete("starting-a", false).expect_err("not ready");
    assert_eq!(e.kind, HostErrorKind::NotReady, "{e:?}");
    assert_eq!(e.message, "VM starting-a: the VM is still starting");
    assert_eq!(
        e.fix,
        "retry in a moment (GET /v1/vms/starting-a shows the state)"
    );
    let cause = |h: &vmm_service::host::Host| {
        let s = h.state();
        s.vms
            .values()
            .find(|v| v.id == "starting-a")
            .and_then(|v| v.stop_cause)
    };
    assert_eq!(cause(&svc.host), None, "a stop not sent asked nothing");
    let tpp = PutPolicy {
        policy: "tpp".into(),
    };
    let e = svc
        .host
        .put_policy("starting-a", &tpp)
        .expect_err("not running");
    assert_eq!(e.kind, HostErrorKind::Conflict, "{e:?}");
    assert_eq!(e.message, "VM starting-a is starting");
    let v = svc.force_delete("starting-a");
    assert_eq!(v.stop_reason.as_deref(), Some("force_deleted"));
}

#[test]
fn a_policy_switch_reaches_the_worker_and_a_refusal_is_the_clients_error() {
    let svc = Service::new("policy");
    let v = svc.running(None, &zipf(64, 0, 64));
    assert_eq!(v.policy, "nomad");
    let tpp = PutPolicy {
        policy: "tpp".into(),
    };
    let after = svc.host.put_policy(&v.id, &tpp).expect("switched");
    assert_eq!(after.policy_requested, "tpp");
    assert_eq!(after.policy_switches, 1);
    svc.wait_vm(&v.id, "running tpp", |v| v.policy == "tpp");
    let bogus = PutPolicy {
        policy: "bogus".into(),
    };
    let e = svc
        .host
        .put_policy(&v.id, &bogus)
        .expect_err("no such policy");
    assert_eq!(e.kind, HostErrorKind::Invalid);
    assert_eq!(svc.info(&v.id).policy_switches, 1);
    svc.running(Some("refuse-b"), &zipf(64, 0, 64));
    let e = svc.host.put_policy("refuse-b", &tpp).expect_err("refused");
    assert_eq!(e.kind, HostErrorKind::Invalid, "{e:?}");
    assert_eq!(e.message, "VM refuse-b: tpp: refused by the stand-in");
    assert_eq!(svc.info("refuse-b").policy_switches, 0);
    let e = svc.host.put_policy("nope", &tpp).expect_err("no VM");
    assert_eq!(e.kind, HostErrorKind::NotFound);
}

#[test]
fn shutdown_stops_every_vm_collects_its_report_and_refuses_requests() {
    let svc = Service::new("shutdown");
    let a = svc.running(None, &zipf(64, 32, 64));
    let b = svc.running(None, &zipf(64, 0, 64));
    assert!(
        svc.host.heartbeat_age_s() < 2.0,
        "the rebalancer goes round"
    );
    let t = std::time::Instant::now();
    svc.host.shutdown();
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "bounded by stop_grace + 20 s"
    );
    for id in [&a.id, &b.id] {
        let v = svc.info(id);
        assert_eq!(v.state, "stopped");
        assert_eq!(v.stop_reason.as_deref(), Some("service_stopped"));
        assert!(
            v.report_ready,
            "{id}: the report is collected before the end"
        );
    }
    assert!(svc.host.shutting_down());
    assert!(svc.host.host_info().shutting_down);
    let e = create(&svc.host, None, &zipf(64, 0, 64)).expect_err("shutting down");
    assert_eq!(e.kind, HostErrorKind::ShuttingDown);
    // The rebalancer has ended: its heartbeat ages.
    std::thread::sleep(Duration::from_millis(1200));
    assert!(svc.host.heartbeat_age_s() > 1.0);
    let up = svc.host.uptime_s();
    assert!(up > 1.2 && up < 60.0, "{up}");
    let p: vmm_service::types::PatchHost = serde_json::from_str(r#"{"fast_pool":"128M"}"#).unwrap();
    let e = svc.host.patch_host(&p).expect_err("shutting down");
    assert_eq!(e.kind, HostErrorKind::ShuttingDown);
    let fast: FastRequest = serde_json::from_str(r#"{"min":"2M"}"#).unwrap();
    let e = svc
        .host
        .patch_fast(&a.id, &fast)
        .expect_err("shutting down");
    assert_eq!(e.kind, HostErrorKind::ShuttingDown);
    let tpp = PutPolicy {
        policy: "tpp".into(),
    };
    let e = svc.host.put_policy(&a.id, &tpp).expect_err("shutting down");
    assert_eq!(e.kind, HostErrorKind::ShuttingDown);
}

#[test]
fn a_worker_that_exits_without_a_report_is_crashed_with_its_exit_status() {
    let svc = Service::new("died");
    svc.running(Some("die-a"), &zipf(64, 0, 64));
    assert_eq!(svc.host.delete("die-a", false), Ok(true));
    let v = svc.wait_state("die-a", "crashed");
    assert_eq!(
        v.error.as_deref(),
        Some("the VM process exited with status 3 without a report")
    );
    assert_eq!(v.stop_reason.as_deref(), Some("crashed"));
    assert_eq!(v.exit.and_then(|e| e.code), Some(3));
    assert_eq!(svc.host.state().counters.crashes, 1);
    assert!(!v.report_ready);
}

#[test]
fn a_worker_that_does_not_answer_in_time_is_a_timeout_until_it_is_unresponsive() {
    let svc = Service::new("timeout");
    let v = svc.running(None, &zipf(64, 0, 64));
    svc.mute(&v.id, true);
    let tpp = PutPolicy {
        policy: "tpp".into(),
    };
    let e = svc.host.put_policy(&v.id, &tpp).expect_err("no answer");
    assert_eq!(e.kind, HostErrorKind::WorkerTimeout, "{e:?}");
    assert_eq!(
        e.message,
        format!("VM {}'s process did not answer within 2.0 s", v.id)
    );
    assert!(e.kind.retryable());
    assert!(
        e.fix.contains(&format!("GET /v1/vms/{} shows", v.id)),
        "{e:?}"
    );
    svc.mute(&v.id, false);
}

#[test]
fn polled_statistics_add_up_the_host_measured_accesses_over_the_time_between_them() {
    let svc = Service::new("accesses");
    let v = svc.running(None, &zipf(64, 0, 64));
    let per_sec = stand_in::accesses_per_sec(&v.id);
    // (worker time, accesses added up) at each poll seen.
    let mut seen: Vec<(f64, f64)> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while seen.len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "3 polls in 20 s: {seen:?}"
        );
        let s = svc.host.state();
        let e = s.vms.values().next().expect("the VM");
        if let Some(t) = e.stats.as_ref().map(|st| st.t_s) {
            if seen.last().is_none_or(|l| l.0 != t) {
                seen.push((t, e.sampled_accesses));
            }
        }
        drop(s);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(seen[0].1, 0.0, "the first statistics cover no time yet");
    for w in seen.windows(2) {
        let (dt, da) = (w[1].0 - w[0].0, w[1].1 - w[0].1);
        assert!(dt > 0.0);
        assert!((da - per_sec * dt).abs() < 1e-6 * per_sec, "{seen:?}");
    }
}

#[test]
fn ids_and_records_survive_a_restart_of_the_service() {
    let (cfg, dir) = stand_in::config("restart");
    let unix_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    let (first_boot, a) = {
        let t0 = unix_now();
        let svc = Service::start(cfg.clone(), dir.clone());
        let t1 = unix_now();
        std::thread::sleep(Duration::from_millis(300));
        let a = svc.running(None, &zipf(64, 0, 64));
        // Rewritten at each id handed out, still saying when it started.
        let text = std::fs::read_to_string(cfg.state_dir.join("service.json")).unwrap();
        let record: serde_json::Value = serde_json::from_str(&text).unwrap();
        let started = record["started_unix"].as_f64().unwrap_or(0.0);
        assert!(t0 <= started && started <= t1, "{t0} {started} {t1}");
        assert_eq!(record["next_id"], 2);
        assert_eq!(record["pid"], std::process::id());
        svc.running(None, &zipf(64, 0, 64));
        assert_eq!(svc.host.delete("vm-2", true), Ok(true));
        svc.wait_state("vm-2", "stopped");
        assert_eq!(svc.host.delete("vm-2", false), Ok(false));
        let boot = svc.host.boot_id.clone();
        svc.stop_for_restart();
        (boot, a)
    };
    {
        let svc = Service::start(cfg.clone(), dir.clone());
        assert_eq!(
            svc.host.previous_boot_id.as_deref(),
            Some(first_boot.as_str())
        );
        assert_ne!(svc.host.boot_id, first_boot);
        let old = svc.info("vm-1");
        assert_eq!(old.uuid, a.uuid);
        assert_eq!(old.state, "stopped");
        assert_eq!(old.stop_reason.as_deref(), Some("service_stopped"));
        assert_eq!(
            svc.host.vm_info("vm-2", false).map_err(|e| e.kind),
            Err(HostErrorKind::NotFound),
            "a removed VM stays removed"
        );
        let b = svc.running(None, &zipf(64, 0, 64));
        assert_eq!(b.id, "vm-3", "no id is handed out twice");
        assert_eq!(
            svc.info("vm-1").uuid,
            a.uuid,
            "the new VM took no old one's place"
        );
        assert_eq!(svc.host.list().len(), 2);
        svc.stop_for_restart();
    }
    // Without the service's record the VMs' records still say which ids
    // were handed out; a record that says "running" is of a service that
    // died: its VM comes back lost, and its record says so.
    std::fs::remove_file(cfg.state_dir.join("service.json")).expect("service.json");
    let record = cfg.state_dir.join("vms/vm-3.json");
    let text = std::fs::read_to_string(&record).expect("vm-3's record");
    let mut r: serde_json::Value = serde_json::from_str(&text).expect("a record");
    r["state"] = "running".into();
    std::fs::write(&record, r.to_string()).expect("the record");
    let svc = Service::start(cfg, dir);
    assert_eq!(svc.host.previous_boot_id, None);
    let ids: Vec<String> = svc.host.list().into_iter().map(|v| v.id).collect();
    assert_eq!(ids, ["vm-1", "vm-3"]);
    let lost = svc.info("vm-3");
    assert_eq!(lost.state, "lost");
    assert_eq!(lost.stop_reason.as_deref(), Some("service_lost"));
    assert_eq!(
        svc.host.state().fast_reserved(),
        0,
        "a lost VM holds nothing"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&record).is_ok_and(|t| t.contains("\"lost\"")) {
        assert!(
            std::time::Instant::now() < deadline,
            "the lost VM's record is not rewritten"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(svc.running(None, &zipf(64, 0, 64)).id, "vm-4");
}

#[test]
fn a_crash_without_a_description_is_a_crash_and_a_lost_report_is_not_awaited() {
    let svc = Service::new("no-report");
    svc.running(Some("oops-a"), &zipf(64, 0, 64));
    svc.running(Some("noreport-b"), &zipf(64, 0, 64));
    assert_eq!(svc.host.delete("oops-a", false), Ok(true));
    assert_eq!(svc.host.delete("noreport-b", false), Ok(true));
    let v = svc.wait_state("oops-a", "crashed");
    assert_eq!(v.stop_reason.as_deref(), Some("crashed"));
    assert_eq!(svc.host.state().counters.crashes, 1);
    // Its worker is let go without a report: the report is not "being
    // collected" any more.
    let v = svc.wait_vm("noreport-b", "reaped", |v| v.exit.is_some());
    assert_eq!(v.state, "stopped");
    assert!(!v.report_ready);
    let e = svc.host.report("noreport-b").expect_err("no report");
    assert_eq!(e.kind, HostErrorKind::NotFound, "{e:?}");
    assert_eq!(e.message, "VM noreport-b is stopped and left no report");
}

#[test]
fn a_second_delete_the_worker_refuses_keeps_who_asked_first() {
    let svc = Service::new("second-delete");
    svc.running(Some("slowstop-a"), &zipf(64, 0, 64));
    let cause = || {
        let s = svc.host.state();
        s.vms
            .values()
            .find(|v| v.id == "slowstop-a")
            .and_then(|v| v.stop_cause)
    };
    assert_eq!(svc.host.delete("slowstop-a", false), Ok(true));
    assert_eq!(svc.info("slowstop-a").state, "stopping");
    let e = svc.host.delete("slowstop-a", false).expect_err("refused");
    assert_eq!(e.kind, HostErrorKind::NotReady, "{e:?}");
    assert_eq!(cause(), Some("deleted"), "the first DELETE asked");
    let v = svc.force_delete("slowstop-a");
    assert_eq!(v.stop_reason.as_deref(), Some("force_deleted"));
}

#[test]
fn a_report_on_its_way_is_a_retry_then_the_report() {
    let svc = Service::new("slow-report");
    svc.running(Some("slowreport-a"), &zipf(64, 0, 64));
    assert_eq!(svc.host.delete("slowreport-a", false), Ok(true));
    svc.wait_state("slowreport-a", "stopped");
    // The collector waits for it (2 s): meanwhile a 409 to retry.
    let e = svc.host.report("slowreport-a").expect_err("not yet");
    assert_eq!(e.kind, HostErrorKind::Conflict, "{e:?}");
    assert_eq!(e.message, "VM slowreport-a's report is being collected");
    svc.wait_vm("slowreport-a", "its report", |v| v.report_ready);
    assert_eq!(
        svc.host
            .report("slowreport-a")
            .map(|r| r["stop_reason"].clone()),
        Ok("deleted".into())
    );
}
