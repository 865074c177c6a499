//! Removing secret values from text that may quote them (an error echoing a request, a
//! server's message quoting a key).
//!
//! A value of [`WHOLE_TOKEN_BELOW`] characters or more is cut out wherever it occurs. A shorter
//! one (a local server's dummy key such as `x` or `ollama`) would match inside ordinary words,
//! so it is cut out only where it stands as a whole token; the words around it stay intact.
//!
//! A Telegram bot token gets more: an exact match is not enough, because a token read with a
//! stray space, tab or CR is sent and echoed differently from how it was read, so every
//! token-shaped piece goes too. So do Slack's tokens, whose prefixes say what they are: `xoxb-`
//! (a bot's), `xoxp-` (a user's), `xapp-` (an app-level token, for the socket), `xoxe.` (a
//! rotating token) and `xoxe-` (its refresh token); and the `ticket` of a Socket Mode URL,
//! which opens the app's event stream to whoever holds it.

/// What a removed secret value is replaced with.
pub const REDACTED: &str = "<redacted>";

/// What a removed Telegram or Slack token is replaced with.
pub const REDACTED_TOKEN: &str = "<token>";

/// Secret values shorter than this many characters are removed only where they stand as a
/// whole token (see [`redact_value`]).
pub const WHOLE_TOKEN_BELOW: usize = 8;

/// `text` with `value` replaced by `replacement`: everywhere when `value` has at least
/// [`WHOLE_TOKEN_BELOW`] characters, otherwise only where neither neighbour is a letter, a
/// digit, `_` or `-` (so the key `x` goes from `key: x.` but not from `unexpected` or
/// `x-api-key`). An empty value changes nothing.
pub fn redact_value(text: &str, value: &str, replacement: &str) -> String {
    if value.is_empty() || !text.contains(value) {
        return text.to_owned();
    }
    if value.chars().count() >= WHOLE_TOKEN_BELOW {
        return text.replace(value, replacement);
    }
    let joins =
        |ch: Option<char>| ch.is_some_and(|ch| ch.is_alphanumeric() || ch == '_' || ch == '-');
    let mut out = String::with_capacity(text.len());
    let mut rest = 0;
    let mut from = 0;
    while let Some(found) = text[from..].find(value) {
        let start = from + found;
        let end = start + value.len();
        let before = text[..start].chars().next_back();
        let after = text[end..].chars().next();
        if joins(before) || joins(after) {
            from = start + value.chars().next().map_or(1, char::len_utf8);
            continue;
        }
        out.push_str(&text[rest..start]);
        out.push_str(replacement);
        rest = end;
        from = end;
    }
    out.push_str(&text[rest..]);
    out
}

/// `text` without `token` (as given and trimmed), without its secret part, without anything in
/// the shape of a bot token (`<digits>:<20 or more of A-Z a-z 0-9 _ ->`), and without whatever
/// follows `/bot` in a URL up to the next `/` when it holds a `:`.
pub fn redact_telegram_token(text: &str, token: &str) -> String {
    let mut text = text.to_owned();
    let trimmed = token.trim();
    let secret = trimmed.split_once(':').map(|(_, secret)| secret.trim());
    for exact in [Some(token), Some(trimmed), secret].into_iter().flatten() {
        text = redact_value(&text, exact, REDACTED_TOKEN);
    }
    redact_url_paths(&redact_token_shapes(&text))
}

/// The fewest characters after a Slack token's prefix for a piece to be taken for a token:
/// real ones have dozens, while a message naming the kind (`an xapp-… token`) has none.
pub const SLACK_TOKEN_MIN_BODY: usize = 10;

/// `text` without `token` (as given and trimmed), without anything in the shape of a Slack
/// token (`xox<letter>-`, `xoxe.` or `xapp-`, then at least [`SLACK_TOKEN_MIN_BODY`] of
/// A-Z a-z 0-9 `-` `_` `.`, starting a word), and without the value of a URL's `ticket`
/// parameter. An empty `token` removes the shapes only.
pub fn redact_slack_token(text: &str, token: &str) -> String {
    let mut text = text.to_owned();
    for exact in [token, token.trim()] {
        text = redact_value(&text, exact, REDACTED_TOKEN);
    }
    redact_tickets(&redact_slack_shapes(&text))
}

/// The length of the Slack token prefix at the start of `rest`, if one is there.
fn slack_prefix(rest: &[char]) -> Option<usize> {
    let starts = |prefix: &str| {
        rest.len() >= prefix.len() && prefix.chars().zip(rest).all(|(want, &ch)| want == ch)
    };
    if starts("xapp-") || starts("xoxe.") {
        return Some(5);
    }
    (starts("xox")
        && rest.get(3).is_some_and(char::is_ascii_lowercase)
        && rest.get(4) == Some(&'-'))
    .then_some(5)
}

