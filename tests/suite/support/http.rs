//! HTTP/1.1 as the loopback fakes read it: one request at a time, and `multipart/form-data`.

/// One HTTP/1.1 request as the loopback fakes read it.
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Reads one HTTP/1.1 request (head and `content-length` body) from `socket`, keeping what
/// follows it in `buffer` for the next request on the connection. `None` at end of stream.
pub async fn read_request(
    socket: &mut tokio::net::TcpStream,
    buffer: &mut Vec<u8>,
) -> Option<Request> {
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            break end;
        }
        read_more(socket, buffer).await?;
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_owned();
    let path = request_line.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(name, _)| name == "content-length")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0);
    let body_start = head_end + 4;
    while buffer.len() < body_start + length {
        read_more(socket, buffer).await?;
    }
    let body = buffer[body_start..body_start + length].to_vec();
    buffer.drain(..body_start + length);
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}

/// Reads what `socket` has next onto `buffer`; `None` at end of stream or on an error.
async fn read_more(socket: &mut tokio::net::TcpStream, buffer: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 8192];
    let read = tokio::io::AsyncReadExt::read(socket, &mut chunk)
        .await
        .ok()?;
    if read == 0 {
        return None;
    }
    buffer.extend_from_slice(&chunk[..read]);
    Some(())
}

/// One part of a `multipart/form-data` body.
#[derive(Debug, Clone)]
pub struct FormPart {
    pub name: String,
    pub filename: Option<String>,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

/// Parses a `multipart/form-data` body whose `content-type` header is `content_type`; `None`
/// when it is not one, or is malformed.
pub fn parse_multipart(content_type: &str, body: &[u8]) -> Option<Vec<FormPart>> {
    let (kind, params) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    let boundary = params
        .split(';')
        .filter_map(|param| param.trim().split_once('='))
        .find(|(key, _)| key.eq_ignore_ascii_case("boundary"))
        .map(|(_, value)| value.trim_matches('"').to_owned())?;
    let delimiter = format!("--{boundary}").into_bytes();
    let find = |from: usize| {
        body[from..]
            .windows(delimiter.len())
            .position(|window| window == delimiter.as_slice())
            .map(|at| at + from)
    };
    let mut at = find(0)?;
    let mut parts = Vec::new();
    loop {
        let start = at + delimiter.len();
        if body[start..].starts_with(b"--") {
            return Some(parts);
        }
        let start = start + 2;
        let next = find(start)?;
        let part = &body[start..next.checked_sub(2)?];
        let head_end = part.windows(4).position(|window| window == b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&part[..head_end]).into_owned();
        let mut name = None;
        let mut filename = None;
        let mut content_type = None;
        for line in head.split("\r\n") {
            let Some((header, value)) = line.split_once(':') else {
                continue;
            };
            if header.trim().eq_ignore_ascii_case("content-disposition") {
                for param in value.split(';').skip(1) {
                    let Some((key, value)) = param.trim().split_once('=') else {
                        continue;
                    };
                    let value = value.trim_matches('"').to_owned();
                    match key {
                        "name" => name = Some(value),
                        "filename" => filename = Some(value),
                        _ => {}
                    }
                }
            } else if header.trim().eq_ignore_ascii_case("content-type") {
                content_type = Some(value.trim().to_owned());
            }
        }
        parts.push(FormPart {
            name: name?,
            filename,
            content_type,
            body: part[head_end + 4..].to_vec(),
        });
        at = next;
    }
}

/// A fake's server on a thread of its own with a runtime of its own, so that the fake works
/// from `#[test]` and `#[tokio::test]` alike; dropping it stops the server and joins the thread.
#[derive(Debug)]
pub struct ServerThread {
    /// The server's runtime, for tasks beside it.
    pub runtime: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerThread {
    /// Runs `serve` on `listener` until dropped, on `workers` worker threads (0: the thread's
    /// own).
    pub fn spawn<F, Fut>(listener: std::net::TcpListener, workers: usize, serve: F) -> ServerThread
    where
        F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()>,
    {
        listener.set_nonblocking(true).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (runtime_sender, runtime) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = match workers {
                0 => tokio::runtime::Builder::new_current_thread(),
                _ => {
                    let mut builder = tokio::runtime::Builder::new_multi_thread();
                    builder.worker_threads(workers);
                    builder
                }
            }
            .enable_all()
            .build()
            .unwrap();
            runtime_sender.send(runtime.handle().clone()).unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                tokio::select! {
                    _ = stopped => {}
                    () = serve(listener) => {}
                }
            });
            runtime.shutdown_timeout(std::time::Duration::from_millis(100));
        });
        ServerThread {
            runtime: runtime.recv().unwrap(),
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
