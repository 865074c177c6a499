//! The client and its session: opening the stores, restoring the saved session or logging in
//! once, the errors the homeserver's refusals become (redacted), and `perch doctor --online`'s
//! check, which opens neither.

use super::{
    MatrixConnector, SetupError, Shared, UndecryptableReport, disconnected, read_undecryptable,
};
use crate::channel::{CheckError, Checked, ConnectorError};
use matrix_sdk::Client;
use matrix_sdk::authentication::matrix::MatrixSession;
use matrix_sdk::config::RequestConfig;
use matrix_sdk::ruma::api::error::ErrorKind;
use matrix_sdk::ruma::{OwnedUserId, UserId};
use matrix_sdk::store::RoomLoadSettings;
use perch_core::error_chain::on_one_line;
use perch_core::redact::{REDACTED, redact_value};
use perch_core::secret::Secret;
use serde::Serialize;
use std::fmt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::{OnceCell, watch};

const SESSION_FILE: &str = "session.json";
const STORE_FILE_PREFIX: &str = "matrix-sdk-";
const DEVICE_NAME: &str = "perch";
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const REQUEST_RETRIES: usize = 2;

/// The longest error text passed on, in characters.
pub(super) const MESSAGE_LIMIT: usize = 400;

impl MatrixConnector {
    /// A connector for `user` (such as `@perch:example.org`) on `homeserver` (such as
    /// `https://matrix.example.org`), keeping its session and stores in `store_dir`
    /// (`.perch/matrix/<channel>`, see [`AgentDir::matrix_store_dir`](crate::agent::AgentDir::matrix_store_dir)). It joins rooms only when invited by one of
    /// `allowed_inviters` (Matrix user ids). Nothing is sent until the first call.
    pub fn new(
        homeserver: &str,
        user: &str,
        password: Secret,
        store_passphrase: Secret,
        store_dir: PathBuf,
        allowed_inviters: Vec<String>,
    ) -> Result<MatrixConnector, SetupError> {
        let homeserver = homeserver.trim().trim_end_matches('/').to_owned();
        let url = url::Url::parse(&homeserver).map_err(|error| SetupError {
            message: format!("the Matrix homeserver {homeserver:?} is not a URL: {error}"),
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
            return Err(SetupError {
                message: format!(
                    "the Matrix homeserver {homeserver:?} must be an http:// or https:// URL"
                ),
            });
        }
        let user = parse_user(user).map_err(|message| SetupError { message })?;
        let allowed_inviters = allowed_inviters
            .iter()
            .map(|inviter| {
                parse_user(inviter).map_err(|message| SetupError {
                    message: format!("allow.users: {message}"),
                })
            })
            .collect::<Result<_, _>>()?;
        let report = read_undecryptable(&store_dir);
        Ok(MatrixConnector {
            homeserver,
            user,
            password,
            store_passphrase,
            store_dir,
            allowed_inviters,
            client: OnceCell::new(),
            state: Mutex::new(Shared {
                report,
                ..Shared::default()
            }),
            synced: watch::channel(false).0,
        })
    }

    /// The device this connector uses: the saved one, or a new one from a first login.
    pub async fn device_id(&self) -> Result<String, ConnectorError> {
        let client = self.client().await?;
        client
            .device_id()
            .map(ToString::to_string)
            .ok_or_else(|| disconnected("the Matrix client has no device after logging in"))
    }

    /// Resolves once the running `receive` has finished its first sync and back-fill: from then
    /// on every new message is handed on.
    pub async fn ready(&self) {
        let mut synced = self.synced.subscribe();
        let _ = synced.wait_for(|synced| *synced).await;
    }

    /// The undecryptable events met so far, for `perch status`.
    pub fn undecryptable(&self) -> UndecryptableReport {
        self.shared().report.clone()
    }

    pub(super) fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) async fn client(&self) -> Result<&Client, ConnectorError> {
        self.client.get_or_try_init(|| self.open()).await
    }

