use perch::channel::{BoxFuture, Connector, Delivery, DeliveryError, Receipt};
use std::path::Path;
use std::process::{Command, Output};

/// Runs the real `perch` binary with a clean environment plus `env`.
pub fn perch(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_perch"));
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("perch runs")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A fresh agent directory made by `perch init`.
pub fn new_agent() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let output = perch(&["init", dir.path().to_str().unwrap()], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    dir
}

pub fn write(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Every file under `dir`, relative, sorted; directories end in `/`.
pub fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for item in std::fs::read_dir(dir).unwrap() {
            let path = item.unwrap().path();
            let relative = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if path.is_dir() {
                out.push(format!("{relative}/"));
                walk(root, &path, out);
            } else {
                out.push(relative);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

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
        let mut chunk = [0u8; 8192];
        let read = tokio::io::AsyncReadExt::read(socket, &mut chunk)
            .await
            .ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
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
        let mut chunk = [0u8; 8192];
        let read = tokio::io::AsyncReadExt::read(socket, &mut chunk)
            .await
            .ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
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

/// What the connector tests post most: one message without files.
pub trait PostText {
    /// [`Connector::post`] with no files.
    fn deliver<'a>(
        &'a self,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<Receipt, DeliveryError>>;
}

impl<C: Connector + ?Sized> PostText for C {
    fn deliver<'a>(
        &'a self,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<Receipt, DeliveryError>> {
        self.post(delivery, &[])
    }
}

/// A user message's text as the model sees it without perch's `<origin .../>` header lines:
/// what the people wrote, the messages of a collected turn separated by blank lines.
pub fn without_origins(text: &str) -> String {
    text.split('\n')
        .filter(|line| !(line.starts_with("<origin ") && line.ends_with("/>")))
        .collect::<Vec<_>>()
        .join("\n")
}
