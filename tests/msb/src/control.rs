//! The runtime's `control.sock`: framed "msb.control" (hello/welcome, then requests), which the
//! crate uses here for one thing, the `exec_control` signal route advertised in `core.ready`:
//! `control.exec.signal {version, connection, id, signal}` answered by
//! `control.exec.signal.result`. Modelled on the runtime's `runner/control/server.rs` and
//! `runner/exec_control.rs`. The legacy JSON line protocol (first byte not zero) gets a refusal.

use microsandbox_protocol::codec::{self, RawFrame};
use microsandbox_protocol::control::{
    CONTROL_HANDSHAKE_GENERATION, ControlError, ControlHello, ControlWelcome,
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_SETUP_TIMEOUT,
};
use microsandbox_protocol::exec_control::{
    EXEC_CONTROL_REQUEST, EXEC_CONTROL_RESPONSE, EXEC_CONTROL_VERSION, ExecControlRequest,
    ExecControlResponse,
};
use microsandbox_protocol::wire::Envelope;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

use crate::relay::{Execs, log};

/// The first control generation that carries `control.exec.signal`.
const EXEC_SIGNAL_GENERATION: u8 = 2;

/// Serves `control.sock` until the listener fails: one task per connection.
pub async fn serve_control(listener: UnixListener, execs: Execs) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                log(format_args!("control socket: accept failed: {error}"));
                continue;
            }
        };
        let execs = execs.clone();
        tokio::spawn(async move {
            if let Err(error) = serve_connection(stream, execs).await {
                log(format_args!("control socket: connection ended: {error}"));
            }
        });
    }
}

async fn serve_connection(stream: UnixStream, execs: Execs) -> std::io::Result<()> {
    let (mut reader, mut writer) = stream.into_split();
    let mut first = [0_u8; 1];
    let read = tokio::time::timeout(DEFAULT_SETUP_TIMEOUT, reader.read(&mut first))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no control hello"))??;
    if read == 0 {
        return Ok(());
    }
    if first[0] != 0 {
        // The legacy JSON request line: read it to its end, then refuse it.
        let mut line = Vec::new();
        if first[0] != b'\n' {
            BufReader::new(&mut reader)
                .read_until(b'\n', &mut line)
                .await?;
        }
        writer
            .write_all(b"{\"ok\":false,\"error\":\"the stand-in runtime serves only framed exec signals\",\"error_code\":\"unsupported\"}\n")
            .await?;
        return writer.flush().await;
    }

    let mut opening = (&first[..]).chain(&mut reader);
    let hello = tokio::time::timeout(DEFAULT_SETUP_TIMEOUT, codec::read_raw_frame(&mut opening))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "incomplete control hello"))?
        .map_err(std::io::Error::other)?;
    let welcome = match negotiate(&hello) {
        Ok(welcome) => welcome,
        Err(refusal) => {
            write_reply(
                &mut writer,
                CONTROL_HANDSHAKE_GENERATION,
                0,
                "control.error",
                &refusal,
            )
            .await?;
            return Ok(());
        }
    };
    write_reply(
        &mut writer,
        CONTROL_HANDSHAKE_GENERATION,
        0,
        "control.welcome",
        &welcome,
    )
    .await?;

    let (replies, mut queued) = mpsc::channel::<RawFrame>(welcome.max_in_flight as usize);
    let generation = welcome.generation;
    let requests = async {
        loop {
            let frame = match codec::read_raw_frame(&mut reader).await {
                Ok(frame) => frame,
                Err(microsandbox_protocol::ProtocolError::UnexpectedEof) => return Ok(()),
                Err(error) => return Err(std::io::Error::other(error)),
            };
            let (execs, replies) = (execs.clone(), replies.clone());
            tokio::spawn(async move {
                let reply = answer(&frame, generation, &execs).await;
                if let Some(reply) = reply.and_then(|reply| reply.frame(generation, frame.id)) {
                    let _ = replies.send(reply).await;
                }
            });
        }
    };
    let answers = async {
        while let Some(reply) = queued.recv().await {
            codec::write_raw_frame(&mut writer, &reply)
                .await
                .map_err(std::io::Error::other)?;
        }
        Ok(())
    };
    tokio::select! {
        result = requests => result,
        result = answers => result,
    }
}