    async fn open(&self) -> Result<Client, ConnectorError> {
        let store = self.store_dir.clone();
        let saved = tokio::task::spawn_blocking(move || prepare_store(&store))
            .await
            .map_err(|error| disconnected(&format!("preparing the Matrix store failed: {error}")))?
            .map_err(|message| ConnectorError::Unauthorized { message })?;
        if let Some(session) = &saved
            && session.meta.user_id != self.user
        {
            return Err(ConnectorError::Unauthorized {
                message: format!(
                    "the session saved in {} is for {}, but the channel names {}; remove that \
                     directory to log in as {} with a new device",
                    self.store_dir.display(),
                    session.meta.user_id,
                    self.user,
                    self.user
                ),
            });
        }
        let mut builder = Client::builder();
        if plain_http(&self.homeserver) {
            builder = builder.disable_built_in_root_certificates();
        }
        let client = builder
            .homeserver_url(&self.homeserver)
            .sqlite_store_with_config_and_cache_path(
                store_config(&self.store_dir, self.store_passphrase.expose()),
                None::<&Path>,
            )
            .request_config(
                RequestConfig::new()
                    .retry_limit(REQUEST_RETRIES)
                    .timeout(REQUEST_TIMEOUT),
            )
            .build()
            .await
            .map_err(|error| ConnectorError::Unauthorized {
                message: self.redact(&format!(
                    "cannot open the Matrix store in {} (a different store_passphrase than the \
                     one it was created with?): {error}",
                    self.store_dir.display()
                )),
            })?;
        match saved {
            Some(session) => client
                .matrix_auth()
                .restore_session(session, RoomLoadSettings::default())
                .await
                .map_err(|error| {
                    disconnected(
                        &self.redact(&format!("cannot restore the saved Matrix session: {error}")),
                    )
                })?,
            None => {
                client
                    .matrix_auth()
                    .login_username(self.user.as_str(), self.password.expose())
                    .initial_device_display_name(DEVICE_NAME)
                    .send()
                    .await
                    .map_err(|error| self.login_error(&error))?;
                let session = client
                    .matrix_auth()
                    .session()
                    .ok_or_else(|| disconnected("the Matrix login returned no session"))?;
                let path = self.store_dir.join(SESSION_FILE);
                tokio::task::spawn_blocking(move || write_private(&path, &session))
                    .await
                    .map_err(|error| disconnected(&format!("saving the session failed: {error}")))?
                    .map_err(|message| ConnectorError::Unauthorized { message })?;
            }
        }
        let store = self.store_dir.clone();
        let _ = tokio::task::spawn_blocking(move || restrict_files(&store)).await;
        Ok(client)
    }

    fn login_error(&self, error: &matrix_sdk::Error) -> ConnectorError {
        match error.client_api_error_kind() {
            Some(
                ErrorKind::Forbidden | ErrorKind::UserDeactivated | ErrorKind::InvalidUsername,
            ) => ConnectorError::Unauthorized {
                message: format!(
                    "the homeserver refused the login for {}; check the password the \
                         channel's env reference names",
                    self.user
                ),
            },
            _ => disconnected(&self.redact(&format!("the Matrix login failed: {error}"))),
        }
    }

    pub(super) fn sync_error(&self, error: &matrix_sdk::Error) -> ConnectorError {
        match error.client_api_error_kind() {
            Some(ErrorKind::UnknownToken(_) | ErrorKind::MissingToken) => {
                ConnectorError::Unauthorized {
                    message: format!(
                        "the homeserver no longer accepts the saved session of {} (logged out, or \
                         its device was deleted); remove {} to log in again as a new device",
                        self.user,
                        self.store_dir.display()
                    ),
                }
            }
            Some(ErrorKind::UserDeactivated) => ConnectorError::Unauthorized {
                message: format!("the account {} is deactivated", self.user),
            },
            _ => disconnected(&self.redact(&format!("Matrix sync failed: {error}"))),
        }
    }

