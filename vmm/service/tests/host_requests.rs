//! The service's requests (`host.rs`) on stand-in workers
//! (`stand_in/mod.rs`): every field of a create checked, names and
//! images, what the worker is asked to run, `PATCH .../fast` and
//! `PATCH /v1/host` at their bounds, and the division's targets applied.
//! In process, no KVM (issue 34: the part of host.rs its unit tests
//! cannot reach; `tests/serve.rs` runs the same API on real VMs).

mod stand_in;

use std::time::Duration;

use stand_in::{create, zipf, Service, M};
use vmm_service::host_error::{HostError, HostErrorKind};
use vmm_service::types::{FastRequest, PatchHost};

/// Not a test: the stand-in worker's entry (`stand_in::worker_main`).
#[test]
fn stand_in_worker() {
    stand_in::worker_main();
}

/// A create of `fields` (JSON members added to a small zipf VM's) that
/// must be a 400 whose message holds `says`.
fn bad(svc: &Service, fields: &str, says: &str) {
    let json = format!(r#"{{"image":"zipf","args":["rss=16M","wss=8M"]{fields}}}"#);
    match create(&svc.host, None, &json) {
        Err(e) => {
            assert_eq!(e.kind, HostErrorKind::Invalid, "{fields}: {e:?}");
            assert!(e.message.contains(says), "{fields}: {e:?}");
        }
        Ok(v) => panic!("{fields}: admitted as {}", v.id),
    }
}

fn ok(svc: &Service, name: Option<&str>, fields: &str) -> String {
    let json = format!(r#"{{"image":"zipf","args":["rss=16M","wss=8M"]{fields}}}"#);
    let v = create(&svc.host, name, &json).unwrap_or_else(|e| panic!("{fields}: {e:?}"));
    svc.force_delete(&v.id);
    assert_eq!(svc.host.delete(&v.id, false), Ok(false));
    v.id
}

#[test]
fn every_field_of_a_create_is_checked_at_its_bounds() {
    let svc = Service::new("fields");
    let max_vcpus = tiervm_guest::abi::MAX_VCPUS;
    bad(&svc, r#","vcpus":0"#, "vcpus 0 is out of range");
    bad(
        &svc,
        &format!(r#","vcpus":{}"#, max_vcpus + 1),
        "out of range",
    );
    ok(&svc, None, &format!(r#","vcpus":{max_vcpus}"#));
    bad(&svc, r#","seed":9007199254740992"#, "seed 9007199254740992");
    ok(&svc, None, r#","seed":9007199254740991"#);
    bad(&svc, r#","mem":"65M""#, "mem 65M is not a multiple of 2M");
    bad(&svc, r#","fast":{"min":"3M"}"#, "fast.min 3M");
    bad(&svc, r#","fast":{"max":"5M"}"#, "fast.max 5M");
    bad(
        &svc,
        r#","fast":{"min":"8M","max":"6M"}"#,
        "need min <= max <= mem",
    );
    bad(
        &svc,
        r#","mem":"64M","fast":{"max":"66M"}"#,
        "need min <= max <= mem",
    );
    ok(
        &svc,
        None,
        r#","mem":"64M","fast":{"min":"64M","max":"64M"}"#,
    );
    for w in ["0", "-1", "1000001"] {
        bad(
            &svc,
            &format!(r#","fast":{{"weight":{w}}}"#),
            "out of range",
        );
    }
    ok(&svc, None, r#","fast":{"weight":1000000}"#);
    bad(&svc, r#","tracking":"pebs""#, "tracking 'pebs'");
    ok(&svc, None, r#","tracking":"off""#);
    bad(&svc, r#","duration":"soon""#, "soon");
    bad(
        &svc,
        r#","policy":"fastest""#,
        "'fastest' is not a placement policy",
    );
    // The VM's own validation, in the API's words.
    let e = create(&svc.host, None, r#"{"image":"zipf","args":["bogus=1"]}"#).expect_err("args");
    assert_eq!(e.kind, HostErrorKind::Invalid, "{e:?}");
    // Written for `tiervm run`'s `--arg`, answered in the API's field.
    assert!(
        e.message
            .starts_with("unknown args key 'bogus' for image zipf"),
        "{e:?}"
    );
    let too_many: Vec<String> = (0..33).map(|i| format!(r#""k{i}":"v""#)).collect();
    bad(
        &svc,
        &format!(r#","labels":{{{}}}"#, too_many.join(",")),
        "33 labels",
    );
    bad(&svc, r#","labels":{"":"v"}"#, "label key '' is not valid");
    bad(&svc, r#","labels":{"a b":"v"}"#, "label key 'a b'");
    let long_key = "k".repeat(64);
    bad(
        &svc,
        &format!(r#","labels":{{"{long_key}":"v"}}"#),
        "is not valid",
    );
    let long = "v".repeat(257);
    bad(
        &svc,
        &format!(r#","labels":{{"k":"{long}"}}"#),
        "the value is not valid",
    );
    bad(&svc, r#","labels":{"k":"a\nb"}"#, "the value is not valid");
    let fine: Vec<String> = (0..32).map(|i| format!(r#""k/{i}.-_":"v""#)).collect();
    let v = "v".repeat(256);
    ok(
        &svc,
        None,
        &format!(
            r#","labels":{{{},"{}":"{v}"}}"#,
            fine[1..].join(","),
            "k".repeat(63)
        ),
    );
    assert_eq!(svc.host.list().len(), 0);
}

#[test]
fn names_are_checked_and_a_put_of_the_same_request_is_idempotent() {
    let svc = Service::new("names");
    let name_refused = |n: &str, says: &str| match create(&svc.host, Some(n), &zipf(64, 0, 64)) {
        Err(HostError { kind, message, .. }) => {
            assert_eq!(kind, HostErrorKind::Invalid, "{n}: {message}");
            assert!(message.contains(says), "{n}: {message}");
        }
        Ok(_) => panic!("'{n}' taken as a name"),
    };
    for n in ["", "A", "-a", "a-", "a b", "ä", &"a".repeat(64)] {
        name_refused(n, "is not a VM name");
    }
    name_refused("vm-12", "the form of the ids the service generates");
    for n in ["a", "0", "vm-1a", "vm-x1", "a.b_c-d", &"a".repeat(63)] {
        ok(&svc, Some(n), "");
    }
    let req = zipf(64, 0, 64);
    let v = create(&svc.host, Some("web"), &req).expect("created");
    let parsed = serde_json::from_str(&req).unwrap();
    let (created, again) = svc.host.put_vm("web", &parsed).expect("the same request");
    assert!(!created, "the same request creates nothing");
    assert_eq!(again.uuid, v.uuid);
    let e = create(&svc.host, Some("web"), &zipf(64, 2, 64)).expect_err("another request");
    assert_eq!(e.kind, HostErrorKind::Conflict);
    assert!(e.message.contains("with a different request"), "{e:?}");
    // Names take no generated id.
    let g = create(&svc.host, None, &zipf(64, 0, 64)).expect("created");
    assert_eq!(g.id, "vm-1");
}

#[test]
fn images_are_built_in_or_plain_files_of_the_image_dir_and_named_so_in_errors() {
    let (mut cfg, dir) = stand_in::config("images");
    let images = dir.join("images");
    std::fs::create_dir_all(images.join("sub")).unwrap();
    std::fs::write(images.join("junk.elf"), b"not an ELF").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", images.join("link")).unwrap();
    cfg.image_dir = Some(images.clone());
    let svc = Service::start(cfg, dir.clone());
    let image = |name: &str| format!(r#"{{"image":"{name}"}}"#);
    let refused = |name: &str, says: &str| {
        let e = create(&svc.host, None, &image(name)).expect_err(name);
        assert_eq!(e.kind, HostErrorKind::Invalid, "{name}: {e:?}");
        assert!(e.message.contains(says), "{name}: {e:?}");
        assert!(
            !e.message.contains(&*dir.to_string_lossy()),
            "a host path: {e:?}"
        );
    };
    refused("../x", "nor a file name");
    refused("sub/x", "nor a file name");
    refused(".", "nor a file name");
    refused("missing", "nor a file in the image directory");
    refused("link", "not a regular file");
    refused("sub", "not a regular file");
    // A file of the directory is read as the VM's image: its error names
    // it as the request did.
    refused("junk.elf", "image 'junk.elf'");
    // Without an image directory only built-in images.
    let svc2 = Service::new("images-none");
    let e = create(&svc2.host, None, &image("junk.elf")).expect_err("no image_dir");
    assert!(e.message.contains("this service has no image_dir"), "{e:?}");
}

#[test]
fn the_worker_is_asked_to_run_the_request_with_the_fast_tier_admission_left() {
    let svc = Service::with("spec", |cfg| {
        cfg.max_vms = 3;
    });
    // The first VM's max is its min: it never holds more than 192M.
    let a = svc.running(None, &zipf(256, 192, 192));
    let b_json = r#"{"image":"zipf","args":["rss=16M"],"mem":"128M","vcpus":2,"seed":42,
        "duration":"90s","policy":"tpp","tracking":"off","emulate_latency":" ",
        "fast":{"min":"48M","max":"96M","weight":2.5}}"#;
    let b = create(&svc.host, None, b_json).expect("admitted");
    {
        let s = svc.host.state();
        let spec_of = |id: &str| &s.vms.values().find(|v| v.id == id).expect("listed").spec;
        // Each starts with its min: what is free of the pool covers it.
        assert_eq!(spec_of(&a.id).vm.tiering.fast, Some(192 * M));
        let spec = spec_of(&b.id);
        assert_eq!(spec.vm.tiering.fast, Some(48 * M));
        assert_eq!(spec.id, "vm-2");
        assert_eq!(spec.vm.vcpus, 2);
        assert_eq!(spec.vm.seed, 42);
        assert_eq!(spec_of(&a.id).vm.seed, 1, "the default seed");
        assert_eq!(spec.vm.mem_bytes, 128 * M);
        assert_eq!(spec.vm.duration, Duration::from_secs(90));
        assert_eq!(spec.vm.tiering.slow, Some(128 * M));
        assert_eq!(spec.vm.args, ["rss=16M"]);
        assert_eq!(spec.vm.stop_grace, svc.host.cfg.defaults.stop_grace);
        let nodes = (spec.vm.tiering.fast_node, spec.vm.tiering.slow_node);
        assert_eq!(nodes, (Some(0), Some(0)));
        assert_eq!(s.counters.created, 2);
        let policy = serde_json::to_value(spec.vm.tiering.policy).unwrap();
        assert_eq!(policy, "tpp");
        let tracking = serde_json::to_value(spec.vm.tiering.tracking).unwrap();
        assert_eq!(tracking, "off");
        assert_eq!(
            spec.vm.emulate_latency.as_deref(),
            Some(vmm_core::emulation::config::DEFAULT_PRESET)
        );
        assert_eq!(spec_of(&a.id).vm.emulate_latency, None);
        assert_eq!(
            spec.profile.quantum_pages,
            svc.host.cfg.division.quantum / 4096
        );
    }
    let bi = svc.info(&b.id);
    assert_eq!(bi.boot_id, svc.host.boot_id);
    assert_eq!((bi.fast.min_bytes, bi.fast.max_bytes), (48 * M, 96 * M));
    assert_eq!(bi.fast.weight, 2.5);
    assert_eq!(bi.vcpus, 2);
    // Admission: the fast pool's mins, the slow pool, the VM limit.
    let e = create(&svc.host, None, &zipf(64, 18, 64)).expect_err("over the fast pool");
    assert_eq!(e.kind, HostErrorKind::Conflict);
    assert!(e.message.contains("fast min 18M does not fit"), "{e:?}");
    let e = create(&svc.host, None, &zipf(1024, 0, 64)).expect_err("over the slow pool");
    assert_eq!(e.kind, HostErrorKind::Conflict);
    assert!(e.message.contains("does not fit the slow pool"), "{e:?}");
    svc.running(None, &zipf(64, 16, 64));
    let e = create(&svc.host, None, &zipf(64, 0, 64)).expect_err("a fourth VM");
    assert_eq!(e.kind, HostErrorKind::Conflict);
    assert!(e.message.contains("3 VMs run"), "{e:?}");
}

#[test]
fn patch_fast_checks_its_bounds_and_the_new_target_reaches_the_worker() {
    let svc = Service::new("fast");
    let a = svc.running(None, &zipf(256, 64, 128));
    let b = svc.running(None, &zipf(128, 64, 128));
    let patch = |id: &str, json: &str| {
        let p: FastRequest = serde_json::from_str(json).expect("a FastRequest");
        svc.host.patch_fast(id, &p)
    };
    let refused = |id: &str, json: &str, kind: HostErrorKind, says: &str| {
        let e = patch(id, json).expect_err(json);
        assert_eq!(e.kind, kind, "{json}: {e:?}");
        assert!(e.message.contains(says), "{json}: {e:?}");
    };
    use HostErrorKind::{Conflict, Invalid, NotFound};
    for (id, json, kind, says) in [
        (a.id.as_str(), r#"{"min":"3M"}"#, Invalid, "min 3M"),
        (&a.id, r#"{"max":"3M"}"#, Invalid, "max 3M"),
        (&a.id, r#"{"min":"130M"}"#, Invalid, "need min <= max"),
        (&a.id, r#"{"max":"258M"}"#, Invalid, "need min <= max"),
        (&a.id, r#"{"weight":0}"#, Invalid, "out of range"),
        // b holds 64M of the 256M pool: a's min may be 192M, not a unit more.
        (
            &a.id,
            r#"{"min":"194M","max":"256M"}"#,
            Conflict,
            "min 194M does not fit",
        ),
        ("nope", r#"{"min":"2M"}"#, NotFound, "no VM 'nope'"),
    ] {
        refused(id, json, kind, says);
    }
    let f = patch(&a.id, r#"{"min":"192M","max":"256M","weight":3}"#).expect("an exact fit");
    assert_eq!(
        (f.min_bytes, f.max_bytes, f.weight),
        (192 * M, 256 * M, 3.0)
    );
    assert_eq!(svc.host.state().fast_reserved(), 256 * M);
    // The min is granted as soon as the other VM's share above its own
    // min has been given back (the stand-in gives it back at once).
    svc.wait_vm(&a.id, "granted its min", |v| v.fast.target_bytes >= 192 * M);
    // A min equal to the max is a fixed share.
    let f = patch(&b.id, r#"{"min":"64M","max":"64M"}"#).expect("min = max");
    assert_eq!((f.min_bytes, f.max_bytes), (64 * M, 64 * M));
    // Unchanged fields stay.
    let f = patch(&a.id, r#"{"weight":2}"#).expect("weight only");
    assert_eq!(
        (f.min_bytes, f.max_bytes, f.weight),
        (192 * M, 256 * M, 2.0)
    );
    // The worker applies the target (its answer, then its statistics).
    let v = svc.wait_vm(&a.id, "resized", |v| {
        v.fast.capacity_bytes == v.fast.target_bytes
            && v.tiers
                .first()
                .is_some_and(|t| t.capacity_bytes == v.fast.target_bytes)
    });
    assert!(v.fast.target_bytes >= 192 * M);
    assert!(v.fast.converged);
    let gain = v.fast.gain.expect("a gain curve of 1000 samples");
    assert_eq!(
        (gain.next_quantum_share, gain.last_quantum_share),
        (0.3, 0.4)
    );
    assert_eq!(
        gain.accesses_per_sec,
        Some(stand_in::accesses_per_sec(&a.id))
    );
    // An ended VM's share cannot change.
    svc.force_delete(&b.id);
    refused(&b.id, r#"{"min":"2M"}"#, Conflict, "is stopped");
}

#[test]
fn patch_host_keeps_the_pools_above_what_the_vms_reserve() {
    let svc = Service::new("pools");
    let v = svc.running(None, &zipf(128, 64, 64));
    let patch = |json: &str| {
        let p: PatchHost = serde_json::from_str(json).expect("a PatchHost");
        svc.host.patch_host(&p)
    };
    let e = patch(r#"{"fast_pool":"65M"}"#).expect_err("unaligned");
    assert_eq!(e.kind, HostErrorKind::Invalid);
    assert!(
        e.message.contains("fast_pool 65M is not a multiple of 2M"),
        "{e:?}"
    );
    assert!(e.fix.contains("66M"), "{e:?}");
    let e = patch(r#"{"slow_pool":"129M"}"#).expect_err("unaligned");
    assert!(e.message.contains("slow_pool 129M"), "{e:?}");
    let e = patch(r#"{"fast_pool":"62M"}"#).expect_err("below the mins");
    assert_eq!(e.kind, HostErrorKind::Conflict);
    assert!(
        e.message.contains("below the 64M the VMs' mins reserve"),
        "{e:?}"
    );
    let e = patch(r#"{"slow_pool":"126M"}"#).expect_err("below the VMs");
    assert_eq!(e.kind, HostErrorKind::Conflict);
    assert!(
        e.message.contains("below the 128M the VMs reserve"),
        "{e:?}"
    );
    let i = patch(r#"{"fast_pool":"64M","slow_pool":"128M"}"#).expect("exactly reserved");
    let (fast, slow) = (&i.pools[0], &i.pools[1]);
    assert_eq!((fast.capacity_bytes, fast.reserved_bytes), (64 * M, 64 * M));
    assert_eq!(
        (slow.capacity_bytes, slow.reserved_bytes, slow.free_bytes),
        (128 * M, 128 * M, 0)
    );
    let i = patch(r#"{"fast_pool":"96M"}"#).expect("grown");
    assert_eq!(i.pools[1].capacity_bytes, 128 * M, "an absent pool stays");
    // Once polled: committed, free and resident as the VM reports them.
    svc.wait_vm(&v.id, "polled", |v| v.ops_per_sec > 0.0);
    let i = svc.host.host_info();
    let fast = &i.pools[0];
    assert_eq!(fast.committed_bytes, 64 * M, "its target is its max");
    assert_eq!(fast.free_bytes, 32 * M);
    assert_eq!(fast.resident_bytes, 64 * M);
    assert_eq!(i.pools[1].resident_bytes, 64 * M, "half the slow tier");
    assert_eq!(i.vms["running"], 1);
    assert_eq!(i.vm_ids, [v.id.as_str()]);
}

#[test]
fn the_division_grants_spare_capacity_to_the_vm_that_gains_more_and_the_worker_applies_it() {
    // Two VMs with the same gain curves, one with ten times the other's
    // host-measured accesses; a pool with no whole quantum (64M) spare
    // until both are measured, then grown by one quantum and a half.
    let svc = Service::with("division", |cfg| {
        cfg.fast_pool = 64 * M;
        // No round but those a change wakes (a create, an event, a PATCH).
        cfg.period = Duration::from_secs(600);
        // Dwells longer than any wait here: a move that waits one never comes.
        (cfg.division.dwell_s, cfg.division.reverse_dwell_s) = (600.0, 600.0);
    });
    let cold = svc.running(Some("cold"), &zipf(256, 16, 256));
    let hot = svc.running(Some("hot-a"), &zipf(256, 16, 256));
    for id in [&cold.id, &hot.id] {
        svc.wait_vm(id, "measured", |v| v.fast.gain.is_some());
    }
    let p: PatchHost = serde_json::from_str(r#"{"fast_pool":"128M"}"#).unwrap();
    svc.host.patch_host(&p).expect("the pool grows");
    let h = svc.wait_vm(&hot.id, "granted a quantum and resized", |v| {
        v.fast.target_bytes == 80 * M
            && v.fast.capacity_bytes == 80 * M
            && v.tiers.first().is_some_and(|t| t.capacity_bytes == 80 * M)
    });
    assert!(h.fast.converged);
    // The rest (32M) is no whole quantum: the other VM keeps its min.
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(svc.info(&cold.id).fast.target_bytes, 16 * M);
    assert_eq!(svc.info(&hot.id).fast.target_bytes, 80 * M);
    let s = svc.host.state();
    assert_eq!(s.counters.optional_bytes, 64 * M, "{:?}", s.counters);
    assert_eq!(s.counters.max_round_optional_bytes, 64 * M);
    assert_eq!((s.counters.moves, s.counters.moved_bytes), (1, 64 * M));
    assert!(s.counters.rounds >= 2);
    drop(s);
    let (events, _) = svc.host.events_since(0);
    let grants: Vec<_> = events.iter().filter(|e| e.kind == "division").collect();
    assert_eq!(grants.len(), 1, "{grants:?}");
    assert_eq!((&grants[0].vm, &grants[0].uuid), (&hot.id, &hot.uuid));
    assert_eq!(grants[0].fast_target_bytes, Some(80 * M));
    assert_eq!(grants[0].previous_target_bytes, Some(16 * M));
    let i = svc.host.host_info();
    assert_eq!(i.rebalance.optional_bytes, 64 * M);
    assert_eq!(i.pools[0].committed_bytes, 96 * M);
    assert_eq!(i.pools[0].free_bytes, 32 * M);
    // Another quantum goes the same way without a dwell (a VM that just
    // grew may grow again; only a reversal waits its dwell out).
    let p: PatchHost = serde_json::from_str(r#"{"fast_pool":"192M"}"#).unwrap();
    svc.host.patch_host(&p).expect("the pool grows");
    svc.wait_vm(&hot.id, "granted a second quantum", |v| {
        v.fast.target_bytes == 144 * M
    });
    assert_eq!(svc.info(&cold.id).fast.target_bytes, 16 * M);
}

#[test]
fn a_workers_refusal_is_the_error_of_its_kind() {
    let svc = Service::new("refusals");
    svc.running(Some("refuse-a"), &zipf(64, 0, 64));
    for (policy, kind) in [
        ("tpp", HostErrorKind::Invalid),
        ("memtis", HostErrorKind::Conflict),
        ("colloid", HostErrorKind::Worker),
        ("mtm", HostErrorKind::NotReady),
    ] {
        let p = vmm_service::types::PutPolicy {
            policy: policy.into(),
        };
        let e = svc.host.put_policy("refuse-a", &p).expect_err(policy);
        assert_eq!(e.kind, kind, "{policy}: {e:?}");
        assert_eq!(
            e.message,
            format!("VM refuse-a: {policy}: refused by the stand-in")
        );
        assert!(
            e.fix.contains("refuse-a") || kind == HostErrorKind::Invalid,
            "{e:?}"
        );
    }
}

#[test]
fn a_planted_log_or_a_worker_that_cannot_start_leaves_no_vm() {
    let (cfg, dir) = stand_in::config("planted");
    let vms = cfg.state_dir.join("vms");
    let svc = Service::start(cfg, dir);
    std::os::unix::fs::symlink("/etc/passwd", vms.join("vm-1.log")).unwrap();
    let e = create(&svc.host, None, &zipf(64, 0, 64)).expect_err("a planted link");
    assert_eq!(e.kind, HostErrorKind::StateDir, "{e:?}");
    assert!(
        e.message.contains("vms/vm-1.log") && e.message.contains("is a symbolic link"),
        "{e:?}"
    );
    assert!(e.fix.contains("remove vms/vm-1.log"), "{e:?}");
    std::fs::create_dir(vms.join("web.log")).unwrap();
    let e = create(&svc.host, Some("web"), &zipf(64, 0, 64)).expect_err("a planted directory");
    assert!(e.message.contains("is a directory"), "{e:?}");
    assert!(svc.host.list().is_empty(), "no VM is left");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while vms.join("web.json").exists() || vms.join("vm-1.json").exists() {
        assert!(std::time::Instant::now() < deadline, "a record is left");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(svc.host.state().fast_reserved(), 0);
    // A worker program that is not there: an internal error, no VM.
    let (mut cfg, dir) = stand_in::config("no-worker");
    cfg.worker_exe = dir.join("missing");
    let svc = Service::start(cfg, dir);
    let e = create(&svc.host, None, &zipf(64, 0, 64)).expect_err("no worker");
    assert_eq!(e.kind, HostErrorKind::Internal, "{e:?}");
    assert!(svc.host.list().is_empty());
}

#[test]
fn a_pool_larger_than_its_node_is_refused() {
    let svc = Service::new("node");
    let p: PatchHost = serde_json::from_str(r#"{"fast_pool":"1048576G"}"#).unwrap();
    let e = svc.host.patch_host(&p).expect_err("larger than the node");
    assert_eq!(e.kind, HostErrorKind::Invalid, "{e:?}");
    assert_eq!(e.fix, "lower the pool");
    assert_eq!(svc.host.host_info().pools[0].capacity_bytes, 256 * M);
}

#[test]
fn the_slow_pool_admits_an_exact_fit_and_a_shrink_not_converged_stays_committed() {
    let svc = Service::with("committed", |cfg| {
        cfg.slow_pool = 192 * M;
    });
    let v = svc.running(Some("sticky-a"), &zipf(128, 64, 64));
    let labelled = r#"{"image":"zipf","args":["rss=16M"],"mem":"64M","labels":{"team":"x"}}"#;
    let b = create(&svc.host, None, labelled).expect("exactly what is left of the slow pool");
    assert_eq!(b.labels.get("team").map(String::as_str), Some("x"));
    let e = create(&svc.host, None, &zipf(2, 0, 2)).expect_err("the slow pool is full");
    assert!(e.message.contains("does not fit the slow pool"), "{e:?}");
    // A shrink the VM does not converge: its use, not its target, is
    // what it holds of the pool.
    let p: FastRequest = serde_json::from_str(r#"{"min":"0M","max":"32M"}"#).unwrap();
    let f = svc.host.patch_fast(&v.id, &p).expect("a lower max");
    assert_eq!(f.target_bytes, 32 * M);
    assert_eq!(f.capacity_bytes, 32 * M, "resized within the request");
    let v = svc.wait_vm(&v.id, "shrinking", |v| {
        v.fast.capacity_bytes == 32 * M && v.fast.used_bytes == 64 * M
    });
    assert!(!v.fast.converged);
    // (The other VM's target does not change while its dwell lasts.)
    let other = svc.info(&b.id).fast.target_bytes;
    let fast = &svc.host.host_info().pools[0];
    assert_eq!(fast.committed_bytes, 64 * M + other, "{fast:?}");
    assert_eq!(fast.free_bytes, 256 * M - 64 * M - other);
}

#[test]
fn a_round_comes_once_a_period_when_nothing_changes() {
    let svc = Service::with("period", |cfg| {
        cfg.period = Duration::from_secs(2);
    });
    svc.polled(None, &zipf(64, 0, 64));
    // Nothing changes for 8 s (the statistics poll each second wakes no
    // round): 4 rounds, one more or less by where the window falls, one
    // less again on a loaded machine (a round waits for the poll under
    // way, at most 2 s), never one a poll (7 or 8).
    let rounds = || svc.host.state().counters.rounds;
    let before = rounds();
    std::thread::sleep(Duration::from_secs(8));
    let idle = rounds() - before;
    assert!(
        (2..=5).contains(&idle),
        "{idle} rounds in 8 s at a 2 s period"
    );
}

#[test]
fn a_resize_is_sent_only_to_a_running_vm_not_at_its_target() {
    let svc = Service::with("resizes", |cfg| {
        cfg.period = Duration::from_millis(200);
    });
    // Its min is its max: its target never moves from what it started with.
    let v = svc.running(None, &zipf(64, 64, 64));
    let s = create(&svc.host, Some("starting-b"), &zipf(128, 0, 128)).expect("admitted");
    let rounds = || svc.host.state().counters.rounds;
    let before = rounds();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while rounds() < before + 5 {
        assert!(std::time::Instant::now() < deadline, "5 rounds in 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(svc.resizes(&v.id), Vec::<u64>::new(), "a VM at its target");
    // The starting VM was granted spare capacity it is not sent yet.
    assert!(svc.info(&s.id).fast.target_bytes > 0);
    assert_eq!(svc.resizes(&s.id), Vec::<u64>::new(), "a VM still starting");
    // (A VM that never starts outlasts a shutdown's grace: killed here.)
    svc.force_delete(&s.id);
}

#[test]
fn a_vm_without_a_measured_access_rate_shares_the_capacity_nobody_values() {
    // Its gain curve is no use without a rate: the spare is spread to it
    // as to a VM never measured, whole quanta up to its max.
    let svc = Service::with("unmeasured", |cfg| {
        cfg.fast_pool = 16 * M;
    });
    let v = svc.polled(Some("unmeasured-a"), &zipf(256, 16, 256));
    let i = svc.info(&v.id);
    assert!(
        i.fast
            .gain
            .as_ref()
            .is_some_and(|g| g.accesses_per_sec.is_none()),
        "{i:?}"
    );
    let p: PatchHost = serde_json::from_str(r#"{"fast_pool":"160M"}"#).unwrap();
    svc.host.patch_host(&p).expect("the pool grows");
    svc.wait_vm(&v.id, "given the spare", |v| v.fast.target_bytes == 144 * M);
}
