//! Admission of `POST /v1/vms` at the exact boundary of the fast pool: a
//! `fast.min` that fits exactly what the other VMs' mins leave is admitted
//! (the handler's 201), one 2 MiB unit more is refused (409); the PATCH
//! path has the same test in `tests/serve.rs`. In process, with a stand-in
//! worker (a shell that reads the channel until the service closes it), so
//! no KVM is needed.
//!
//! Planted bug caught (issue 34): create admitting a `min` one 2 MiB unit
//! larger than what is free.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use vmm_service::config::{ServeConfig, SIZE_ALIGN};
use vmm_service::host::Host;
use vmm_service::types::CreateVm;
use vmm_service::worker::CHANNEL_FD;

const M: u64 = 1 << 20;

fn temp_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("tiervm-admission-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("state").join("vms")).expect("temp dir");
    d
}

fn create(host: &std::sync::Arc<Host>, json: &str) -> Result<String, (u16, String)> {
    let req: CreateVm = serde_json::from_str(json).expect("a valid request");
    host.create(&req).map(|v| v.id).map_err(|e| {
        // The API layer's status for the host's error (types.rs).
        let api = vmm_service::types::ApiError::from(e);
        (api.status, format!("{}: {}", api.code, api.message))
    })
}

#[test]
fn create_admits_an_exact_fit_and_refuses_one_unit_more() {
    let dir = temp_dir();
    // The stand-in worker: holds the channel open until the service's end
    // closes (or the test kills it).
    let worker = dir.join("worker.sh");
    std::fs::write(
        &worker,
        format!("#!/bin/sh\nexec cat <&{CHANNEL_FD} >/dev/null\n"),
    )
    .unwrap();
    std::fs::set_permissions(&worker, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut cfg = ServeConfig::for_tests();
    cfg.state_dir = dir.join("state");
    cfg.worker_exe = worker;
    cfg.fast_pool = 256 * M;
    cfg.slow_pool = 1024 * M;
    let host = Host::new(cfg);
    let vm = |mem: u64, min: u64| {
        format!(
            r#"{{"image":"zipf","mem":"{}M","args":["rss=16M","wss=8M"],"fast":{{"min":"{}M","max":"{}M"}}}}"#,
            mem / M,
            min / M,
            min.max(2 * M) / M
        )
    };
    let mut ids = Vec::new();
    ids.push(create(&host, &vm(128 * M, 96 * M)).expect("96M of a free 256M pool"));
    // 160M are free: 162M is one unit too many.
    let free = 256 * M - 96 * M;
    match create(&host, &vm(256 * M, free + SIZE_ALIGN)) {
        Err((409, msg)) => assert!(msg.contains("does not fit"), "{msg}"),
        other => panic!("a min one 2 MiB unit over what is free: want 409, got {other:?}"),
    }
    // Exactly what is free.
    ids.push(create(&host, &vm(256 * M, free)).expect("a min of exactly what is free (201)"));
    assert_eq!(host.state().fast_reserved(), 256 * M);
    // The pool is full: one unit more is refused.
    match create(&host, &vm(64 * M, SIZE_ALIGN)) {
        Err((409, _)) => {}
        other => panic!("2M into a full pool: want 409, got {other:?}"),
    }
    // A min of 0 still fits a full pool.
    ids.push(create(&host, &vm(64 * M, 0)).expect("min 0 always fits"));
    // End the stand-in workers (ours, by pid) and wait for the service to
    // see them go.
    let pids: Vec<u32> = host.state().vms.values().filter_map(|v| v.pid).collect();
    assert_eq!(pids.len(), ids.len());
    for pid in pids {
        // SAFETY: kill(2) on a child this test's service started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while host.state().vms.values().any(|v| v.state.active()) {
        assert!(Instant::now() < deadline, "the workers' ends were not seen");
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
