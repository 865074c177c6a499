//! A loopback HTTP/1.1 proxy in front of a test server that notes every request it passes on
//! (method and path), so a test can count what a client asked for: requests are read one at a
//! time (headers, then a `Content-Length` body) and forwarded unchanged; responses are copied
//! back as they come.

use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The proxy: its URL, and the requests it has passed on.
#[derive(Debug)]
pub struct CountingProxy {
    pub url: String,
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CountingProxy {
    /// A proxy on a free loopback port in front of `upstream` (`http://host:port`).
    pub async fn start(upstream: &str) -> CountingProxy {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let seen = Arc::clone(&seen);
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        return;
                    };
                    let upstream = upstream.clone();
                    let seen = Arc::clone(&seen);
                    tokio::spawn(async move {
                        if let Ok(server) = TcpStream::connect(&upstream).await {
                            relay(client, server, seen).await;
                        }
                    });
                }
            }
        });
        CountingProxy { url, seen, task }
    }

    /// Every request passed on so far, as `METHOD /path?query`, in order.
    pub fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    /// The requests passed on so far whose line contains every one of `parts`.
    pub fn matching(&self, parts: &[&str]) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter(|request| parts.iter().all(|part| request.contains(part)))
            .collect()
    }
}

async fn relay(client: TcpStream, server: TcpStream, seen: Arc<Mutex<Vec<String>>>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let back = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    });
    let mut buffer = Vec::new();
    let mut chunk = [0_u8; 16 * 1024];
    'requests: loop {
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
                break at + 4;
            }
            match client_read.read(&mut chunk).await {
                Ok(0) | Err(_) => break 'requests,
                Ok(read) => buffer.extend_from_slice(&chunk[..read]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default();
        let mut parts = request_line.split(' ');
        let (method, target) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        seen.lock().unwrap().push(format!("{method} {target}"));
        let mut length = 0_usize;
        for line in lines {
            if let Some((name, value)) = line.split_once(':') {
                let name = name.trim().to_ascii_lowercase();
                if name == "transfer-encoding" {
                    seen.lock()
                        .unwrap()
                        .push("UNREADABLE: a chunked request; the proxy stops here".to_owned());
                    break 'requests;
                }
                if name == "content-length" {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        while buffer.len() < head_end + length {
            match client_read.read(&mut chunk).await {
                Ok(0) | Err(_) => break 'requests,
                Ok(read) => buffer.extend_from_slice(&chunk[..read]),
            }
        }
        let request: Vec<u8> = buffer.drain(..head_end + length).collect();
        if server_write.write_all(&request).await.is_err() {
            break;
        }
    }
    let _ = server_write.shutdown().await;
    let _ = back.await;
}
