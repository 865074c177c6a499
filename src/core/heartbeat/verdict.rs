//! The verdict that is a heartbeat's whole reply: silence, a message, or a steer.

use std::fmt;

/// What the model decided after a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing worth saying.
    Silence,
    /// Text for the task's delivery target.
    Message(String),
    /// Text for the task's steer lane.
    Steer(String),
}

/// Why a reply is not a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidVerdict {
    pub reason: String,
}

impl fmt::Display for InvalidVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for InvalidVerdict {}

/// The verdict rule, as the system prompt states it.
pub const VERDICT_RULE: &str = "Your whole reply to a heartbeat is one verdict: exactly \
`SILENCE` when nothing needs saying, `Message: ` followed by the text to send to the task's \
delivery target, or `Steer: ` followed by the text to pass to the agent's lane. Write the word \
exactly as shown, with one space after the colon, and nothing before or after the verdict; the \
text may span several lines.";

const SILENCE: &str = "SILENCE";
const PREFIXES: [&str; 2] = ["Message:", "Steer:"];

fn invalid(reason: impl Into<String>) -> InvalidVerdict {
    InvalidVerdict {
        reason: reason.into(),
    }
}

/// Reads a heartbeat reply, trimmed at both ends, as a verdict.
pub fn judge(reply: &str) -> Result<Verdict, InvalidVerdict> {
    let reply = reply.trim();
    if reply.is_empty() {
        return Err(invalid("the reply is empty"));
    }
    if reply == SILENCE {
        return Ok(Verdict::Silence);
    }
    if let Some(after) = reply.strip_prefix(SILENCE) {
        let extra: String = after.trim().chars().take(40).collect();
        return Err(invalid(format!(
            "SILENCE must be the whole reply, but text follows it: {extra:?}"
        )));
    }
    for prefix in PREFIXES {
        if let Some(rest) = reply.strip_prefix(prefix) {
            return prefixed(prefix, rest);
        }
    }
    let first_word: String = reply.chars().take_while(|c| c.is_alphabetic()).collect();
    if first_word.eq_ignore_ascii_case(SILENCE) {
        return Err(invalid(format!(
            "the verdict is case-sensitive: write SILENCE, not {first_word}"
        )));
    }
    for prefix in PREFIXES {
        let word = &prefix[..prefix.len() - 1];
        if first_word.eq_ignore_ascii_case(word) {
            let start: String = reply
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(24)
                .collect();
            return Err(invalid(format!(
                "the verdict is case-sensitive, and takes a colon and one space: write \
                 `{prefix} <text>`, not {start:?}"
            )));
        }
    }
    if let Some(found) = [SILENCE, "Message: ", "Steer: "]
        .into_iter()
        .find(|verdict| reply.contains(verdict))
    {
        return Err(invalid(format!(
            "the verdict must start the reply, but text comes before `{}`",
            found.trim_end()
        )));
    }
    Err(invalid(
        "the reply is not a verdict: it is neither SILENCE nor starts with `Message: ` or \
         `Steer: `",
    ))
}

fn prefixed(prefix: &str, rest: &str) -> Result<Verdict, InvalidVerdict> {
    if rest.is_empty() {
        return Err(invalid(format!("`{prefix}` has no text after it")));
    }
    let Some(text) = rest.strip_prefix(' ') else {
        return Err(invalid(format!(
            "`{prefix}` must be followed by exactly one space, then the text"
        )));
    };
    if text.starts_with(char::is_whitespace) {
        return Err(invalid(format!(
            "`{prefix}` must be followed by exactly one space, then the text; found more \
             whitespace"
        )));
    }
    let text = text.to_owned();
    Ok(if prefix == "Message:" {
        Verdict::Message(text)
    } else {
        Verdict::Steer(text)
    })
}

/// The message sent back to the model after an invalid verdict: what was wrong, and the rule.
pub fn correction(invalid: &InvalidVerdict) -> String {
    format!(
        "That reply is not a valid verdict: {}. {VERDICT_RULE} Reply again with the verdict \
         only.",
        invalid.reason
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_read_after_trimming_the_reply() {
        let message = |text: &str| Verdict::Message(text.into());
        let cases = [
            ("SILENCE", Verdict::Silence),
            ("\n  SILENCE \n", Verdict::Silence),
            ("Message: the build is red", message("the build is red")),
            (
                "  Message: line one\n\n- line two\n",
                message("line one\n\n- line two"),
            ),
            (
                "Steer: look at the inbox",
                Verdict::Steer("look at the inbox".into()),
            ),
            ("Message: SILENCE", message("SILENCE")),
        ];
        for (reply, verdict) in cases {
            assert_eq!(judge(reply), Ok(verdict), "{reply:?}");
        }
    }

    #[test]
    fn every_near_miss_is_invalid_with_its_reason() {
        let cases = [
            ("", "the reply is empty"),
            ("   \n", "the reply is empty"),
            ("silence", "case-sensitive: write SILENCE, not silence"),
            ("Silence", "case-sensitive: write SILENCE, not Silence"),
            (
                "SILENCE.",
                "SILENCE must be the whole reply, but text follows it: \".\"",
            ),
            (
                "SILENCE\n\nI checked and nothing changed.",
                "SILENCE must be the whole reply, but text follows it: \"I checked",
            ),
            ("SILENCE: nothing new", "SILENCE must be the whole reply"),
            ("Message:", "`Message:` has no text after it"),
            ("Message:   ", "`Message:` has no text after it"),
            ("Steer:", "`Steer:` has no text after it"),
            (
                "Message:hi",
                "`Message:` must be followed by exactly one space",
            ),
            (
                "Message:\nhi",
                "`Message:` must be followed by exactly one space",
            ),
            ("Message:  two spaces", "found more whitespace"),
            ("Message: \thi", "found more whitespace"),
            ("Steer:  x", "found more whitespace"),
            (
                "message: hi",
                "write `Message: <text>`, not \"message: hi\"",
            ),
            (
                "MESSAGE: hi",
                "write `Message: <text>`, not \"MESSAGE: hi\"",
            ),
            (
                "Message - hi",
                "write `Message: <text>`, not \"Message - hi\"",
            ),
            ("steer: x", "write `Steer: <text>`, not \"steer: x\""),
            ("Sure! Message: hi", "text comes before `Message:`"),
            (
                "I looked around.\nSteer: check CI",
                "text comes before `Steer:`",
            ),
            ("Nothing new, so: SILENCE", "text comes before `SILENCE`"),
            ("**SILENCE**", "text comes before `SILENCE`"),
            ("`Message: hi`", "text comes before `Message:`"),
            ("All quiet.", "the reply is not a verdict"),
            (
                "Message:hi Steer: x",
                "`Message:` must be followed by exactly one space",
            ),
        ];
        for (reply, reason) in cases {
            let error = judge(reply).expect_err(reply);
            assert!(
                error.reason.contains(reason),
                "{reply:?}: {:?} lacks {reason:?}",
                error.reason
            );
        }
    }

    #[test]
    fn the_correction_names_what_was_wrong_and_the_rule() {
        let error = judge("silence").unwrap_err();
        let text = correction(&error);
        assert!(
            text.starts_with("That reply is not a valid verdict: the verdict is case-sensitive")
        );
        assert!(text.contains(VERDICT_RULE));
        assert!(text.ends_with("Reply again with the verdict only."));
        assert_eq!(error.to_string(), error.reason);
    }
}