fn negotiate(frame: &RawFrame) -> Result<ControlWelcome, ControlError> {
    let refused = || ControlError::rejected("invalid_handshake", "expected control hello");
    let envelope = Envelope::decode(&frame.body).map_err(|_| refused())?;
    if frame.id != 0
        || frame.flags != 0
        || envelope.v != CONTROL_HANDSHAKE_GENERATION
        || envelope.t != "control.hello"
    {
        return Err(refused());
    }
    let hello = envelope
        .payload::<ControlHello>()
        .map_err(|_| ControlError::rejected("invalid_handshake", "invalid control hello"))?;
    ControlWelcome::negotiate(&hello, DEFAULT_MAX_IN_FLIGHT)
}

/// A reply to one framed request.
enum Reply {
    Error(ControlError),
    Signal(ExecControlResponse),
}

impl Reply {
    fn rejected(code: &str, message: &str) -> Self {
        Self::Error(ControlError::rejected(code, message))
    }

    /// The terminal frame answering request `id`.
    fn frame(&self, generation: u8, id: u32) -> Option<RawFrame> {
        let envelope = match self {
            Self::Error(error) => Envelope::new(generation, "control.error", error),
            Self::Signal(response) => Envelope::new(generation, EXEC_CONTROL_RESPONSE, response),
        };
        envelope.and_then(|envelope| envelope.frame(id, 1)).ok()
    }
}

/// The reply to one request, or None for a repeated hello (the runtime closes such a
/// connection; here it is simply not answered).
async fn answer(frame: &RawFrame, generation: u8, execs: &Execs) -> Option<Reply> {
    let Ok(envelope) = Envelope::decode(&frame.body) else {
        return Some(Reply::rejected(
            "invalid_request",
            "undecodable control request",
        ));
    };
    if matches!(envelope.t.as_str(), "control.hello" | "control.welcome") {
        return None;
    }
    if envelope.v != generation || frame.flags != 0 {
        return Some(Reply::rejected(
            "invalid_request",
            "invalid control generation or flags",
        ));
    }
    if envelope.t != EXEC_CONTROL_REQUEST || generation < EXEC_SIGNAL_GENERATION {
        return Some(Reply::rejected(
            "unsupported_operation",
            "the stand-in runtime serves only control.exec.signal",
        ));
    }
    let Ok(request) = envelope.payload::<ExecControlRequest>() else {
        return Some(Reply::rejected(
            "invalid_request",
            "invalid exec control payload",
        ));
    };
    if request.version != EXEC_CONTROL_VERSION {
        return Some(Reply::Signal(ExecControlResponse::error(
            "unsupported_feature",
            "unsupported exec control contract",
        )));
    }
    Some(Reply::Signal(
        match execs
            .signal(request.connection, request.id, request.signal)
            .await
        {
            Ok(()) => ExecControlResponse::delivered(),
            Err(refusal) => ExecControlResponse::error(refusal.code, refusal.message),
        },
    ))
}

async fn write_reply<T: Serialize>(
    writer: &mut (impl tokio::io::AsyncWrite + Unpin),
    generation: u8,
    id: u32,
    t: &str,
    payload: &T,
) -> std::io::Result<()> {
    let frame = Envelope::new(generation, t, payload)
        .and_then(|envelope| envelope.frame(id, 1))
        .map_err(std::io::Error::other)?;
    codec::write_raw_frame(writer, &frame)
        .await
        .map_err(std::io::Error::other)?;
    writer.flush().await
}
