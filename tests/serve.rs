//! `tiervm serve` driven over its real Unix socket with real HTTP clients
//! (curl, the Rust client in `vmm_service::client`, `tiervm ctl`): errors,
//! the OpenAPI document (validated by `openapi-spec-validator`, every
//! route present), metrics (`promtool check metrics`, a real Prometheus
//! server scraping and querying a series back), and, with KVM, three VMs
//! changed live, one SIGKILLed, and a clean stop that leaves nothing behind.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use vmm_service::client;

const M: u64 = 1 << 20;

/// A running service in its own temporary directory.
struct Service {
    child: Option<Child>,
    dir: PathBuf,
    socket: PathBuf,
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tiervm-serve-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Spawns `tiervm serve` on `socket` with its state in `dir/state`, its
/// stderr in `dir/log`.
fn spawn_serve(dir: &Path, socket: &Path, log: &str, extra: &[&str]) -> Child {
    let log = std::fs::File::create(dir.join(log)).expect("log");
    common::tiervm()
        .arg("serve")
        .arg("--socket")
        .arg(socket)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("start tiervm serve")
}

impl Service {
    /// A second service on this one's socket and state directory (the
    /// restart after this one ended; its log is `serve-b.log`). Returns at
    /// once: the caller waits for it as its case needs.
    fn restarted(&self, extra: &[&str]) -> Self {
        Self {
            child: Some(spawn_serve(&self.dir, &self.socket, "serve-b.log", extra)),
            dir: self.dir.clone(),
            socket: self.socket.clone(),
        }
    }

