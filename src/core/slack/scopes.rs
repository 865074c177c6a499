//! Whether the bot token holds the scopes of perch's app manifest ([`bot_scopes`]), read from
//! the list of the token's scopes Slack sends with every Web API answer (`x-oauth-scopes`).

/// The bot scopes of the app manifest (docs/channels.md, channels/slack.lua), in its order,
/// each with what perch cannot do without it.
pub const BOT_SCOPES: &[(&str, &str)] = &[
    ("app_mentions:read", "mentions in channels"),
    ("channels:history", "messages in public channels"),
    ("groups:history", "messages in private channels"),
    ("im:history", "direct messages"),
    ("mpim:history", "group DMs"),
    ("chat:write", "posting replies"),
    ("users:read", "senders' names"),
    ("files:read", "downloading shared files"),
    ("files:write", "uploading a reply's files"),
];

/// What the token's scopes say about the manifest's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scopes {
    /// Slack listed no scopes (no `x-oauth-scopes`, or an empty one, which no bot token has):
    /// no verdict.
    Unseen,
    /// Every bot scope of the manifest is granted.
    Complete,
    /// These bot scopes of the manifest are not granted, in the manifest's order.
    Missing(Vec<&'static str>),
}

/// Compares `header`, the `x-oauth-scopes` of an answer to the bot token (scopes separated by
/// commas), with [`BOT_SCOPES`].
pub fn bot_scopes(header: Option<&str>) -> Scopes {
    let granted: Vec<&str> = header
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|scope| !scope.is_empty())
        .collect();
    if granted.is_empty() {
        return Scopes::Unseen;
    }
    let missing: Vec<&'static str> = BOT_SCOPES
        .iter()
        .map(|(scope, _)| *scope)
        .filter(|scope| !granted.iter().any(|held| held.eq_ignore_ascii_case(scope)))
        .collect();
    if missing.is_empty() {
        Scopes::Complete
    } else {
        Scopes::Missing(missing)
    }
}

/// What the token lacks, each scope with what perch cannot do without it: `the bot token
/// lacks mpim:history (group DMs) and files:write (uploading a reply's files)`.
pub fn lacking(missing: &[&str]) -> String {
    let named: Vec<String> = missing
        .iter()
        .map(
            |scope| match BOT_SCOPES.iter().find(|(known, _)| known == scope) {
                Some((_, what)) => format!("{scope} ({what})"),
                None => (*scope).to_owned(),
            },
        )
        .collect();
    format!("the bot token lacks {}", listed(&named))
}

/// The fix for missing scopes: where to add them, and that the app must be reinstalled for
/// the token to get them.
pub fn missing_scopes_fix(missing: &[&str]) -> String {
    let named: Vec<String> = missing.iter().map(|scope| (*scope).to_owned()).collect();
    let them = if missing.len() == 1 { "it" } else { "them" };
    format!(
        "add {} under OAuth & Permissions > Bot Token Scopes at https://api.slack.com/apps, \
         then reinstall the app to the workspace (the token gets {them} only then)",
        listed(&named)
    )
}

/// `a`, `a and b`, `a, b and c`.
fn listed(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [only] => only.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY: &str = "app_mentions:read,channels:history,groups:history,im:history,\
                         mpim:history,chat:write,users:read,files:read,files:write";

    #[test]
    fn the_header_is_read_against_the_manifest() {
        let cases: &[(Option<&str>, Scopes)] = &[
            (None, Scopes::Unseen),
            (Some(""), Scopes::Unseen),
            (Some(" , "), Scopes::Unseen),
            (Some(EVERY), Scopes::Complete),
            (
                Some(&format!("{EVERY},channels:read,reactions:write")),
                Scopes::Complete,
            ),
            (
                Some(
                    "files:write, files:read ,users:read,CHAT:WRITE,mpim:history,im:history,\
                     groups:history,channels:history,app_mentions:read",
                ),
                Scopes::Complete,
            ),
            (
                Some(
                    "app_mentions:read,channels:history,groups:history,im:history,chat:write,\
                     users:read,files:read",
                ),
                Scopes::Missing(vec!["mpim:history", "files:write"]),
            ),
            (
                Some("chat:write"),
                Scopes::Missing(vec![
                    "app_mentions:read",
                    "channels:history",
                    "groups:history",
                    "im:history",
                    "mpim:history",
                    "users:read",
                    "files:read",
                    "files:write",
                ]),
            ),
            (
                Some("chat:write:bot,channels:history:extra"),
                Scopes::Missing(BOT_SCOPES.iter().map(|(scope, _)| *scope).collect()),
            ),
        ];
        for (header, expected) in cases {
            assert_eq!(&bot_scopes(*header), expected, "{header:?}");
        }
    }

    #[test]
    fn the_missing_scopes_are_named_with_what_they_are_for_and_the_fix() {
        let cases: &[(&[&str], &str, &str)] = &[
            (
                &["mpim:history"],
                "the bot token lacks mpim:history (group DMs)",
                "add mpim:history under OAuth & Permissions > Bot Token Scopes at \
                 https://api.slack.com/apps, then reinstall the app to the workspace (the token \
                 gets it only then)",
            ),
            (
                &["mpim:history", "files:write"],
                "the bot token lacks mpim:history (group DMs) and files:write (uploading a \
                 reply's files)",
                "add mpim:history and files:write under OAuth & Permissions > Bot Token Scopes \
                 at https://api.slack.com/apps, then reinstall the app to the workspace (the \
                 token gets them only then)",
            ),
            (
                &["im:history", "chat:write", "users:read"],
                "the bot token lacks im:history (direct messages), chat:write (posting \
                 replies) and users:read (senders' names)",
                "add im:history, chat:write and users:read under OAuth & Permissions > Bot \
                 Token Scopes at https://api.slack.com/apps, then reinstall the app to the \
                 workspace (the token gets them only then)",
            ),
        ];
        for (missing, lacks, fix) in cases {
            assert_eq!(lacking(missing), *lacks);
            assert_eq!(missing_scopes_fix(missing), *fix);
        }
    }
}
