//! How spans travel: retries, refusals, compression, a hung or unreachable endpoint,
//! endpoint and flag parsing, command lines, ids.

use super::*;

fn one_span(sink: &mut OtlpListener, p: &Arc<Process>) {
    let now = crate::clock::monotonic_ns();
    ioctl(
        sink,
        p,
        4243,
        now,
        now + 10,
        "NV_ESC_RM_ALLOC",
        "NV_ERR_INVALID_ARGUMENT",
        true,
        false,
    );
    sink.flush();
}

#[test]
fn retryable_failures_are_retried_with_backoff() {
    let c = Collector::start();
    c.statuses.lock().unwrap().extend([503, 429]);
    let root = fake_proc();
    let mut sink = OtlpListener::start(config(&c, root.path())).unwrap();
    let stats = sink.stats();
    let p = proc_info(root.path());
    let start = Instant::now();
    one_span(&mut sink, &p);
    c.wait("the span after two refusals", |s| s.len() == 1);
    // 0.5 s then 1 s of backoff.
    assert!(
        start.elapsed() >= Duration::from_millis(1400),
        "{:?}",
        start.elapsed()
    );
    // The receiver keeps the request before it answers; the exporter counts the span once
    // it has read the answer.
    let end = Instant::now() + Duration::from_secs(5);
    while stats.spans_exported.load(Ordering::Relaxed) == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(stats.export_failures.load(Ordering::Relaxed), 2);
    assert_eq!(stats.spans_exported.load(Ordering::Relaxed), 1);
    assert_eq!(stats.spans_dropped.load(Ordering::Relaxed), 0);
}

#[test]
fn refused_batches_are_dropped_and_counted() {
    let c = Collector::start();
    c.statuses.lock().unwrap().push_back(400);
    let root = fake_proc();
    let mut sink = OtlpListener::start(config(&c, root.path())).unwrap();
    let stats = sink.stats();
    let p = proc_info(root.path());
    one_span(&mut sink, &p);
    let end = Instant::now() + Duration::from_secs(5);
    while stats.spans_dropped.load(Ordering::Relaxed) == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(stats.spans_dropped.load(Ordering::Relaxed), 1);
    // The next one goes through.
    one_span(&mut sink, &p);
    c.wait("next span", |s| s.len() == 1);
}

#[test]
fn gzip_bodies() {
    let c = Collector::start();
    let root = fake_proc();
    let mut cfg = config(&c, root.path());
    cfg.compression = Compression::Gzip;
    cfg.headers = vec![("X-Scope-OrgID".into(), "tenant-1".into())];
    let mut sink = OtlpListener::start(cfg).unwrap();
    one_span(&mut sink, &proc_info(root.path()));
    c.wait("gzip span", |s| s.len() == 1);
    assert_eq!(c.encodings.lock().unwrap()[0], "gzip");
}

#[test]
fn the_agent_loop_never_waits_on_a_hung_endpoint() {
    // Accepts connections and never answers.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming() {
            held.push(s);
        }
    });
    let root = fake_proc();
    let mut cfg = OtlpConfig::new(format!("http://127.0.0.1:{port}"));
    cfg.proc_root = root.path().to_path_buf();
    cfg.queue_capacity = 64;
    cfg.timeout = Duration::from_secs(3);
    cfg.shutdown_timeout = Duration::from_millis(200);
    let mut sink = OtlpListener::start(cfg).unwrap();
    let stats = sink.stats();
    let p = proc_info(root.path());
    let n = 20_000u64;
    let start = Instant::now();
    let mut worst = Duration::ZERO;
    for i in 0..n {
        let t = Instant::now();
        ioctl(
            &mut sink,
            &p,
            4243,
            i,
            i + 1,
            "NV_ESC_RM_CONTROL",
            "NV_ERR_TIMEOUT",
            true,
            false,
        );
        if i % 100 == 0 {
            sink.flush();
        }
        worst = worst.max(t.elapsed());
    }
    let total = start.elapsed();
    eprintln!("{n} events: {total:?}, worst {worst:?}");
    assert!(total < Duration::from_secs(2), "{total:?}");
    assert!(worst < Duration::from_millis(50), "{worst:?}");
    assert!(stats.events_dropped.load(Ordering::Relaxed) > 0);
    let t = Instant::now();
    drop(sink);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

