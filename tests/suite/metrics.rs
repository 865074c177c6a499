//! The metrics' text format and routes, and the two log formats (end to end in `lifecycle`).

use perch::host::logging::{self, LogFormat};
use perch::host::metrics::{DeliveryOutcome, MAX_CONNECTIONS, Metrics, Route, route, serve};
use perch_core::heartbeat::SlotOutcome;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[test]
fn metrics_render_in_prometheus_text_format() {
    let metrics = Metrics::default();
    metrics.event_in("tg");
    metrics.event_in("tg");
    metrics.event_in("team \"a\"\\b\n");
    metrics.delivered("tg", DeliveryOutcome::Receipt);
    metrics.delivered("tg", DeliveryOutcome::Dropped);
    metrics.settled("tg", DeliveryOutcome::Unknown);
    metrics.run_finished(Duration::from_millis(750));
    metrics.run_finished(Duration::from_secs(2));
    metrics.run_finished(Duration::from_secs(900));
    metrics.tool_call("bash");
    metrics.tool_call("bash");
    metrics.tool_call("read");
    metrics.tokens(120, 30);
    metrics.tokens(5, 1);
    metrics.heartbeat_outcome("standup", &SlotOutcome::Silent);
    metrics.heartbeat_outcome(
        "standup",
        &SlotOutcome::Failed {
            reason: "no".into(),
        },
    );
    metrics.set_inbox_depth(3);
    metrics.set_vm_boots(2);
    metrics.lane_open_failed();
    metrics.set_lanes_open(5);
    metrics.set_lanes_open(2);
    metrics.set_conversations_active(1);
    let expected = r#"# HELP perch_events_in_total Chat events taken into the inbox, per channel.
# TYPE perch_events_in_total counter
perch_events_in_total{channel="team \"a\"\\b\n"} 1
perch_events_in_total{channel="tg"} 2
# HELP perch_events_out_total Deliveries sent through the outbox, per channel, whatever their outcome.
# TYPE perch_events_out_total counter
perch_events_out_total{channel="tg"} 2
# HELP perch_deliveries_total Deliveries settled, per channel and outcome (receipt, dropped, unknown).
# TYPE perch_deliveries_total counter
perch_deliveries_total{channel="tg",outcome="dropped"} 1
perch_deliveries_total{channel="tg",outcome="receipt"} 1
perch_deliveries_total{channel="tg",outcome="unknown"} 1
# HELP perch_run_duration_seconds How long lane runs took, from the request to the outcome.
# TYPE perch_run_duration_seconds histogram
perch_run_duration_seconds_bucket{le="0.5"} 0
perch_run_duration_seconds_bucket{le="1"} 1
perch_run_duration_seconds_bucket{le="2.5"} 2
perch_run_duration_seconds_bucket{le="5"} 2
perch_run_duration_seconds_bucket{le="10"} 2
perch_run_duration_seconds_bucket{le="30"} 2
perch_run_duration_seconds_bucket{le="60"} 2
perch_run_duration_seconds_bucket{le="120"} 2
perch_run_duration_seconds_bucket{le="300"} 2
perch_run_duration_seconds_bucket{le="600"} 2
perch_run_duration_seconds_bucket{le="+Inf"} 3
perch_run_duration_seconds_sum 902.75
perch_run_duration_seconds_count 3
# HELP perch_tool_calls_total Tool calls made by runs, per tool.
# TYPE perch_tool_calls_total counter
perch_tool_calls_total{tool="bash"} 2
perch_tool_calls_total{tool="read"} 1
# HELP perch_model_tokens_total Model tokens, per direction (input includes cached input).
# TYPE perch_model_tokens_total counter
perch_model_tokens_total{direction="input"} 125
perch_model_tokens_total{direction="output"} 31
# HELP perch_heartbeat_outcomes_total Heartbeat runs, per task and outcome.
# TYPE perch_heartbeat_outcomes_total counter
perch_heartbeat_outcomes_total{task="standup",outcome="failed"} 1
perch_heartbeat_outcomes_total{task="standup",outcome="silent"} 1
# HELP perch_inbox_depth Inbox items waiting.
# TYPE perch_inbox_depth gauge
perch_inbox_depth 3
# HELP perch_vm_boots_total Times the sandbox machine was booted (resumed or created).
# TYPE perch_vm_boots_total counter
perch_vm_boots_total 2
# HELP perch_lane_open_failures_total Times a lane could not be opened; its items waited and it was tried again.
# TYPE perch_lane_open_failures_total counter
perch_lane_open_failures_total 1
# HELP perch_lanes_open Lanes open now (capped; idle ones close).
# TYPE perch_lanes_open gauge
perch_lanes_open 2
# HELP perch_lanes_open_peak The most lanes open at once since start.
# TYPE perch_lanes_open_peak gauge
perch_lanes_open_peak 5
# HELP perch_conversations_active Conversations with a task now.
# TYPE perch_conversations_active gauge
perch_conversations_active 1
"#;
    let rendered = metrics.render();
    // The allocator's figure comes last and is whatever the process holds now.
    let (counted, heap) = rendered
        .split_once("# HELP perch_heap_allocated_bytes ")
        .unwrap();
    pretty_diff(counted, expected);
    let allocated: u64 = heap
        .lines()
        .find_map(|line| line.strip_prefix("perch_heap_allocated_bytes "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(allocated > 0, "{heap}");
}

#[test]
fn metrics_with_nothing_counted_still_declare_every_metric() {
    let text = Metrics::default().render();
    for name in [
        "perch_events_in_total",
        "perch_events_out_total",
        "perch_deliveries_total",
        "perch_run_duration_seconds",
        "perch_tool_calls_total",
        "perch_model_tokens_total",
        "perch_heartbeat_outcomes_total",
        "perch_inbox_depth",
        "perch_vm_boots_total",
        "perch_lanes_open",
        "perch_lanes_open_peak",
        "perch_conversations_active",
        "perch_heap_allocated_bytes",
    ] {
        assert!(text.contains(&format!("# HELP {name} ")), "{name}");
        assert!(text.contains(&format!("# TYPE {name} ")), "{name}");
    }
    assert!(text.contains("perch_run_duration_seconds_count 0\n"));
    assert!(text.contains("perch_model_tokens_total{direction=\"input\"} 0\n"));
}

#[test]
fn only_get_metrics_is_served() {
    for (head, expected) in [
        ("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", Route::Metrics),
        ("GET /metrics?name[]=x HTTP/1.1\r\n\r\n", Route::Metrics),
        ("GET / HTTP/1.1\r\n\r\n", Route::NotFound),
        ("GET /metrics/x HTTP/1.1\r\n\r\n", Route::NotFound),
        ("POST /metrics HTTP/1.1\r\n\r\n", Route::MethodNotAllowed),
        ("", Route::NotFound),
        ("garbage", Route::NotFound),
    ] {
        assert_eq!(route(head), expected, "{head:?}");
    }
}

/// Idle local connections, far more than there are slots, opened before a scrape: the scrape is
/// answered, and the oldest idle connection was closed to make room.
#[test]
fn fifty_idle_local_connections_do_not_keep_a_scrape_out() {
    use std::io::{Read, Write};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let address = listener.local_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    runtime.spawn(serve(listener, shutdown.clone(), || async {
        "perch_up 1\n".to_owned()
    }));
    let idle: Vec<std::net::TcpStream> = (0..50)
        .map(|_| std::net::TcpStream::connect(address).unwrap())
        .collect();
    assert!(idle.len() > 3 * MAX_CONNECTIONS);

    let mut scrape = std::net::TcpStream::connect(address).unwrap();
    scrape
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(scrape, "GET /metrics HTTP/1.1\r\nHost: {address}\r\n\r\n").unwrap();
    let mut response = String::new();
    scrape.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response:?}");
    assert!(response.ends_with("\r\n\r\nperch_up 1\n"), "{response:?}");

    let mut oldest = &idle[0];
    oldest
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(
        oldest.read(&mut byte).unwrap(),
        0,
        "the oldest idle connection was closed unanswered"
    );
    shutdown.cancel();
}

/// Runs `emit` under a subscriber writing `format` into a buffer; the lines written.
fn logged(format: LogFormat, emit: impl FnOnce()) -> Vec<String> {
    let written = Arc::new(Mutex::new(String::new()));
    let sink: logging::Sink = {
        let written = Arc::clone(&written);
        Arc::new(move |line: &str| written.lock().unwrap().push_str(line))
    };
    tracing::subscriber::with_default(logging::subscriber(format, sink), emit);
    let text = written.lock().unwrap().clone();
    assert!(text.is_empty() || text.ends_with('\n'), "{text:?}");
    text.lines().map(str::to_owned).collect()
}

fn emit_three() {
    tracing::info!(target: "perch::service", channel = "tg", lane = "tg-42", "lane tg-42: run completed");
    tracing::warn!(target: "perch::service", channel = "tg", "channel tg: reset by \"peer\"\nretrying; reconnecting");
    tracing::debug!(target: "perch::service", "below info: not written");
    tracing::warn!(target: "hyper::client", "a library's event: not written");
    tracing::error!(target: "perch_core::x", task = "standup", count = 3_u64, ok = false, "failed");
}

#[test]
fn human_log_lines_read_as_before_with_their_fields() {
    assert_eq!(
        logged(LogFormat::Human, emit_three),
        [
            "perch: lane tg-42: run completed channel=tg lane=tg-42",
            "perch: warning: channel tg: reset by \"peer\"",
            "retrying; reconnecting channel=tg",
            "perch: error: failed task=standup count=3 ok=false",
        ]
    );
}

#[test]
fn json_log_lines_are_one_object_each() {
    let lines = logged(LogFormat::Json, emit_three);
    assert_eq!(lines.len(), 3, "{lines:#?}");
    let parsed: Vec<serde_json::Value> = lines
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    for line in &parsed {
        let timestamp = line["timestamp"].as_str().unwrap();
        assert!(
            chrono::DateTime::parse_from_rfc3339(timestamp).is_ok(),
            "{timestamp}"
        );
    }
    let without_time: Vec<serde_json::Value> = parsed
        .into_iter()
        .map(|mut line| {
            line.as_object_mut().unwrap().remove("timestamp");
            line
        })
        .collect();
    assert_eq!(
        without_time,
        [
            serde_json::json!({"level": "INFO", "target": "perch::service",
                "message": "lane tg-42: run completed",
                "fields": {"channel": "tg", "lane": "tg-42"}}),
            serde_json::json!({"level": "WARN", "target": "perch::service",
                "message": "channel tg: reset by \"peer\"\nretrying; reconnecting",
                "fields": {"channel": "tg"}}),
            serde_json::json!({"level": "ERROR", "target": "perch_core::x",
                "message": "failed",
                "fields": {"task": "standup", "count": 3, "ok": false}}),
        ]
    );
}

#[track_caller]
fn pretty_diff(actual: &str, expected: &str) {
    if actual != expected {
        for (line, (a, e)) in actual.lines().zip(expected.lines()).enumerate() {
            assert_eq!(a, e, "line {}", line + 1);
        }
        assert_eq!(actual, expected);
    }
}
