//! What Discord's refusals and failures become: a connector, check or delivery error, with the
//! URL (a signed CDN link) left out.

use crate::channel::{CheckError, ConnectorError, DeliveryError};
use serenity::all::{GatewayError, HttpError};
use std::time::Duration;

/// The wait assumed for a 429 whose `Retry-After` serenity does not pass on: with the
/// ratelimiter disabled (an API proxy, the test fake) serenity returns the status and body only.
pub const FALLBACK_RETRY_AFTER: Duration = Duration::from_secs(1);

pub(super) fn disconnected(message: &str) -> ConnectorError {
    ConnectorError::Disconnected {
        message: message.to_owned(),
    }
}

pub(super) fn connect_error(error: serenity::Error) -> ConnectorError {
    match error {
        serenity::Error::Http(HttpError::UnsuccessfulRequest(response))
            if response.status_code.as_u16() == 401 =>
        {
            ConnectorError::Unauthorized {
                message: "Discord refused the bot token (401); check the token the channel's env reference names".into(),
            }
        }
        serenity::Error::Http(HttpError::UnsuccessfulRequest(response)) => disconnected(&format!(
            "Discord answered {} (code {}): {}",
            response.status_code.as_u16(),
            response.error.code,
            response.error.message
        )),
        serenity::Error::Gateway(GatewayError::InvalidAuthentication) => {
            ConnectorError::Unauthorized {
                message: "the gateway refused the bot token (close code 4004)".into(),
            }
        }
        serenity::Error::Gateway(
            GatewayError::DisallowedGatewayIntents | GatewayError::InvalidGatewayIntents,
        ) => ConnectorError::Unauthorized {
            message: "the gateway refused the intents; enable the Message Content intent for the bot in the Discord Developer Portal".into(),
        },
        other => disconnected(&format!("Discord connection failed: {other}")),
    }
}

pub(super) fn check_error(error: serenity::Error) -> CheckError {
    match error {
        serenity::Error::Http(HttpError::UnsuccessfulRequest(response))
            if matches!(response.status_code.as_u16(), 401 | 403) =>
        {
            CheckError::Refused {
                message: format!(
                    "Discord refused the bot token ({})",
                    response.status_code.as_u16()
                ),
            }
        }
        serenity::Error::Http(HttpError::UnsuccessfulRequest(response)) => CheckError::Failed {
            message: format!(
                "Discord answered {} (code {}): {}",
                response.status_code.as_u16(),
                response.error.code,
                response.error.message
            ),
        },
        serenity::Error::Http(HttpError::Request(error)) => CheckError::Unreachable {
            message: format!("cannot reach Discord: {}", describe_download(error)),
        },
        other => CheckError::Failed {
            message: format!("Discord: {other}"),
        },
    }
}

pub(super) fn client_ended(
    ended: Result<serenity::Result<()>, tokio::task::JoinError>,
) -> ConnectorError {
    match ended {
        Ok(Ok(())) => disconnected("the gateway client stopped"),
        Ok(Err(error)) => connect_error(error),
        Err(_) => disconnected("the gateway client task failed"),
    }
}

pub(super) fn delivery_error(error: serenity::Error) -> DeliveryError {
    match error {
        serenity::Error::Http(HttpError::Request(error)) if error.is_connect() => {
            DeliveryError::NotSent {
                message: format!("no connection to Discord: {}", error.without_url()),
            }
        }
        serenity::Error::Http(HttpError::UnsuccessfulRequest(response)) => {
            let status = response.status_code.as_u16();
            let message = format!(
                "Discord answered {status} (code {}): {}{}",
                response.error.code,
                response.error.message,
                response
                    .error
                    .errors
                    .iter()
                    .map(|error| format!("; {}: {}", error.path, error.message))
                    .collect::<String>()
            );
            match status {
                429 => DeliveryError::RateLimited {
                    retry_after: FALLBACK_RETRY_AFTER,
                },
                400 | 403 | 404 | 413 => DeliveryError::Rejected { message },
                _ => DeliveryError::Failed { message },
            }
        }
        serenity::Error::Model(error) => DeliveryError::Rejected {
            message: format!("Discord would refuse the message: {error}"),
        },
        other => DeliveryError::Failed {
            message: format!("sending to Discord failed: {other}"),
        },
    }
}

/// A download error on one line, without the URL (a signed CDN link).
pub(super) fn describe_download(error: reqwest012::Error) -> String {
    perch_core::error_chain::on_one_line(&error.without_url())
}