    /// `text` without the access token (the password travels only in the login body, which no
    /// error quotes), cut to [`MESSAGE_LIMIT`] characters.
    pub(super) fn redact(&self, text: &str) -> String {
        let mut text = text.trim().to_owned();
        if let Some(token) = self.client.get().and_then(Client::access_token) {
            text = redact_value(&text, &token, REDACTED);
        }
        match text.char_indices().nth(MESSAGE_LIMIT) {
            Some((end, _)) => format!("{}…", &text[..end]),
            None => text,
        }
    }

    /// The homeserver's `/_matrix/client/versions`, then, when a session is saved, `whoami`
    /// with its access token. Never a login: a new login is a new device. The store directory
    /// is read, never changed, and matrix-sdk's stores are not opened.
    pub(super) async fn check_account(&self) -> Result<Checked, CheckError> {
        let http = http_client(&self.homeserver)
            .build()
            .map_err(|error| CheckError::Failed {
                message: format!("cannot set up the HTTP client: {error}"),
            })?;
        let url = format!("{}/_matrix/client/versions", self.homeserver);
        let (status, versions) = check_get(&http, &url, None).await?;
        let newest = versions
            .get("versions")
            .and_then(serde_json::Value::as_array)
            .and_then(|versions| versions.iter().rev().find_map(serde_json::Value::as_str))
            .map(str::to_owned);
        let Some(newest) = newest.filter(|_| (200..300).contains(&status)) else {
            return Err(CheckError::Failed {
                message: format!(
                    "{url} answered {status} without a list of versions: is {} the homeserver's \
                     client-server API?",
                    self.homeserver
                ),
            });
        };
        let answers = format!("the homeserver answers (Matrix up to {newest})");
        let path = self.store_dir.join(SESSION_FILE);
        let session = match tokio::fs::read(&path).await {
            Ok(bytes) => serde_json::from_slice::<MatrixSession>(&bytes).map_err(|error| {
                CheckError::Failed {
                    message: format!(
                        "the saved Matrix session {} is unreadable ({error}); remove {} to log in \
                         again",
                        path.display(),
                        self.store_dir.display()
                    ),
                }
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Checked {
                    detail: format!(
                        "{answers}; {} is not logged in yet: perch run logs in once and keeps \
                         the session",
                        self.user
                    ),
                    verified: false,
                });
            }
            Err(error) => {
                return Err(CheckError::Failed {
                    message: format!("cannot read {}: {error}", path.display()),
                });
            }
        };
        if session.meta.user_id != self.user {
            return Err(CheckError::Refused {
                message: format!(
                    "the session saved in {} is for {}, but the channel names {}",
                    self.store_dir.display(),
                    session.meta.user_id,
                    self.user
                ),
            });
        }
        let token = session.tokens.access_token.as_str();
        let scrub = |error: CheckError| match error {
            CheckError::Unreachable { message } => CheckError::Unreachable {
                message: redact_value(&message, token, REDACTED),
            },
            other => other,
        };
        let url = format!("{}/_matrix/client/v3/account/whoami", self.homeserver);
        let (status, whoami) = check_get(&http, &url, Some(token)).await.map_err(scrub)?;
        let text = |key: &str| {
            let value = whoami
                .get(key)
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default();
            redact_value(value, token, REDACTED)
        };
        match status {
            200..=299 if text("user_id") == self.user.as_str() => Ok(Checked {
                detail: format!(
                    "{answers}; whoami accepts the saved session of {} (device {})",
                    self.user, session.meta.device_id
                ),
                verified: true,
            }),
            200..=299 => Err(CheckError::Refused {
                message: format!(
                    "the saved session's access token belongs to {:?}, not {}",
                    text("user_id"),
                    self.user
                ),
            }),
            401 | 403 => Err(CheckError::Refused {
                message: format!(
                    "the homeserver no longer accepts the saved session of {} ({} {}: {}); \
                     remove {} to log in again as a new device",
                    self.user,
                    status,
                    text("errcode"),
                    text("error"),
                    self.store_dir.display()
                ),
            }),
            _ => Err(CheckError::Failed {
                message: format!(
                    "whoami answered {status}: {} {}",
                    text("errcode"),
                    text("error")
                ),
            }),
        }
    }
}

