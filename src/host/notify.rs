//! systemd's notify protocol (`sd_notify`), spoken directly: one datagram of `KEY=value` lines to
//! the Unix socket named by `NOTIFY_SOCKET`, a path or, with a leading `@`, an abstract name.
//! Without `NOTIFY_SOCKET` every call does nothing, so `perch run` outside systemd is unchanged.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::time::Duration;

/// Where notifications go, if anywhere, and how often the service manager wants to hear that the
/// service is alive.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, Target)>,
    watchdog: Option<Duration>,
}

/// The socket named by `NOTIFY_SOCKET`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Path(PathBuf),
    Abstract(Vec<u8>),
}

/// What the notify variables ask for, read from the environment but not yet acted on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyEnv {
    pub target: Option<Target>,
    pub watchdog: Option<Duration>,
}

/// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` through `lookup`. The watchdog
/// applies only when `WATCHDOG_PID` is unset or is `pid`; a value systemd would not send is an
/// error naming the variable.
pub fn read_env(lookup: impl Fn(&str) -> Option<String>, pid: u32) -> Result<NotifyEnv, String> {
    let target = match lookup("NOTIFY_SOCKET").filter(|value| !value.is_empty()) {
        None => None,
        Some(value) => Some(match value.strip_prefix('@') {
            Some(name) => Target::Abstract(name.as_bytes().to_vec()),
            None if value.starts_with('/') => Target::Path(PathBuf::from(value)),
            None => {
                return Err(format!(
                    "NOTIFY_SOCKET={value}: not an absolute path or an @abstract name"
                ));
            }
        }),
    };
    let for_us = match lookup("WATCHDOG_PID") {
        None => true,
        Some(value) => value.trim().parse::<u32>().ok() == Some(pid),
    };
    let watchdog = match lookup("WATCHDOG_USEC") {
        Some(value) if for_us => {
            let usec: u64 = value
                .trim()
                .parse()
                .map_err(|_| format!("WATCHDOG_USEC={value}: not a number of microseconds"))?;
            Some(Duration::from_micros(usec)).filter(|interval| !interval.is_zero())
        }
        _ => None,
    };
    let watchdog = watchdog.filter(|_| target.is_some());
    Ok(NotifyEnv { target, watchdog })
}

impl Notifier {
    /// A notifier that never sends anything.
    pub fn disabled() -> Notifier {
        Notifier {
            target: None,
            watchdog: None,
        }
    }

    /// A notifier for what [`read_env`] found; opens the (unbound) socket it sends from.
    pub fn open(env: NotifyEnv) -> Result<Notifier, String> {
        let Some(target) = env.target else {
            return Ok(Notifier::disabled());
        };
        let socket = UnixDatagram::unbound()
            .and_then(|socket| socket.set_nonblocking(true).map(|()| socket))
            .map_err(|error| format!("cannot open a socket to notify systemd: {error}"))?;
        Ok(Notifier {
            target: Some((socket, target)),
            watchdog: env.watchdog,
        })
    }

    /// Reads the environment of this process and opens the notifier it describes.
    pub fn from_env() -> Result<Notifier, String> {
        Notifier::open(read_env(
            |name| std::env::var(name).ok(),
            std::process::id(),
        )?)
    }

    /// The watchdog interval: `WATCHDOG=1` must arrive more often than this.
    pub fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Sends one notification: `KEY=value` lines, such as `READY=1\nSTATUS=...`.
    pub fn notify(&self, state: &str) -> std::io::Result<()> {
        let Some((socket, target)) = &self.target else {
            return Ok(());
        };
        match target {
            Target::Path(path) => socket.send_to(state.as_bytes(), path)?,
            Target::Abstract(name) => {
                let address = SocketAddr::from_abstract_name(name)?;
                socket.send_to_addr(state.as_bytes(), &address)?
            }
        };
        Ok(())
    }
}

/// A `STATUS=` value on one line.
pub fn status_line(status: &str) -> String {
    format!("STATUS={}", status.replace('\n', " "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)], pid: u32) -> Result<NotifyEnv, String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        read_env(
            |name| {
                pairs
                    .iter()
                    .find(|(key, _)| key == name)
                    .map(|(_, value)| value.clone())
            },
            pid,
        )
    }

    #[test]
    fn the_variables_are_read_as_systemd_sets_them() {
        let found = |target: Option<Target>, watchdog: Option<Duration>| {
            Some(NotifyEnv { target, watchdog })
        };
        let path = |path: &str| Some(Target::Path(path.into()));
        let cases = [
            (vec![], found(None, None)),
            (vec![("WATCHDOG_USEC", "1000000")], found(None, None)),
            (
                vec![("NOTIFY_SOCKET", "/run/systemd/notify")],
                found(path("/run/systemd/notify"), None),
            ),
            (
                vec![
                    ("NOTIFY_SOCKET", "@/org/freedesktop/systemd1/notify/1"),
                    ("WATCHDOG_USEC", "60000000"),
                ],
                found(
                    Some(Target::Abstract(
                        b"/org/freedesktop/systemd1/notify/1".to_vec(),
                    )),
                    Some(Duration::from_secs(60)),
                ),
            ),
            (
                vec![
                    ("NOTIFY_SOCKET", "/n"),
                    ("WATCHDOG_USEC", "400000"),
                    ("WATCHDOG_PID", "7"),
                ],
                found(path("/n"), Some(Duration::from_millis(400))),
            ),
            (
                vec![
                    ("NOTIFY_SOCKET", "/n"),
                    ("WATCHDOG_USEC", "400000"),
                    ("WATCHDOG_PID", "8"),
                ],
                found(path("/n"), None),
            ),
            (
                vec![("NOTIFY_SOCKET", "/n"), ("WATCHDOG_USEC", "0")],
                found(path("/n"), None),
            ),
            (
                vec![("NOTIFY_SOCKET", "/n"), ("WATCHDOG_USEC", "soon")],
                None,
            ),
            (vec![("NOTIFY_SOCKET", "vsock:2:99")], None),
        ];
        for (pairs, expected) in cases {
            assert_eq!(env(&pairs, 7).ok(), expected, "{pairs:?}");
        }
    }

    #[test]
    fn a_notification_arrives_as_one_datagram_and_none_without_a_socket() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("notify");
        let receiver = UnixDatagram::bind(&path).expect("the socket binds");
        let notifier = Notifier::open(NotifyEnv {
            target: Some(Target::Path(path)),
            watchdog: None,
        })
        .expect("the notifier opens");
        notifier
            .notify("READY=1\nSTATUS=ok")
            .expect("the datagram is sent");
        let mut buffer = [0; 64];
        let length = receiver.recv(&mut buffer).expect("the datagram arrives");
        assert_eq!(&buffer[..length], b"READY=1\nSTATUS=ok");
        assert!(Notifier::disabled().notify("READY=1").is_ok());
    }

    #[test]
    fn an_abstract_name_is_reached() {
        let name = format!("perch-notify-test-{}", std::process::id());
        let address = SocketAddr::from_abstract_name(name.as_bytes()).expect("a valid name");
        let receiver = UnixDatagram::bind_addr(&address).expect("the socket binds");
        let notifier = Notifier::open(NotifyEnv {
            target: Some(Target::Abstract(name.into_bytes())),
            watchdog: None,
        })
        .expect("the notifier opens");
        notifier.notify("WATCHDOG=1").expect("the datagram is sent");
        let mut buffer = [0; 16];
        let length = receiver.recv(&mut buffer).expect("the datagram arrives");
        assert_eq!(&buffer[..length], b"WATCHDOG=1");
    }
}