    fn start(name: &str, extra: &[&str]) -> Self {
        let dir = temp_dir(name);
        let socket = dir.join("run").join("api.sock");
        let child = spawn_serve(&dir, &socket, "serve.log", extra);
        let s = Self {
            child: Some(child),
            dir,
            socket,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !s.socket.exists() {
            assert!(
                Instant::now() < deadline,
                "the service did not create its socket: {}",
                s.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    /// A request with the Rust client.
    fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let a = client::request(
            &self.socket,
            method,
            path,
            body.map(str::as_bytes),
            Duration::from_secs(60),
        )
        .expect("the service answers");
        (a.status, a.json())
    }

    /// A request with curl; returns the status and the body.
    fn curl(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let mut c = Command::new("curl");
        c.args(["-sS", "--max-time", "60", "-o", "-", "-w", "\n%{http_code}"])
            .arg("--unix-socket")
            .arg(&self.socket)
            .args(["-X", method]);
        if let Some(b) = body {
            c.args(["-H", "Content-Type: application/json", "--data-binary", b]);
        }
        let out = c
            .arg(format!("http://localhost{path}"))
            .output()
            .expect("curl runs (apt-get install curl)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(s) = child.try_wait().expect("wait") {
                return s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the service did not stop within 90 s: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn assert_error(status: u16, body: &Value, want_status: u16, want_code: &str, ctx: &str) {
    assert_eq!(status, want_status, "{ctx}: {body}");
    assert_eq!(body["code"], want_code, "{ctx}: {body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty())
            && body["fix"].as_str().is_some_and(|m| !m.is_empty()),
        "{ctx}: an error names the problem and the fix: {body}"
    );
}

/// `GET /metrics` of the service.
fn metrics(svc: &Service) -> client::Answer {
    client::request(
        &svc.socket,
        "GET",
        "/metrics",
        None,
        Duration::from_secs(10),
    )
    .unwrap()
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or(Value::Null)
}

/// A command-line tool the test needs: found, installed, or `None` after
/// printing why the check is skipped.
fn tool(test: &str, bin: &str, install: &[&[&str]]) -> Option<PathBuf> {
    let find = || {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(bin))
                .find(|f| f.is_file())
        })
    };
    if let Some(p) = find() {
        return Some(p);
    }
    for cmd in install {
        eprintln!("{test}: {bin} not found; trying: {}", cmd.join(" "));
        let ok = Command::new(cmd[0])
            .args(&cmd[1..])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            if let Some(p) = find() {
                return Some(p);
            }
        }
    }
    eprintln!("SKIPPED {test}: {bin} is not installed and could not be installed");
    None
}

#[test]
fn errors_openapi_and_routes_over_the_socket() {
    let mut svc = Service::start("errors", &["--fast-pool", "256M", "--slow-pool", "512M"]);
    // The socket is the owner's only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&svc.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode");
    let dmode = std::fs::metadata(svc.socket.parent().unwrap())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(
        dmode, 0o700,
        "the socket's directory, created by the service"
    );

    let (st, host) = svc.call("GET", "/v1/host", None);
    assert_eq!(st, 200);
    assert_eq!(host["pools"][0]["capacity_bytes"], 256 * M);
    assert_eq!(host["pools"][1]["free_bytes"], 512 * M);

    // Errors, with curl.
    let (st, b) = svc.curl("POST", "/v1/vms", Some("{not json"));
    assert_error(st, &json(&b), 400, "bad_request", "bad JSON");
    let (st, b) = svc.curl("POST", "/v1/vms", Some(r#"{"image":"zipf","mem":"3M"}"#));
    assert_error(st, &json(&b), 400, "bad_request", "unaligned mem");
    let (st, b) = svc.curl(
        "POST",
        "/v1/vms",
        Some(r#"{"image":"zipf","colour":"red"}"#),
    );
    assert_error(st, &json(&b), 400, "bad_request", "unknown field");
    let (st, b) = svc.curl("POST", "/v1/vms", Some(r#"{"image":"no-such-image"}"#));
    assert_error(st, &json(&b), 400, "bad_request", "unknown image");
    let (st, b) = svc.curl(
        "POST",
        "/v1/vms",
        Some(r#"{"image":"zipf","mem":"512M","args":["rss=64M","wss=32M"],"fast":{"min":"384M"}}"#),
    );
    let b = json(&b);
    assert_error(st, &b, 409, "conflict", "a min larger than the pool");
    assert!(
        b["message"].as_str().unwrap().contains("does not fit"),
        "{b}"
    );
    let (st, b) = svc.curl(
        "POST",
        "/v1/vms",
        Some(r#"{"image":"zipf","mem":"1G","args":["rss=64M","wss=32M"]}"#),
    );
    assert_error(
        st,
        &json(&b),
        409,
        "conflict",
        "mem larger than the slow pool",
    );
    let (st, b) = svc.curl("GET", "/v1/vms/vm-404", None);
    assert_error(st, &json(&b), 404, "not_found", "no such VM");
    let (st, b) = svc.curl("GET", "/v2/anything", None);
    assert_error(st, &json(&b), 404, "not_found", "no such route");
    let (st, b) = svc.curl("DELETE", "/v1/host", None);
    assert_error(st, &json(&b), 405, "method_not_allowed", "wrong method");
    let big = format!(r#"{{"image":"{}"}}"#, "a".repeat(100_000));
    let (st, b) = svc.curl("POST", "/v1/vms", Some(&big));
    assert_error(st, &json(&b), 413, "payload_too_large", "body too large");
    let (st, b) = svc.call("PATCH", "/v1/host", Some(r#"{"fast_pool":"100T"}"#));
    assert_error(st, &b, 400, "bad_request", "a pool larger than the node");
    let (st, b) = svc.call("PUT", "/v1/vms/vm-1/policy", Some(r#"{"policy":"lru"}"#));
    assert_error(st, &b, 400, "bad_request", "not a policy");
    let (st, b) = svc.call("PATCH", "/v1/host", Some(r#"{"fast_pool":"128M"}"#));
    assert_eq!(
        (st, &b["pools"][0]["capacity_bytes"]),
        (200, &Value::from(128 * M))
    );

    // The OpenAPI document: every route the server has is in it, and no other.
    let (st, doc) = svc.call("GET", "/v1/openapi.json", None);
    assert_eq!(st, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().expect("paths");
    let expected = [
        ("/v1/host", vec!["get", "patch"]),
        ("/v1/vms", vec!["get", "post"]),
        ("/v1/vms/{id}", vec!["get", "put", "delete"]),
        ("/v1/events", vec!["get"]),
        ("/healthz", vec!["get"]),
        ("/readyz", vec!["get"]),
        ("/v1/vms/{id}/fast", vec!["patch"]),
        ("/v1/vms/{id}/policy", vec!["put"]),
        ("/v1/vms/{id}/report", vec!["get"]),
        ("/v1/openapi.json", vec!["get"]),
        ("/metrics", vec!["get"]),
    ];
    assert_eq!(paths.len(), expected.len(), "{:?}", paths.keys());
    for (path, methods) in &expected {
        let item = paths.get(*path).unwrap_or_else(|| panic!("{path} missing"));
        for m in ["get", "post", "put", "patch", "delete"] {
            let concrete = path.replace("{id}", "vm-none");
            let (st, b) = svc.call(&m.to_uppercase(), &concrete, Some("{}"));
            let documented = item.get(m).is_some();
            assert_eq!(documented, methods.contains(&m), "{m} {path}");
            if documented {
                assert!(
                    st != 405 && !b["message"].as_str().unwrap_or("").starts_with("no route"),
                    "{m} {path} is documented but the server has no such route: {st} {b}"
                );
            } else {
                assert_eq!(st, 405, "{m} {path} is not documented but served: {b}");
            }
        }
    }
    if let Some(v) = tool(
        "errors_openapi_and_routes_over_the_socket (OpenAPI validation)",
        "openapi-spec-validator",
        &[&[
            "python3",
            "-m",
            "pip",
            "install",
            "--quiet",
            "openapi-spec-validator",
        ]],
    ) {
        let f = svc.dir.join("openapi.json");
        std::fs::write(&f, doc.to_string()).unwrap();
        let out = Command::new(v).arg(&f).output().expect("validator runs");
        assert!(
            out.status.success(),
            "openapi-spec-validator: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Metrics pass promtool's checks.
    let a = metrics(&svc);
    assert_eq!(a.status, 200);
    assert!(
        a.content_type.starts_with("text/plain"),
        "{}",
        a.content_type
    );
    let text = a.text();
    assert!(
        text.contains("tiervm_host_pool_capacity_bytes{node=\"0\",tier=\"fast\"} 134217728"),
        "{text}"
    );
    assert!(
        text.contains(
            "tiervm_api_requests_total{code=\"413\",method=\"POST\",route=\"/v1/vms\"} 1"
        ),
        "{text}"
    );
    if let Some(p) = tool(
        "errors_openapi_and_routes_over_the_socket (promtool)",
        "promtool",
        &[&["apt-get", "install", "-y", "-qq", "prometheus"]],
    ) {
        let mut c = Command::new(p)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // tiervm ctl: an answer, and an error with exit 1.
    let out = common::tiervm()
        .args(["ctl", "--socket"])
        .arg(&svc.socket)
        .arg("host")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"pools\""));
    let out = common::tiervm()
        .args(["ctl", "--socket"])
        .arg(&svc.socket)
        .args(["get", "vm-404"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("404 not_found: no VM 'vm-404'"));

    let status = svc.stop();
    assert!(status.success(), "{status:?}: {}", svc.log());
    assert!(!svc.socket.exists(), "the socket is removed at exit");
}

#[test]
fn refuses_pools_larger_than_the_node() {
    let out = common::tiervm()
        .args([
            "serve",
            "--socket",
            "/nonexistent/x.sock",
            "--fast-pool",
            "64T",
            "--slow-pool",
            "1G",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("exceed") && err.contains("NUMA node") && err.contains("lower"),
        "{err}"
    );
}

/// A free loopback TCP port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn prometheus_scrapes_the_service_and_queries_a_series_back() {
    let test = "prometheus_scrapes_the_service_and_queries_a_series_back";
    let Some(prom) = tool(
        test,
        "prometheus",
        &[&["apt-get", "install", "-y", "-qq", "prometheus"]],
    ) else {
        return;
    };
    let mport = free_port();
    let svc = Service::start(
        "prom",
        &[
            "--fast-pool",
            "96M",
            "--slow-pool",
            "512M",
            "--metrics-listen",
            &format!("127.0.0.1:{mport}"),
        ],
    );
    let pport = free_port();
    let cfg = svc.dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: tiervm\n    static_configs:\n      - targets: ['127.0.0.1:{mport}']\n"
        ),
    )
    .unwrap();
    let mut p = Command::new(prom)
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            svc.dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{pport}"))
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(svc.dir.join("prometheus.log")).unwrap(),
        ))
        .spawn()
        .expect("prometheus starts");
    let query = format!(
        "http://127.0.0.1:{pport}/api/v1/query?query=tiervm_host_pool_capacity_bytes%7Btier%3D%22fast%22%7D"
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last;
    let found = loop {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "5", &query])
            .output()
            .expect("curl");
        last = String::from_utf8_lossy(&out.stdout).into_owned();
        let v = json(&last);
        if v["data"]["result"][0]["value"][1] == "100663296" {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let _ = p.kill();
    let _ = p.wait();
    assert!(
        found,
        "Prometheus did not return the fast pool's 96M: last answer {last}; its log: {}",
        std::fs::read_to_string(svc.dir.join("prometheus.log")).unwrap_or_default()
    );
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<String>) {
    let deadline = Instant::now() + timeout;
    let mut last;
    loop {
        match f() {
            None => return,
            Some(why) => last = why,
        }
        assert!(
            Instant::now() < deadline,
            "{what} within {timeout:?}: {last}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Each thread of process `pid` by name, with its `Seccomp:` mode (2: a
/// filter is installed).
fn service_thread_filters(pid: u32) -> std::collections::BTreeMap<String, u32> {
    let mut out = std::collections::BTreeMap::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let mode = status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(u32::MAX);
        out.insert(comm.trim().to_string(), mode);
    }
    out
}

fn alive(pid: i64) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

#[test]
fn three_vms_changed_live_one_killed_then_a_clean_stop() {
    let test = "three_vms_changed_live_one_killed_then_a_clean_stop";
    if !common::kvm_available(test) {
        assert_ne!(
            std::env::var("TIERVM_REQUIRE_KVM").as_deref(),
            Ok("1"),
            "TIERVM_REQUIRE_KVM=1 but KVM is not usable"
        );
        return;
    }
    let mut svc = Service::start(
        "three",
        &[
            "--fast-pool",
            "384M",
            "--slow-pool",
            "2G",
            "--period",
            "1s",
            "--dwell",
            "1s",
        ],
    );
    // Three VMs with different policies and shares, with curl.
    let vms = [
        r#"{"image":"zipf","mem":"256M","args":["rss=192M","wss=128M"],"policy":"nomad","fast":{"min":"64M","max":"192M","weight":1}}"#,
        r#"{"image":"gups","mem":"256M","args":["size=192M","hot_size=64M"],"policy":"memtis","fast":{"min":"32M","max":"128M","weight":2}}"#,
        r#"{"image":"memcheck","mem":"128M","args":["region=32M"],"policy":"tpp","fast":{"min":"32M","max":"64M"}}"#,
    ];
    let mut ids = Vec::new();
    for body in vms {
        let (st, b) = svc.curl("POST", "/v1/vms", Some(body));
        let b = json(&b);
        assert_eq!(st, 201, "{b}");
        ids.push(b["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        wait_for(
            &format!("{id} running with stats"),
            Duration::from_secs(30),
            || {
                let (_, v) = svc.call("GET", &format!("/v1/vms/{id}"), None);
                (v["state"] != "running" || v["tiers"].as_array().is_none_or(|t| t.is_empty()))
                    .then(|| v.to_string())
            },
        );
    }
    // The service's own threads run under their seccomp filters
    // (docs/security.md): the rebalancer, the report collector and each
    // channel's reader; its main thread does not.
    let filters = service_thread_filters(svc.child.as_ref().unwrap().id());
    for name in [
        "serve-rebalance",
        "serve-reports",
        "serve-vm-1",
        "serve-vm-3",
    ] {
        assert_eq!(
            filters.get(name).copied(),
            Some(2),
            "{name} filtered (Seccomp: 2): {filters:?}"
        );
    }
    assert_eq!(filters.get("tiervm").copied(), Some(0), "{filters:?}");
    // The pools account for the mins.
    let (_, host) = svc.call("GET", "/v1/host", None);
    assert_eq!(host["pools"][0]["reserved_bytes"], 128 * M);
    assert_eq!(host["pools"][1]["reserved_bytes"], 640 * M);
    // The division values capacity by what the host measures, not by the
    // guests' own ops/s (docs/service.md, docs/security.md).
    assert_eq!(host["rebalance"]["value"], "host-accesses", "{host}");
    wait_for(
        "vm-2's access rate measured by the host",
        Duration::from_secs(30),
        || {
            let (_, v) = svc.call("GET", &format!("/v1/vms/{}", ids[1]), None);
            let rate = v["fast"]["gain"]["accesses_per_sec"].as_f64();
            rate.is_none_or(|r| r <= 0.0).then(|| v["fast"].to_string())
        },
    );

    // A share changed live (tiervm ctl), watched in GET and /metrics.
    let out = common::tiervm()
        .args(["ctl", "--socket"])
        .arg(&svc.socket)
        .args(["fast", &ids[0], "--min", "96M", "--max", "96M"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let patched = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(patched["target_bytes"], 96 * M, "{patched}");
    wait_for(
        "vm-1's fast tier converged to 96M",
        Duration::from_secs(30),
        || {
            let (_, v) = svc.call("GET", &format!("/v1/vms/{}", ids[0]), None);
            let f = &v["fast"];
            (f["capacity_bytes"] != 96 * M || f["used_bytes"].as_u64().unwrap_or(u64::MAX) > 96 * M)
                .then(|| f.to_string())
        },
    );
    // Mins that no longer fit are refused: a VM's, and the pool's.
    let (st, b) = svc.call(
        "PATCH",
        &format!("/v1/vms/{}/fast", ids[1]),
        Some(r#"{"min":"256M","max":"256M"}"#),
    );
    assert_eq!(st, 202, "96M + 256M + 32M fit the 384M pool exactly: {b}");
    let (st, b) = svc.call(
        "PATCH",
        &format!("/v1/vms/{}/fast", ids[2]),
        Some(r#"{"min":"64M"}"#),
    );
    assert_error(st, &b, 409, "conflict", "a min that does not fit");
    let (st, b) = svc.call("PATCH", "/v1/host", Some(r#"{"fast_pool":"256M"}"#));
    assert_error(st, &b, 409, "conflict", "a pool below the mins");
    let (st, _) = svc.call(
        "PATCH",
        &format!("/v1/vms/{}/fast", ids[1]),
        Some(r#"{"min":"32M","max":"128M"}"#),
    );
    assert_eq!(st, 202);
    // A policy switched live.
    let (st, v) = svc.curl(
        "PUT",
        &format!("/v1/vms/{}/policy", ids[1]),
        Some(r#"{"policy":"tpp"}"#),
    );
    let v = json(&v);
    assert_eq!(
        (st, &v["policy_requested"]),
        (202, &Value::from("tpp")),
        "answered once queued: {v}"
    );
    wait_for(
        "the VM took the switch (policy == policy_requested)",
        Duration::from_secs(20),
        || {
            let (_, v) = svc.call("GET", &format!("/v1/vms/{}", ids[1]), None);
            (v["policy"] != "tpp").then(|| v.to_string())
        },
    );
    let a = metrics(&svc);
    let text = a.text();
    let uuid = |id: &str| {
        let (_, v) = svc.call("GET", &format!("/v1/vms/{id}"), None);
        v["uuid"].as_str().unwrap().to_string()
    };
    assert!(
        text.contains(&format!(
            "tiervm_vm_info{{image=\"gups\",latency_emulation=\"off\",policy=\"tpp\",uuid=\"{}\",vm=\"{}\"}} 1",
            uuid(&ids[1]),
            ids[1]
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "tiervm_vm_fast_target_bytes{{uuid=\"{}\",vm=\"{}\"}} 100663296",
            uuid(&ids[0]),
            ids[0]
        )),
        "{text}"
    );
    assert!(text.contains("tiervm_vm_tier_resident_bytes{"), "{text}");
    assert!(
        text.contains("tiervm_vm_sampled_accesses_total{")
            && text.contains("process_resident_memory_bytes ")
            && text.contains("tiervm_build_info{"),
        "{text}"
    );

    // SIGKILL one VM's process: it shows as crashed, its capacity returns.
    let (_, v) = svc.call("GET", &format!("/v1/vms/{}", ids[2]), None);
    let pid = v["pid"].as_i64().expect("pid");
    // SAFETY: kill(2) on the worker the service started for this test.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    wait_for(
        "the killed VM shows as crashed",
        Duration::from_secs(20),
        || {
            let (_, v) = svc.call("GET", &format!("/v1/vms/{}", ids[2]), None);
            (v["state"] != "crashed" || v["exit"]["signal"] != 9).then(|| v.to_string())
        },
    );
    let (_, host) = svc.call("GET", "/v1/host", None);
    assert_eq!(
        host["pools"][0]["reserved_bytes"],
        128 * M,
        "vm-3's min returned: {host}"
    );
    assert_eq!(host["vms"]["crashed"], 1);
    let (st, b) = svc.call("GET", &format!("/v1/vms/{}/report", ids[2]), None);
    assert_error(st, &b, 404, "not_found", "a killed VM has no report");
    // The service carries on: a new VM starts (tiervm ctl --wait returns
    // once it left `starting`).
    let out = common::tiervm()
        .args(["ctl", "--timeout", "30s", "--wait", "--socket"])
        .arg(&svc.socket)
        .args(["create", "memcheck", "--mem", "64M", "--policy", "static"])
        .args(["--arg", "region=16M"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(v["state"], "running", "ctl --wait create: {v}");
    let fourth = v["id"].as_str().unwrap().to_string();

    // DELETE stops a VM; its report is the run report, and says who
    // stopped it, as GET does.
    let (st, _) = svc.curl("DELETE", &format!("/v1/vms/{}", ids[0]), None);
    assert_eq!(st, 202);
    wait_for("vm-1's report", Duration::from_secs(40), || {
        let (st, r) = svc.call("GET", &format!("/v1/vms/{}/report", ids[0]), None);
        (st != 200 || r["stop_reason"] != "deleted").then(|| format!("{st} {r}"))
    });
    let (_, v) = svc.call("GET", &format!("/v1/vms/{}", ids[0]), None);
    assert_eq!(v["stop_reason"], "deleted", "an API DELETE says so: {v}");
    assert_eq!(v["guest_exit_code"], 0, "{v}");
    let (st, _) = svc.curl("DELETE", &format!("/v1/vms/{}", ids[0]), None);
    assert_eq!(st, 204, "an ended VM is removed");
    let (st, _) = svc.call("GET", &format!("/v1/vms/{}", ids[0]), None);
    assert_eq!(st, 404);

    // A clean stop: every VM stops, reports are written, no process is left.
    let (_, list) = svc.call("GET", "/v1/vms", None);
    let pids: Vec<i64> = list
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["pid"].as_i64())
        .collect();
    assert_eq!(pids.len(), 2, "{list}");
    let status = svc.stop();
    assert!(status.success(), "{status:?}: {}", svc.log());
    for pid in pids {
        assert!(!alive(pid), "worker {pid} outlived the service");
    }
    for id in [&ids[1], &fourth] {
        let r = svc.dir.join("state/reports").join(format!("{id}.json"));
        let report: Value = json(&std::fs::read_to_string(&r).unwrap_or_default());
        assert_eq!(
            report["stop_reason"],
            "service_stopped",
            "{id}'s report at {}",
            r.display()
        );
    }
    let integrity = json(
        &std::fs::read_to_string(svc.dir.join("state/reports").join(format!("{fourth}.json")))
            .unwrap(),
    );
    assert_eq!(
        integrity["guest_metrics"]["mismatched_pages"], 0.0,
        "memcheck lost no write: {integrity}"
    );
    assert!(
        integrity["guest_metrics"]["writes"].as_f64().unwrap_or(0.0) > 0.0,
        "{integrity}"
    );
    assert!(!svc.socket.exists());
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown (the test runs as root)");
}

/// Starts `tiervm serve` expecting it to refuse (exit 2) within 20 s;
/// returns its stderr.
fn refused_start(args: &[&std::ffi::OsStr]) -> String {
    let mut child = common::tiervm()
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let out = child.wait_with_output().unwrap();
            panic!(
                "the service started: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    err
}

/// Issue 32: a root service must never follow what a local user planted.
/// As a local user (uid 65534): a world-writable state directory with a
/// link from `reports/vm-1.json` to a root-owned file, and a world-writable
/// socket directory. The service refuses each with a clear error and
/// writes nothing; a link anywhere on the path is refused too.
#[test]
fn a_root_service_refuses_directories_a_local_user_planted() {
    if euid() != 0 {
        eprintln!("SKIPPED a_root_service_refuses_directories_a_local_user_planted: not root");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let d = temp_dir("planted");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let precious = d.join("precious");
    std::fs::write(&precious, "root's").unwrap();
    std::fs::set_permissions(&precious, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (user, group) = (65534, 65534);
    for sub in ["run", "state/reports", "state/vms"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    for sub in ["run", "state", "state/reports", "state/vms"] {
        std::fs::set_permissions(d.join(sub), std::fs::Permissions::from_mode(0o777)).unwrap();
        chown(&d.join(sub), user, group);
    }
    std::os::unix::fs::symlink(&precious, d.join("state/reports/vm-1.json")).unwrap();
    std::os::unix::fs::symlink(&precious, d.join("state/vms/vm-1.log")).unwrap();
    let pools = ["--fast-pool", "64M", "--slow-pool", "256M"].map(std::ffi::OsStr::new);
    let args = |socket: &Path, state: &Path| {
        let mut v: Vec<std::ffi::OsString> = vec![
            "--socket".into(),
            socket.into(),
            "--state-dir".into(),
            state.into(),
        ];
        v.extend(pools.iter().map(|s| s.to_os_string()));
        v
    };
    let run = |a: Vec<std::ffi::OsString>| {
        refused_start(&a.iter().map(|s| s.as_os_str()).collect::<Vec<_>>())
    };
    // The planted state directory.
    let fresh_run = d.join("fresh-run");
    let err = run(args(&fresh_run.join("api.sock"), &d.join("state")));
    assert!(
        err.contains("the state directory") && err.contains("is owned by uid 65534"),
        "{err}"
    );
    // The world-writable socket directory of another user.
    let err = run(args(&d.join("run/api.sock"), &d.join("fresh-state")));
    assert!(
        err.contains("the socket's directory") && err.contains("is owned by uid 65534"),
        "{err}"
    );
    // A link on the path.
    std::fs::create_dir(d.join("real")).unwrap();
    std::os::unix::fs::symlink(d.join("real"), d.join("link")).unwrap();
    let err = run(args(&fresh_run.join("api.sock"), &d.join("link/state")));
    assert!(err.contains("is a symbolic link"), "{err}");
    // A state directory mode 0777 of root's own is refused too.
    std::fs::create_dir(d.join("open-state")).unwrap();
    std::fs::set_permissions(d.join("open-state"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = run(args(&fresh_run.join("api.sock"), &d.join("open-state")));
    assert!(err.contains("writable by its group or others"), "{err}");
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "root's");
    let _ = std::fs::remove_dir_all(&d);
}

/// `socket_group` and `socket_mode` let a non-root agent in on purpose:
/// without them a local user cannot connect; with them a member of the
/// group can.
#[test]
fn socket_group_and_mode_let_a_chosen_group_in() {
    if euid() != 0 {
        eprintln!("SKIPPED socket_group_and_mode_let_a_chosen_group_in: not root");
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (agent_uid, agent_gid) = (65534u32, 65534u32);
    let as_agent = |svc: &Service| {
        use std::os::unix::process::CommandExt;
        Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .arg("--unix-socket")
            .arg(&svc.socket)
            .arg("http://localhost/v1/host")
            .uid(agent_uid)
            .gid(agent_gid)
            .output()
            .expect("curl runs")
    };
    let svc = Service::start("nogroup", &["--fast-pool", "64M", "--slow-pool", "256M"]);
    std::fs::set_permissions(&svc.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = as_agent(&svc);
    assert_ne!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "another user connected to a 0600 socket"
    );
    drop(svc);
    let cfg = std::env::temp_dir().join(format!("tiervm-serve-group-{}.toml", std::process::id()));
    std::fs::write(
        &cfg,
        format!("socket_group = \"{agent_gid}\"\nsocket_mode = \"0660\"\n"),
    )
    .unwrap();
    let svc = Service::start(
        "group",
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--fast-pool",
            "64M",
            "--slow-pool",
            "256M",
        ],
    );
    std::fs::set_permissions(&svc.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let m = std::fs::metadata(&svc.socket).unwrap();
    assert_eq!((m.mode() & 0o777, m.gid()), (0o660, agent_gid));
    let dm = std::fs::metadata(svc.socket.parent().unwrap()).unwrap();
    assert_eq!((dm.mode() & 0o777, dm.gid()), (0o710, agent_gid));
    let out = as_agent(&svc);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(&cfg);
}

/// A VM's state in the service `svc`.
fn vm(svc: &Service, id: &str) -> Value {
    svc.call("GET", &format!("/v1/vms/{id}"), None).1
}

/// Issue 32 items 3 and 4: ids unique across restarts, client-chosen
/// names (idempotent PUT), labels, a locked state directory, the records
/// of ended VMs and the boot id kept over a restart; a stopped worker is
/// `unresponsive` (GET does not wait for it, PATCH is refused), a forced
/// DELETE kills it and its capacity returns at once; the event stream
/// and the health routes.
#[test]
fn identity_survives_a_restart_and_a_stopped_vm_is_unresponsive() {
    let test = "identity_survives_a_restart_and_a_stopped_vm_is_unresponsive";
    if !common::kvm_available(test) {
        assert_ne!(std::env::var("TIERVM_REQUIRE_KVM").as_deref(), Ok("1"));
        return;
    }
    let cfg = std::env::temp_dir().join(format!("tiervm-serve-ident-{}.toml", std::process::id()));
    std::fs::write(&cfg, "[limits]\nunresponsive_after = \"2s\"\n").unwrap();
    let flags = [
        "--config",
        cfg.to_str().unwrap(),
        "--fast-pool",
        "128M",
        "--slow-pool",
        "512M",
    ];
    let mut a = Service::start("ident", &flags);
    let (st, h) = a.call("GET", "/healthz", None);
    assert_eq!((st, &h["status"]), (200, &Value::from("ok")), "{h}");
    let (st, h) = a.call("GET", "/readyz", None);
    assert_eq!(st, 200, "{h}");
    let (_, host) = a.call("GET", "/v1/host", None);
    let boot_a = host["boot_id"].as_str().unwrap().to_string();
    // A second service on the same state directory refuses to start.
    let err = refused_start(
        &[
            "--socket",
            a.dir.join("other.sock").to_str().unwrap(),
            "--state-dir",
            a.dir.join("state").to_str().unwrap(),
            "--fast-pool",
            "64M",
            "--slow-pool",
            "256M",
        ]
        .map(std::ffi::OsStr::new),
    );
    assert!(err.contains("uses the state directory"), "{err}");
    // A generated id, and a name with labels (PUT is idempotent).
    let short = r#"{"image":"memcheck","mem":"64M","args":["region=8M"],"duration":"1s"}"#;
    let (st, v) = a.call("POST", "/v1/vms", Some(short));
    assert_eq!(st, 201, "{v}");
    let first = v["id"].as_str().unwrap().to_string();
    let named = r#"{"image":"memcheck","mem":"64M","args":["region=8M"],"fast":{"min":"32M"},"labels":{"pod":"web-1"}}"#;
    let (st, v) = a.call("PUT", "/v1/vms/web-1", Some(named));
    assert_eq!(st, 201, "{v}");
    let uuid = v["uuid"].as_str().unwrap().to_string();
    assert_eq!(v["labels"]["pod"], "web-1");
    let (st, v) = a.call("PUT", "/v1/vms/web-1", Some(named));
    assert_eq!((st, &v["uuid"]), (200, &Value::from(uuid.as_str())), "{v}");
    let (st, v) = a.call("PUT", "/v1/vms/web-1", Some(short));
    assert_error(st, &v, 409, "conflict", "another request for the name");
    let (st, v) = a.call("PUT", "/v1/vms/vm-77", Some(short));
    assert_error(st, &v, 400, "bad_request", "a generated id's form");
    wait_for("web-1 running", Duration::from_secs(30), || {
        let v = vm(&a, "web-1");
        (v["state"] != "running").then(|| v.to_string())
    });
    wait_for("the short VM ended", Duration::from_secs(30), || {
        let v = vm(&a, &first);
        (v["state"] != "stopped").then(|| v.to_string())
    });
    assert_eq!(vm(&a, &first)["stop_reason"], "duration");
    // Stop web-1's process: GET answers at once, the VM turns
    // unresponsive, a share change is refused (nothing delivered).
    let pid = vm(&a, "web-1")["pid"].as_i64().unwrap() as i32;
    // SAFETY: kill(2) on the worker the service started for this test.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let t = Instant::now();
    let _ = vm(&a, "web-1");
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "GET waited for a stopped worker: {:?}",
        t.elapsed()
    );
    wait_for("web-1 unresponsive", Duration::from_secs(20), || {
        let v = vm(&a, "web-1");
        (v["state"] != "unresponsive").then(|| v.to_string())
    });
    let (st, v) = a.call("PATCH", "/v1/vms/web-1/fast", Some(r#"{"min":"64M"}"#));
    assert_error(
        st,
        &v,
        409,
        "unresponsive",
        "a share change to a stopped VM",
    );
    let (st, v) = a.call("DELETE", "/v1/vms/web-1", None);
    assert_error(
        st,
        &v,
        409,
        "unresponsive",
        "a plain DELETE of a stopped VM",
    );
    let (st, v) = a.call("DELETE", "/v1/vms/web-1?force=true", None);
    assert_eq!(st, 202, "{v}");
    let (_, host) = a.call("GET", "/v1/host", None);
    assert_eq!(
        host["pools"][0]["reserved_bytes"], 0,
        "released at once: {host}"
    );
    assert_eq!(
        host["pools"][1]["reserved_bytes"], 0,
        "released at once: {host}"
    );
    wait_for("web-1 killed", Duration::from_secs(20), || {
        let v = vm(&a, "web-1");
        (v["state"] != "stopped" || v["stop_reason"] != "force_deleted").then(|| v.to_string())
    });
    // The event stream told each change.
    let (st, ev) = a.call("GET", "/v1/events?since=0", None);
    assert_eq!(st, 200, "{ev}");
    let seen = |vm: &str, state: &str| {
        ev["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "vm_state" && e["vm"] == vm && e["state"] == state)
    };
    for (v, s) in [
        (first.as_str(), "running"),
        (first.as_str(), "stopped"),
        ("web-1", "unresponsive"),
        ("web-1", "stopped"),
    ] {
        assert!(seen(v, s), "{v} {s}: {ev}");
    }
    let next = ev["next"].as_u64().unwrap();
    let t = Instant::now();
    let (_, ev) = a.call("GET", &format!("/v1/events?since={next}&wait=1"), None);
    assert!(
        ev["events"].as_array().unwrap().is_empty() && t.elapsed() >= Duration::from_millis(900),
        "{ev}"
    );
    // A VM running when the service stops says so after the restart.
    let (st, v) = a.call(
        "PUT",
        "/v1/vms/db",
        Some(r#"{"image":"memcheck","mem":"64M","args":["region=8M"]}"#),
    );
    assert_eq!(st, 201, "{v}");
    wait_for("db running", Duration::from_secs(30), || {
        let v = vm(&a, "db");
        (v["state"] != "running").then(|| v.to_string())
    });
    assert!(a.stop().success(), "{}", a.log());
    // The restart: the same state directory, a new boot id; the VMs of the
    // run before are listed with how they ended; ids are not reused.
    let b = a.restarted(&flags);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !b.socket.exists() {
        assert!(
            Instant::now() < deadline,
            "the restarted service did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_, host) = b.call("GET", "/v1/host", None);
    assert_eq!(host["previous_boot_id"], boot_a.as_str(), "{host}");
    assert_ne!(host["boot_id"], boot_a.as_str());
    let (_, list) = b.call("GET", "/v1/vms", None);
    let find = |id: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|v| v["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} not listed after the restart: {list}"))
    };
    let v = find(&first);
    assert_eq!(
        (&v["state"], &v["stop_reason"], &v["boot_id"]),
        (
            &Value::from("stopped"),
            &Value::from("duration"),
            &Value::from(boot_a.as_str())
        ),
        "{v}"
    );
    let v = find("web-1");
    assert_eq!(
        (&v["stop_reason"], &v["uuid"], &v["labels"]["pod"]),
        (
            &Value::from("force_deleted"),
            &Value::from(uuid.as_str()),
            &Value::from("web-1")
        ),
        "{v}"
    );
    assert_eq!(find("db")["stop_reason"], "service_stopped", "{list}");
    let (st, v) = b.call("POST", "/v1/vms", Some(short));
    assert_eq!(st, 201, "{v}");
    assert_ne!(
        v["id"],
        first.as_str(),
        "an id of the run before is not reused: {v}"
    );
    let _ = std::fs::remove_file(&cfg);
}

/// A local user's connection hog (run as that user): opens `n` connections
/// to the API socket and `n` to the metrics listener, half of them with a
/// request line and no end of headers (slowloris), the rest silent; prints
/// how many each side accepted, then reopens every connection the service
/// closes, every 50 ms, until its stdin closes.
const HOG: &str = r#"
import select, socket, sys, time
path, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def open_one(kind, i):
    s = socket.socket(socket.AF_UNIX) if kind == "unix" else socket.socket()
    s.settimeout(0.2)
    try:
        s.connect(path if kind == "unix" else ("127.0.0.1", port))
        if i % 2:
            s.sendall(b"GET /v1/host HTTP/1.1\r\nHost: x\r\n")
        s.setblocking(False)
        return s
    except OSError:
        s.close()
        return None
conns = {(k, i): open_one(k, i) for k in ("unix", "tcp") for i in range(n)}
print("ready", sum(1 for (k, _), s in conns.items() if s and k == "unix"),
      sum(1 for (k, _), s in conns.items() if s and k == "tcp"), flush=True)
while not select.select([sys.stdin], [], [], 0.05)[0]:
    for key, s in list(conns.items()):
        dead = s is None
        if s is not None:
            try:
                if s.recv(4096) == b"":
                    dead = True
            except BlockingIOError:
                pass
            except OSError:
                dead = True
        if dead:
            if s is not None:
                s.close()
            conns[key] = open_one(*key)
"#;

/// Issue 32 defect 6: 300 idle connections of an unprivileged user to the
/// metrics listener made fresh scrapes time out, and 300 on the API socket
/// delayed a request by 5 s. Now a client (a uid on the socket, an address
/// on TCP) holds a bounded number of connections and a full listener closes
/// an idle connection of its biggest client: with 300 + 300 idle and
/// slowloris connections of uid 65534, reopened as fast as the service
/// closes them, root's requests and scrapes each answer within 2 s.
#[test]
fn hundreds_of_idle_connections_of_another_user_do_not_starve_a_client() {
    let test = "hundreds_of_idle_connections_of_another_user_do_not_starve_a_client";
    if euid() != 0 {
        eprintln!("SKIPPED {test}: not root");
        return;
    }
    use std::io::{BufRead, Read};
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let (user, group) = (65534u32, 65534u32);
    let cfg = std::env::temp_dir().join(format!("tiervm-serve-hog-{}.toml", std::process::id()));
    std::fs::write(
        &cfg,
        format!("socket_group = \"{group}\"\nsocket_mode = \"0660\"\n"),
    )
    .unwrap();
    let mport = free_port();
    let svc = Service::start(
        "hog",
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--fast-pool",
            "64M",
            "--slow-pool",
            "256M",
            "--metrics-listen",
            &format!("127.0.0.1:{mport}"),
        ],
    );
    std::fs::set_permissions(&svc.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let python = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let Some(python) = python else {
        eprintln!("SKIPPED {test}: no python3 for the hog");
        return;
    };
    let mut hog = Command::new(python)
        .args(["-c", HOG])
        .arg(&svc.socket)
        .arg(mport.to_string())
        .arg("300")
        .uid(user)
        .gid(group)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the hog starts");
    let mut line = String::new();
    std::io::BufReader::new(hog.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if !line.starts_with("ready") {
        let mut err = String::new();
        let _ = hog.stderr.take().unwrap().read_to_string(&mut err);
        panic!("the hog did not start: {line} {err}");
    }
    eprintln!("{test}: the hog connected: {}", line.trim());
    let scrape = || {
        let t = Instant::now();
        let out = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "20",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .arg(format!("http://127.0.0.1:{mport}/metrics"))
            .output()
            .expect("curl runs");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            t.elapsed(),
        )
    };
    let mut worst = (Duration::ZERO, Duration::ZERO);
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        let a = client::request(
            &svc.socket,
            "GET",
            "/v1/host",
            None,
            Duration::from_secs(20),
        );
        let api = t.elapsed();
        assert!(
            a.as_ref().is_ok_and(|a| a.status == 200),
            "the API request failed beside the hog after {api:?}: {:?}",
            a.err()
        );
        let (code, m) = scrape();
        assert_eq!(code, "200", "the scrape failed beside the hog after {m:?}");
        worst = (worst.0.max(api), worst.1.max(m));
    }
    let _ = hog.stdin.take();
    let _ = hog.wait();
    eprintln!(
        "{test}: slowest request {:?}, slowest scrape {:?}",
        worst.0, worst.1
    );
    // The defect made a client wait 5 s or time out; 2 s tells that apart
    // from a loaded 2-core CI host, where one scrape took 1.03 s
    // (2026-11-29) beside the hog while the rest of the suite ran.
    assert!(
        worst.0 < Duration::from_secs(2) && worst.1 < Duration::from_secs(2),
        "a client waited beside the hog: request {:?}, scrape {:?}",
        worst.0,
        worst.1
    );
    let m = metrics(&svc).text();
    assert!(
        m.lines().any(
            |l| l.starts_with("tiervm_api_connections_evicted_total{listener=\"api\"}")
                && !l.ends_with(" 0")
        ),
        "the hog's connections were closed to make room: {m}"
    );
    let _ = std::fs::remove_file(&cfg);
}

/// Sends `raw` on a new connection to the API socket and reads the answer
/// to its end: the status and the body.
fn raw_request(socket: &Path, raw: &[u8]) -> (u16, String, String) {
    use std::io::Read;
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(raw);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

/// Issue 32 defect 9: the HTTP library's own answers to a request it cannot
/// parse (a bad request line or header: 400; headers too large or too many: 431) had
/// empty, non-JSON bodies. They are the API's JSON errors now.
#[test]
fn unparsable_requests_get_json_errors() {
    let svc = Service::start("unparsable", &["--fast-pool", "64M", "--slow-pool", "256M"]);
    let big = format!(
        "GET /v1/host HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let many: String = (0..150).map(|i| format!("X-H{i}: v\r\n")).collect();
    let many = format!("GET /v1/host HTTP/1.1\r\nHost: x\r\n{many}\r\n");
    for (raw, want, code) in [
        (&b"GARBAGE\r\n\r\n"[..], 400, "bad_request"),
        (
            b"GET /v1/host HTTP/1.1\r\nBad Header\r\n\r\n",
            400,
            "bad_request",
        ),
        (b"GET /v1/\x01host HTTP/1.1\r\n\r\n", 400, "bad_request"),
        (big.as_bytes(), 431, "headers_too_large"),
        (many.as_bytes(), 431, "headers_too_large"),
    ] {
        let (st, head, body) = raw_request(&svc.socket, raw);
        let what = String::from_utf8_lossy(&raw[..raw.len().min(40)]).into_owned();
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{what}: {head}"
        );
        assert_error(st, &json(&body), want, code, &what);
    }
    // The service still answers.
    let (st, _) = svc.call("GET", "/v1/host", None);
    assert_eq!(st, 200);
}

/// Issue 32 defect 8: a create whose `mem` does not fit the slow pool is a
/// 409 in the API's words (it was a 400 naming `--slow`), and so is a fast
/// min over the pool; nothing is reserved.
#[test]
fn a_create_larger_than_the_pools_is_a_409() {
    let svc = Service::start("toolarge", &["--fast-pool", "64M", "--slow-pool", "256M"]);
    for (body, field) in [
        (r#"{"image":"zipf","mem":"64G"}"#, "mem"),
        (r#"{"image":"zipf","mem":"512M"}"#, "mem"),
        (
            r#"{"image":"zipf","mem":"128M","fast":{"min":"128M"}}"#,
            "min",
        ),
    ] {
        let (st, e) = svc.call("POST", "/v1/vms", Some(body));
        assert_error(st, &e, 409, "conflict", body);
        let m = e["message"].as_str().unwrap();
        assert!(m.contains(field) && !m.contains("--"), "{body}: {e}");
    }
    // A bad latency-emulation spec is a 400 naming the field.
    let (st, e) = svc.call(
        "POST",
        "/v1/vms",
        Some(
            r#"{"image":"memcheck","mem":"64M","args":["region=8M"],"emulate_latency":"fast=abc"}"#,
        ),
    );
    assert_error(st, &e, 400, "bad_request", "emulate_latency");
    assert!(
        e["message"].as_str().unwrap().contains("emulate_latency")
            || e["message"].as_str().unwrap().contains("fast=abc"),
        "{e}"
    );
    let (_, host) = svc.call("GET", "/v1/host", None);
    assert_eq!(host["pools"][1]["reserved_bytes"], 0, "{host}");
    let (_, list) = svc.call("GET", "/v1/vms", None);
    assert_eq!(list, Value::Array(Vec::new()));
}

/// A guest image that spins for about a second (3e9 iterations of
/// `dec rcx; jnz`), then exits with code 0xB008.
fn failing_late_image(dir: &Path) -> PathBuf {
    let mut code = vec![0x48, 0xB9];
    code.extend_from_slice(&3_000_000_000u64.to_le_bytes()); // mov rcx, 3e9
    code.extend_from_slice(&[0x48, 0xFF, 0xC9, 0x75, 0xFB]); // dec rcx; jnz -5
    code.extend_from_slice(&[0xB8, 0x08, 0xB0, 0x00, 0x00]); // mov eax, 0xB008
    code.extend_from_slice(&[0x66, 0xBA, 0x01, 0x05]); // mov dx, 0x501 (PORT_EXIT)
    code.extend_from_slice(&[0xEF, 0xEB, 0xFE]); // out dx, eax; jmp $
    let built = common::image_with_entry_code("fail-late.elf", &code);
    let p = dir.join("fail-late.elf");
    std::fs::copy(&built, &p).unwrap();
    p
}

/// Issue 32 defect 7: a guest that fails after its VM reached `running`
/// (it exits 0xB008 a second in) made `tiervm ctl --wait create` exit 0.
/// A create with a duration now waits for the run's end and exits 1 with
/// the guest's code; a run that ends well exits 0.
#[test]
fn ctl_wait_create_fails_when_the_guest_fails_after_running() {
    let test = "ctl_wait_create_fails_when_the_guest_fails_after_running";
    if !common::kvm_available(test) {
        assert_ne!(std::env::var("TIERVM_REQUIRE_KVM").as_deref(), Ok("1"));
        return;
    }
    let images = temp_dir("images");
    failing_late_image(&images);
    let cfg = images.join("serve.toml");
    std::fs::write(&cfg, format!("image_dir = \"{}\"\n", images.display())).unwrap();
    let svc = Service::start(
        "failing",
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--fast-pool",
            "64M",
            "--slow-pool",
            "256M",
        ],
    );
    let ctl = |args: &[&str]| {
        common::tiervm()
            .args(["ctl", "--timeout", "60s", "--wait", "--socket"])
            .arg(&svc.socket)
            .args(args)
            .output()
            .unwrap()
    };
    let out = ctl(&[
        "create",
        "fail-late.elf",
        "--mem",
        "32M",
        "--policy",
        "static",
        "--duration",
        "30s",
    ]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let v = json(&stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout} {stderr}");
    assert!(stderr.contains("0xb008"), "{stderr}");
    assert_eq!(
        (&v["state"], &v["guest_exit_code"]),
        (&Value::from("stopped"), &Value::from(0xB008)),
        "{v}"
    );
    // It was running before it failed.
    let id = v["id"].as_str().unwrap();
    let (_, ev) = svc.call("GET", "/v1/events?since=0", None);
    assert!(
        ev["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["vm"] == id && e["state"] == "running"),
        "{ev}"
    );
    // With tier latency emulated (the default preset, named in the answer
    // and in the metrics).
    let out = ctl(&[
        "create",
        "memcheck",
        "--mem",
        "64M",
        "--policy",
        "static",
        "--duration",
        "1s",
        "--arg",
        "region=8M",
        "--emulate-latency",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        (&v["state"], &v["guest_exit_code"], &v["emulate_latency"]),
        (
            &Value::from("stopped"),
            &Value::from(0),
            &Value::from("nomad-a")
        ),
        "{v}"
    );
    let m = metrics(&svc).text();
    assert!(
        m.lines().any(|l| l.starts_with("tiervm_vm_info{")
            && l.contains("latency_emulation=\"nomad-a\"")
            && l.contains(v["id"].as_str().unwrap())),
        "{m}"
    );
    let _ = std::fs::remove_dir_all(&images);
}

/// Issue 32 item 2: a service SIGKILLed while a VM runs leaves a record
/// that says the VM ran; restarted on the same state directory, it lists
/// the VM `lost`, with the run that lost it and why, and its worker did
/// not outlive the service that started it.
#[test]
fn a_vm_of_a_killed_service_is_listed_lost_after_a_restart() {
    let test = "a_vm_of_a_killed_service_is_listed_lost_after_a_restart";
    if !common::kvm_available(test) {
        assert_ne!(std::env::var("TIERVM_REQUIRE_KVM").as_deref(), Ok("1"));
        return;
    }
    let flags = ["--fast-pool", "64M", "--slow-pool", "256M"];
    let mut a = Service::start("lost", &flags);
    let (_, host) = a.call("GET", "/v1/host", None);
    let boot_a = host["boot_id"].as_str().unwrap().to_string();
    let (st, v) = a.call(
        "PUT",
        "/v1/vms/db",
        Some(r#"{"image":"memcheck","mem":"64M","args":["region=8M"],"labels":{"pod":"db-0"}}"#),
    );
    assert_eq!(st, 201, "{v}");
    let uuid = v["uuid"].as_str().unwrap().to_string();
    wait_for("db running", Duration::from_secs(30), || {
        let v = vm(&a, "db");
        (v["state"] != "running").then(|| v.to_string())
    });
    let worker = vm(&a, "db")["pid"].as_i64().unwrap();
    let mut child = a.child.take().unwrap();
    child.kill().unwrap();
    let _ = child.wait();
    // The worker reads end-of-file on its channel and stops its VM.
    let deadline = Instant::now() + Duration::from_secs(20);
    while alive(worker) {
        assert!(Instant::now() < deadline, "the worker outlived its service");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SIGKILL left the socket behind: the restart removes it (nobody answers).
    let b = a.restarted(&flags);
    wait_for("the restarted service", Duration::from_secs(20), || {
        client::request(&b.socket, "GET", "/healthz", None, Duration::from_secs(2))
            .is_err()
            .then(|| std::fs::read_to_string(a.dir.join("serve-b.log")).unwrap_or_default())
    });
    let (_, list) = b.call("GET", "/v1/vms", None);
    let v = list
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == "db")
        .cloned()
        .unwrap_or_else(|| panic!("db not listed: {list}"));
    assert_eq!(
        (
            &v["state"],
            &v["stop_reason"],
            &v["boot_id"],
            &v["uuid"],
            &v["labels"]["pod"]
        ),
        (
            &Value::from("lost"),
            &Value::from("service_lost"),
            &Value::from(boot_a.as_str()),
            &Value::from(uuid.as_str()),
            &Value::from("db-0")
        ),
        "{v}"
    );
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains(&boot_a)),
        "{v}"
    );
    let (_, host) = b.call("GET", "/v1/host", None);
    assert_eq!(host["previous_boot_id"], boot_a.as_str(), "{host}");
    assert_eq!(host["vms"]["lost"], 1, "{host}");
    assert_eq!(
        host["pools"][1]["reserved_bytes"], 0,
        "a lost VM holds nothing: {host}"
    );
    drop(a);
}

/// Whether the service process is still running (not exited).
fn service_alive(svc: &mut Service) -> bool {
    svc.child
        .as_mut()
        .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
}

fn running_vm(svc: &Service, body: &str) -> (String, i32) {
    let (st, v) = svc.call("POST", "/v1/vms", Some(body));
    assert_eq!(st, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    wait_for(&format!("{id} running"), Duration::from_secs(30), || {
        let v = vm(svc, &id);
        (v["state"] != "running").then(|| v.to_string())
    });
    let pid = vm(svc, &id)["pid"].as_i64().unwrap() as i32;
    (id, pid)
}

/// Re-test of issue 32, defect 1: a forced DELETE of a VM while the
/// rebalancer waited on its statistics polls killed the whole service
/// (exit 159: the rebalancer dropped the last reference to the deleted
/// VM's channel and closed its descriptor, which its seccomp filter did
/// not allow; 2 of 16 tries). Made deterministic: VM `a` is stopped, so
/// each stats poll waits its full second on `a` while holding the
/// channels of the VMs after it; VM `b` answers each poll at its start,
/// so a `silent_s` near 0 says a poll has just begun, and `b` is stopped
/// and force-deleted then, within that wait: the rebalancer is left the
/// last reference. (Shares are fixed, min = max, so the rebalancer sends
/// no resize that would make it wait on `b` instead.) Four rounds: the
/// service must survive every one.
#[test]
fn a_forced_delete_during_a_stats_poll_leaves_the_service_running() {
    let test = "a_forced_delete_during_a_stats_poll_leaves_the_service_running";
    if !common::kvm_available(test) {
        assert_ne!(std::env::var("TIERVM_REQUIRE_KVM").as_deref(), Ok("1"));
        return;
    }
    let mut svc = Service::start("forcedrop", &["--fast-pool", "128M", "--slow-pool", "512M"]);
    let body =
        r#"{"image":"memcheck","mem":"64M","args":["region=8M"],"fast":{"min":"32M","max":"32M"}}"#;
    let (_, a_pid) = running_vm(&svc, body);
    // SAFETY: kill(2) on the worker the service started for this test.
    assert_eq!(unsafe { libc::kill(a_pid, libc::SIGSTOP) }, 0);
    for round in 0..4 {
        let (b, b_pid) = running_vm(&svc, body);
        // A poll has just begun: `b` answered it (a silence that drops
        // back near 0; its start-up event reset it too, so first wait for
        // a silence of half a second).
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut waited = false;
        loop {
            let v = vm(&svc, &b);
            let silent = v["silent_s"].as_f64().unwrap_or(0.0);
            waited |= silent > 0.5;
            if waited && silent < 0.25 {
                break;
            }
            assert!(Instant::now() < deadline, "round {round}: {v}");
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(b_pid, libc::SIGSTOP) }, 0);
        let (st, v) = svc.call("DELETE", &format!("/v1/vms/{b}?force=true"), None);
        assert_eq!(st, 202, "round {round}: {v}");
        // Past the rebalancer's wait on `a` and its next round.
        std::thread::sleep(Duration::from_millis(3000));
        assert!(
            service_alive(&mut svc),
            "round {round}: the service died: {}",
            svc.log()
        );
        let (st, h) = svc.call("GET", "/healthz", None);
        assert_eq!(st, 200, "{h}");
        assert_eq!(vm(&svc, &b)["stop_reason"], "force_deleted");
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(a_pid, libc::SIGCONT) }, 0);
    assert!(svc.stop().success(), "{}", svc.log());
}

/// Re-test of issue 32, defect 2: with `unresponsive_after = 5s` a
/// stopped VM showed `running` at 7 s of silence and a PATCH waited 2 s
/// and answered 202 with nothing delivered. Now every answer shows
/// `unresponsive` once the silence exceeds the setting, the event comes
/// within a second of it, and PATCH and DELETE answer 409 at once. Also:
/// a DELETE's run report says `deleted`, as GET does.
#[test]
fn a_silent_vm_is_unresponsive_as_soon_as_the_setting_passes() {
    let test = "a_silent_vm_is_unresponsive_as_soon_as_the_setting_passes";
    if !common::kvm_available(test) {
        assert_ne!(std::env::var("TIERVM_REQUIRE_KVM").as_deref(), Ok("1"));
        return;
    }
    let cfg = std::env::temp_dir().join(format!("tiervm-serve-silent-{}.toml", std::process::id()));
    std::fs::write(&cfg, "[limits]\nunresponsive_after = \"2s\"\n").unwrap();
    let mut svc = Service::start(
        "silent",
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--fast-pool",
            "128M",
            "--slow-pool",
            "512M",
        ],
    );
    let body = r#"{"image":"memcheck","mem":"64M","args":["region=8M"]}"#;
    for attempt in 0..3 {
        let (id, pid) = running_vm(&svc, body);
        let (_, ev) = svc.call("GET", "/v1/events?since=0", None);
        let since = ev["next"].as_u64().unwrap();
        // SAFETY: kill(2) on the worker the service started for this test.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        let stopped = Instant::now();
        // Past the setting (the worker's last line came before the stop).
        std::thread::sleep(Duration::from_millis(2100 + 300 * attempt));
        let t = Instant::now();
        let v = vm(&svc, &id);
        assert_eq!(v["state"], "unresponsive", "attempt {attempt}: {v}");
        let (st, e) = svc.call(
            "PATCH",
            &format!("/v1/vms/{id}/fast"),
            Some(r#"{"min":"32M"}"#),
        );
        assert_error(st, &e, 409, "unresponsive", "a PATCH past the setting");
        let (st, e) = svc.call("DELETE", &format!("/v1/vms/{id}"), None);
        assert_error(st, &e, 409, "unresponsive", "a DELETE past the setting");
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "attempt {attempt}: GET, PATCH and DELETE waited: {:?}",
            t.elapsed()
        );
        let (_, ev) = svc.call("GET", &format!("/v1/events?since={since}&wait=2"), None);
        assert!(
            ev["events"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["vm"] == id.as_str() && e["state"] == "unresponsive"),
            "attempt {attempt}: no event: {ev}"
        );
        assert!(
            stopped.elapsed() < Duration::from_millis(3500 + 300 * attempt),
            "{:?}",
            stopped.elapsed()
        );
        let (st, v) = svc.call("DELETE", &format!("/v1/vms/{id}?force=true"), None);
        assert_eq!(st, 202, "{v}");
    }
    // A plain DELETE: the report agrees with GET on who stopped the VM.
    let (id, _) = running_vm(&svc, body);
    let (st, v) = svc.call("DELETE", &format!("/v1/vms/{id}"), None);
    assert_eq!(st, 202, "{v}");
    wait_for("the report", Duration::from_secs(30), || {
        let v = vm(&svc, &id);
        (v["report_ready"] != true).then(|| v.to_string())
    });
    assert_eq!(vm(&svc, &id)["stop_reason"], "deleted");
    let (st, r) = svc.call("GET", &format!("/v1/vms/{id}/report"), None);
    assert_eq!(
        (st, &r["stop_reason"]),
        (200, &Value::from("deleted")),
        "{}",
        r["stop_reason"]
    );
    let file: Value = serde_json::from_str(
        &std::fs::read_to_string(svc.dir.join(format!("state/reports/{id}.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(file["stop_reason"], "deleted");
    assert!(svc.stop().success(), "{}", svc.log());
    let _ = std::fs::remove_file(&cfg);
}

/// Re-test of issue 32, small defects, in the API's words: a log link
/// planted in the state directory, an image path, a non-ELF image, a
/// header above the documented 64 KiB, a JSON array for a policy.
#[test]
fn planted_logs_bad_images_big_headers_and_arrays_answer_documented_errors() {
    let dir = temp_dir("small-img");
    let images = dir.join("images");
    std::fs::create_dir_all(&images).unwrap();
    std::fs::write(images.join("f-badmagic"), b"not an ELF file at all").unwrap();
    let cfg = dir.join("serve.toml");
    std::fs::write(&cfg, format!("image_dir = \"{}\"\n", images.display())).unwrap();
    let svc = Service::start(
        "small",
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--fast-pool",
            "64M",
            "--slow-pool",
            "256M",
        ],
    );
    let host_path = images.to_str().unwrap();
    // Every check runs (and says what failed), then the test fails.
    let mut failed = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failed.push(what);
        }
    };
    let is_error = |st: u16, e: &Value, want: u16, code: &str| {
        st == want
            && e["code"] == code
            && e["message"].as_str().is_some_and(|m| !m.is_empty())
            && e["fix"].as_str().is_some_and(|m| !m.is_empty())
    };
    for image in ["/etc/passwd", "../x", "a/b"] {
        let body = format!(r#"{{"image":"{image}","mem":"64M"}}"#);
        let (st, e) = svc.call("POST", "/v1/vms", Some(&body));
        check(
            is_error(st, &e, 400, "bad_request"),
            format!("{image}: {st} {e}"),
        );
        check(
            !e.to_string().contains(host_path),
            format!("{image}: a host path: {e}"),
        );
    }
    let (st, e) = svc.call(
        "POST",
        "/v1/vms",
        Some(r#"{"image":"f-badmagic","mem":"64M"}"#),
    );
    check(
        is_error(st, &e, 400, "bad_request"),
        format!("non-ELF: {st} {e}"),
    );
    let m = e["message"].as_str().unwrap_or_default();
    check(
        m.contains("image 'f-badmagic'") && !m.contains("image 'image") && !m.contains(host_path),
        format!("non-ELF, quoted once, no host path: {e}"),
    );
    // A PUT of a policy as an array names the body, not `fast`.
    let (st, e) = svc.call("PUT", "/v1/vms/vm-1/policy", Some(r#"["tpp"]"#));
    check(
        is_error(st, &e, 400, "bad_request"),
        format!("array policy: {st} {e}"),
    );
    check(
        !e["message"].as_str().unwrap_or_default().contains("fast"),
        format!("array policy names `fast`: {e}"),
    );
    // One header of 80 KB: 431, as documented.
    let big = format!(
        "GET /v1/host HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(80_000)
    );
    let (st, _, body) = raw_request(&svc.socket, big.as_bytes());
    check(
        st == 431 && json(&body)["code"] == "headers_too_large",
        format!("an 80 KB header: {st} {body}"),
    );
    // A log link planted in the state directory: a documented error that
    // names the planted path and the fix, not an internal error.
    let vms = svc.dir.join("state").join("vms");
    for n in 1..=3 {
        std::os::unix::fs::symlink("/etc/hostname", vms.join(format!("vm-{n}.log"))).unwrap();
    }
    let (st, e) = svc.call(
        "POST",
        "/v1/vms",
        Some(r#"{"image":"memcheck","mem":"64M","args":["region=8M"]}"#),
    );
    check(
        is_error(st, &e, 500, "state_dir"),
        format!("planted log: {st} {e}"),
    );
    let (m, fix) = (
        e["message"].as_str().unwrap_or_default(),
        e["fix"].as_str().unwrap_or_default(),
    );
    check(
        m.contains("vms/vm-1.log") && m.contains("symbolic link") && fix.contains("remove"),
        format!("planted log: names the file, the problem and the fix: {e}"),
    );
    let (_, list) = svc.call("GET", "/v1/vms", None);
    check(
        list == Value::Array(Vec::new()),
        format!("nothing was created: {list}"),
    );
    assert!(failed.is_empty(), "{failed:#?}");
}