/// Whether `homeserver` is a plain `http://` URL, which needs no certificates: its clients load
/// no trust store, so a homeserver on this machine works where the system has no CA
/// certificates.
fn plain_http(homeserver: &str) -> bool {
    homeserver
        .get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
}

/// A builder of perch's own requests to `homeserver` (the check, media downloads).
pub(super) fn http_client(homeserver: &str) -> matrix_sdk::reqwest::ClientBuilder {
    let builder = matrix_sdk::reqwest::Client::builder();
    if plain_http(homeserver) {
        builder.tls_certs_only(Vec::new())
    } else {
        builder
    }
}

/// One GET for [`MatrixConnector::check_account`]: the status and the body as JSON (`null`
/// when it is not JSON).
async fn check_get(
    http: &matrix_sdk::reqwest::Client,
    url: &str,
    token: Option<&str>,
) -> Result<(u16, serde_json::Value), CheckError> {
    let mut request = http.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let unreachable = |error: matrix_sdk::reqwest::Error| CheckError::Unreachable {
        message: on_one_line(&error.without_url()),
    };
    let response = request.send().await.map_err(unreachable)?;
    let status = response.status().as_u16();
    let bytes = response.bytes().await.map_err(unreachable)?;
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    ))
}

fn parse_user(user: &str) -> Result<OwnedUserId, String> {
    UserId::parse(user.trim()).map_err(|error| {
        format!("{user:?} is not a Matrix user id (such as @perch:example.org): {error}")
    })
}

/// Creates the store directory (mode 0700) and reads the saved session. A store without a
/// session cannot be used, so its files are removed.
pub(super) fn prepare_store(dir: &Path) -> Result<Option<MatrixSession>, String> {
    let cannot =
        |what: &str, error: std::io::Error| format!("cannot {what} {}: {error}", dir.display());
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|error| cannot("create the Matrix store directory", error))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|error| cannot("restrict the Matrix store directory", error))?;
    let path = dir.join(SESSION_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|error| {
            format!(
                "the saved Matrix session {} is unreadable ({error}); remove {} to log in again",
                path.display(),
                dir.display()
            )
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let entries = std::fs::read_dir(dir).map_err(|error| cannot("list", error))?;
            for entry in entries.flatten() {
                if entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with(STORE_FILE_PREFIX)
                {
                    std::fs::remove_file(entry.path())
                        .map_err(|error| cannot("clear the session-less store in", error))?;
                }
            }
            Ok(None)
        }
        Err(error) => Err(cannot("read the session in", error)),
    }
}

/// Writes `value` as JSON to `path` with mode 0600, replacing it atomically.
pub(super) fn write_private(path: &Path, value: &impl Serialize) -> Result<(), String> {
    let failed = |error: &dyn fmt::Display| format!("cannot write {}: {error}", path.display());
    let bytes = serde_json::to_vec_pretty(value).map_err(|error| failed(&error))?;
    crate::store::atomic_file::replace(path, &bytes, Some(0o600)).map_err(|error| failed(&error))
}

/// Makes every file in the store directory private to the owner (matrix-sdk creates its
/// databases with the process umask).
fn restrict_files(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|kind| kind.is_file()) {
            let _ = std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600));
        }
    }
}

/// The SQLite stores sized for one account: a small page cache and journal, and two pooled
/// connections per store (matrix-sdk's default is four per physical core).
fn store_config(dir: &Path, passphrase: &str) -> matrix_sdk::SqliteStoreConfig {
    matrix_sdk::SqliteStoreConfig::with_low_memory_config(dir)
        .passphrase(Some(passphrase))
        .pool_max_size(STORE_CONNECTIONS)
}

/// Pooled connections per SQLite store: one sync and one send at a time.
const STORE_CONNECTIONS: usize = 2;