#[test]
fn an_unreachable_endpoint_is_not_an_error_at_start() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let root = fake_proc();
    let mut cfg = OtlpConfig::new(format!("http://127.0.0.1:{port}"));
    cfg.shutdown_timeout = Duration::from_millis(300);
    let mut sink = OtlpListener::start(cfg).unwrap();
    let stats = sink.stats();
    one_span(&mut sink, &proc_info(root.path()));
    let end = Instant::now() + Duration::from_secs(5);
    while stats.export_failures.load(Ordering::Relaxed) == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(stats.export_failures.load(Ordering::Relaxed) >= 1);
    drop(sink);
    assert_eq!(stats.spans_dropped.load(Ordering::Relaxed), 1);
}

#[test]
fn endpoints() {
    let p = |s: &str| Endpoint::parse(s).unwrap();
    assert_eq!(p("http://collector:4318").path, "/v1/traces");
    assert_eq!(p("http://collector:4318/").path, "/v1/traces");
    assert_eq!(p("http://collector:4318").port, 4318);
    assert_eq!(p("http://gw/otlp").path, "/otlp/v1/traces");
    assert_eq!(p("http://gw/otlp").port, 80);
    assert_eq!(p("http://gw:1/v1/traces").path, "/v1/traces");
    let v6 = p("http://[::1]:4318");
    assert_eq!(
        (v6.host.as_str(), v6.authority.as_str()),
        ("::1", "[::1]:4318")
    );
    assert!(Endpoint::parse("https://collector:4318").is_err());
    assert!(Endpoint::parse("collector:4318").is_err());
    assert!(Endpoint::parse("http://u:p@collector:4318").is_err());
    let mut cfg = OtlpConfig::new("http://h:1");
    cfg.headers = vec![("bad header".into(), "v".into())];
    assert!(OtlpListener::start(cfg).is_err());
}

#[test]
fn flag_parsers() {
    assert_eq!(Compression::parse("gzip"), Ok(Compression::Gzip));
    assert_eq!(Compression::parse("none"), Ok(Compression::None));
    assert!(Compression::parse("zstd").is_err());
    assert_eq!(
        parse_header("X-Scope-OrgID=team-a"),
        Ok(("X-Scope-OrgID".to_string(), "team-a".to_string()))
    );
    assert_eq!(
        parse_header("Authorization=Basic a=="),
        Ok(("Authorization".to_string(), "Basic a==".to_string()))
    );
    assert!(parse_header("novalue").is_err());
    assert!(parse_header("bad name=x").is_err());
}

#[test]
fn command_lines_are_redacted_and_bounded() {
    let a = |s: &str| -> Vec<String> { s.split(' ').map(str::to_string).collect() };
    assert_eq!(
        command_line(
            &a("vllm serve m --api-key sk-1 --hf-token=hf_x --tokenizer t"),
            1024
        ),
        "vllm serve m --api-key [REDACTED] --hf-token=[REDACTED] --tokenizer t"
    );
    assert_eq!(
        command_line(&a("x --max-num-batched-tokens 8192 --password p"), 1024),
        "x --max-num-batched-tokens 8192 --password [REDACTED]"
    );
    assert_eq!(
        command_line(&a("x --db postgres://user:pw@db:5432/x"), 1024),
        "x --db postgres://[REDACTED]@db:5432/x"
    );
    let long = command_line(&a(&"é".repeat(2000)), 1024);
    assert!(long.len() <= 1024 && long.ends_with("..."));
}

#[test]
fn ids_are_random_and_nonzero() {
    let mut a = Ids::new();
    let mut b = Ids::new();
    let (x, y) = (a.trace_id(), b.trace_id());
    assert_ne!(x, y);
    assert_ne!(x, [0; 16]);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..10_000 {
        assert!(seen.insert(a.span_id()));
    }
}
