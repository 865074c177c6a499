//! What a running `perch run` says of itself from outside: fields of `/proc/<pid>/...` files,
//! and its `--metrics` endpoint. Shared with the benchmarks through `#[path]`.

use std::time::Duration;

/// The number after `name` on `line` (as in `VmHWM:   5120 kB`), when the line has that name.
pub fn kib_field(line: &str, name: &str) -> Option<u64> {
    line.strip_prefix(name)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The field `name` of a `/proc/.../status` text, in KiB.
pub fn status_kib(status: &str, name: &str) -> Option<u64> {
    status.lines().find_map(|line| kib_field(line, name))
}

/// The metrics address `perch run --metrics` names in its stderr `text`.
pub fn metrics_address(text: &str) -> Option<String> {
    let (_, rest) = text.split_once("metrics on http://")?;
    let (address, _) = rest.split_once("/metrics")?;
    Some(address.to_owned())
}

/// The body of `GET /metrics` from `address`, read within ten seconds.
pub fn scrape(address: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: perch\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (_, body) = response.split_once("\r\n\r\n")?;
    Some(body.to_owned())
}

/// The value of the unlabelled metric `name` in a scrape, whole.
pub fn gauge(scrape: &str, name: &str) -> Option<u64> {
    scrape.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse::<f64>()
            .ok()
            .map(|value| value as u64)
    })
}
