//! Which failures stop a heartbeat task until its entry changes or it is resumed: the ones that
//! do not go away by trying again, decided from the kind of the model's error, never its text.

/// What kind of model error failed a run, as far as trying again goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFailure {
    /// The provider refused the key or its permissions (HTTP 401 or 403).
    AuthRejected,
    /// The account has no quota or credit left (HTTP 402, or a 429 that is not a rate limit).
    QuotaExhausted,
    /// The provider refused this request (another 4xx: an unknown model, a request too long).
    RequestRejected,
    /// May pass by itself: a rate limit, a server error, a lost connection, a timeout.
    Transient,
    /// The reply was not what the API promises.
    Unusable,
    /// perch could not make the request on this machine (no CA certificates for an `https://`
    /// model): nothing reached the provider, and nothing is spent until the machine is fixed.
    Misconfigured,
}

/// The kind of a provider's refusal (a 4xx that is not a rate limit), from its HTTP status.
pub fn refusal(status: u16) -> ModelFailure {
    match status {
        401 | 403 => ModelFailure::AuthRejected,
        402 | 429 => ModelFailure::QuotaExhausted,
        _ => ModelFailure::RequestRejected,
    }
}

/// Whether a run that failed with `failure` stops its task. Only a refused key and a spent
/// quota do: every later slot would fail the same way and cost a request each, so the owner is
/// told once and the task waits for `perch heartbeat resume` or an edit of its entry. A failure
/// that was not the model's (`None`: a check, the spend cap, a tool-call limit) never stops it.
pub fn stops_task(failure: Option<ModelFailure>) -> bool {
    matches!(
        failure,
        Some(ModelFailure::AuthRejected | ModelFailure::QuotaExhausted)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_by_status() {
        let table = [
            (400, ModelFailure::RequestRejected),
            (401, ModelFailure::AuthRejected),
            (402, ModelFailure::QuotaExhausted),
            (403, ModelFailure::AuthRejected),
            (404, ModelFailure::RequestRejected),
            (413, ModelFailure::RequestRejected),
            (429, ModelFailure::QuotaExhausted),
        ];
        for (status, kind) in table {
            assert_eq!(refusal(status), kind, "HTTP {status}");
        }
    }

    #[test]
    fn only_a_refused_key_or_a_spent_quota_stops_a_task() {
        let table = [
            (None, false),
            (Some(ModelFailure::AuthRejected), true),
            (Some(ModelFailure::QuotaExhausted), true),
            (Some(ModelFailure::RequestRejected), false),
            (Some(ModelFailure::Transient), false),
            (Some(ModelFailure::Unusable), false),
            (Some(ModelFailure::Misconfigured), false),
        ];
        for (failure, stops) in table {
            assert_eq!(stops_task(failure), stops, "{failure:?}");
        }
    }
}