fn redact_slack_shapes(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut index = 0;
    while index < chars.len() {
        let starts_word =
            index == 0 || !(is_secret_char(chars[index - 1]) || chars[index - 1] == '.');
        if starts_word && let Some(prefix) = slack_prefix(&chars[index..]) {
            let mut end = index + prefix;
            while end < chars.len()
                && (is_secret_char(chars[end])
                    || (chars[end] == '.'
                        && chars.get(end + 1).is_some_and(char::is_ascii_alphanumeric)))
            {
                end += 1;
            }
            if end - (index + prefix) >= SLACK_TOKEN_MIN_BODY {
                out.push_str(REDACTED_TOKEN);
                index = end;
                continue;
            }
        }
        out.push(chars[index]);
        index += 1;
    }
    out
}

/// Replaces the value of every `ticket=` parameter of a URL (`?ticket=…` or `&ticket=…`).
fn redact_tickets(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("ticket=") {
        let (before, after) = rest.split_at(at + "ticket=".len());
        out.push_str(before);
        let in_url = before[..at].ends_with(['?', '&']);
        let end = after
            .find(|ch: char| {
                ch == '&' || ch == '"' || ch == '\'' || ch == ')' || ch.is_whitespace()
            })
            .unwrap_or(after.len());
        if in_url && end > 0 {
            out.push_str(REDACTED_TOKEN);
        } else {
            out.push_str(&after[..end]);
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

fn is_secret_char(ch: char) -> bool {
    ch.is_ascii_alphanumeric() || ch == '_' || ch == '-'
}

/// Replaces `<digits>:<secret chars, 20 or more>`.
fn redact_token_shapes(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut index = 0;
    while index < chars.len() {
        let starts_word = index == 0 || !chars[index - 1].is_ascii_digit();
        if starts_word && chars[index].is_ascii_digit() {
            let digits_end = (index..chars.len())
                .find(|&at| !chars[at].is_ascii_digit())
                .unwrap_or(chars.len());
            if digits_end < chars.len() && chars[digits_end] == ':' {
                let secret_end = (digits_end + 1..chars.len())
                    .find(|&at| !is_secret_char(chars[at]))
                    .unwrap_or(chars.len());
                if secret_end - (digits_end + 1) >= 20 {
                    out.push_str(REDACTED_TOKEN);
                    index = secret_end;
                    continue;
                }
            }
            out.extend(&chars[index..digits_end]);
            index = digits_end;
            continue;
        }
        out.push(chars[index]);
        index += 1;
    }
    out
}

/// Replaces what follows `/bot` up to the next `/` (or the end of the URL), where the Bot API
/// puts the token: `https://api.telegram.org/bot<token>/getMe`.
fn redact_url_paths(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("/bot") {
        let (before, after) = rest.split_at(at + "/bot".len());
        out.push_str(before);
        let end = after
            .find(['/', '?', '"', ')', '\n'])
            .unwrap_or(after.len());
        let taken = &after[..end];
        if taken.contains(':') || taken.contains(REDACTED_TOKEN) {
            out.push_str(REDACTED_TOKEN);
        } else {
            out.push_str(taken);
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw";

    #[test]
    fn a_long_value_goes_everywhere_and_a_short_one_only_as_a_whole_token() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "sk-0123456789",
                "key sk-0123456789, again xsk-0123456789x",
                "key <redacted>, again x<redacted>x",
            ),
            (
                "x",
                "builder error: unexpected error: bad key x.",
                "builder error: unexpected error: bad key <redacted>.",
            ),
            ("x", "x-api-key: x", "x-api-key: <redacted>"),
            ("x", "x", "<redacted>"),
            ("x", "(x)\n\"x\"", "(<redacted>)\n\"<redacted>\""),
            ("x", "xx x_y ẋ éx xé", "xx x_y ẋ éx xé"),
            (
                "ollama",
                "Bearer ollama; the ollama server (ollamas)",
                "Bearer <redacted>; the <redacted> server (ollamas)",
            ),
            ("é", "café é", "café <redacted>"),
            ("", "nothing changes", "nothing changes"),
            ("abc", "abcabc abc", "abcabc <redacted>"),
        ];
        for (value, text, expected) in cases {
            assert_eq!(
                redact_value(text, value, REDACTED),
                *expected,
                "{value:?} in {text:?}"
            );
        }
    }

    #[test]
    fn a_short_telegram_token_leaves_words_alone() {
        assert_eq!(
            redact_telegram_token("an unexpected reply from 1:x", "1:x"),
            "an unexpected reply from <token>"
        );
    }

    #[test]
    fn the_token_is_removed_however_it_was_mangled() {
        let cases: &[(&str, &str)] = &[
            (
                "error sending request for url (https://api.telegram.org/bot123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/GetMe)",
                "error sending request for url (https://api.telegram.org/bot<token>/GetMe)",
            ),
            (
                "url (http://127.0.0.1:8081/bot123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw%0D/GetUpdates)",
                "url (http://127.0.0.1:8081/bot<token>/GetUpdates)",
            ),
            (
                "url (http://x/bot123456789:AAHdqTcvCH1vGWJxf%20SeofSAs0K5PALDsaw/GetMe)",
                "url (http://x/bot<token>/GetMe)",
            ),
            (
                "bad token 123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw\t!",
                "bad token <token>\t!",
            ),
            ("just AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw", "just <token>"),
            (
                "another bot 987654321:ZZZdqTcvCH1vGWJxfSeofSAs0K5PALDsaw",
                "another bot <token>",
            ),
            (
                "port 127.0.0.1:8081 and 12:30",
                "port 127.0.0.1:8081 and 12:30",
            ),
            ("the bot said hi", "the bot said hi"),
            (
                "https://api.telegram.org/bot/GetMe",
                "https://api.telegram.org/bot/GetMe",
            ),
            (
                "https://example.org/botany/x",
                "https://example.org/botany/x",
            ),
        ];
        for (raw, expected) in cases {
            assert_eq!(redact_telegram_token(raw, TOKEN), *expected, "{raw:?}");
            for stray in [" ", "\t", "\r", "\r\n"] {
                let mangled = format!("{TOKEN}{stray}");
                let redacted = redact_telegram_token(raw, &mangled);
                assert!(!redacted.contains("AAHdqTcv"), "{raw:?} with {stray:?}");
            }
        }
    }

    const SLACK_BOT: &str = "xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy";

    #[test]
    fn slack_tokens_are_removed_by_their_shape() {
        let cases: &[(&str, &str)] = &[
            (
                "auth failed for xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy.",
                "auth failed for <token>.",
            ),
            ("Bearer xoxp-2398-2398-2398-4c8b5a9e1f", "Bearer <token>"),
            (
                "SLACK_APP_TOKEN=xapp-1-A01K58AR4RF-1234567890123-0a1b2c3d4e5f",
                "SLACK_APP_TOKEN=<token>",
            ),
            (
                "rotating xoxe.xoxp-1-Mi0yLTM0MTQwNjY0.MTI and refresh xoxe-1-My0xLTM0MTQwNjY0",
                "rotating <token> and refresh <token>",
            ),
            (
                "{\"token\":\"xoxb-1-2-abcdefghij\"}",
                "{\"token\":\"<token>\"}",
            ),
            ("(xapp-1-A0-1-deadbeefcafe)", "(<token>)"),
            (
                "set it to the app's xapp-… token",
                "set it to the app's xapp-… token",
            ),
            (
                "a bot token starts with xoxb- and a user token with xoxp-",
                "a bot token starts with xoxb- and a user token with xoxp-",
            ),
            ("xoxb-short", "xoxb-short"),
            (
                "myxoxb-17653672481-19874698323-pdFZ stays",
                "myxoxb-17653672481-19874698323-pdFZ stays",
            ),
            (
                "xoxB-17653672481-19874698323",
                "xoxB-17653672481-19874698323",
            ),
            (
                "wss://wss-primary.slack.com/link/?ticket=1234-5678-abcd&app_id=A01K58AR4RF",
                "wss://wss-primary.slack.com/link/?ticket=<token>&app_id=A01K58AR4RF",
            ),
            (
                "url (ws://127.0.0.1:9/link?app_id=A1&ticket=zzz)",
                "url (ws://127.0.0.1:9/link?app_id=A1&ticket=<token>)",
            ),
            ("a ticket=none outside a URL", "a ticket=none outside a URL"),
            ("nothing here", "nothing here"),
        ];
        for (raw, expected) in cases {
            assert_eq!(redact_slack_token(raw, ""), *expected, "{raw:?}");
        }
    }

    #[test]
    fn a_slack_token_is_removed_however_it_was_read() {
        for stray in ["", " ", "\t", "\r", "\r\n"] {
            let read = format!("{SLACK_BOT}{stray}");
            for raw in [
                format!("token {SLACK_BOT} refused"),
                format!("header: Bearer {read}!"),
                "xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy\r\n".to_owned(),
            ] {
                let redacted = redact_slack_token(&raw, &read);
                assert!(
                    !redacted.contains("pdFZKVeTuE8sk7oOcBrzbqgy"),
                    "{raw:?} with {stray:?}"
                );
            }
        }
        assert_eq!(
            redact_slack_token("x plain-secret-value y", "plain-secret-value"),
            "x <token> y"
        );
    }
}
