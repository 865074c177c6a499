//! Slack's wire as pure functions: Socket Mode frames read ([`envelope`]), an event classified
//! into what perch does with it ([`event`]), what ends a socket leads to ([`socket`]), the Web
//! API's answers read ([`web`]) and its calls paced ([`pace`]), the bot token's scopes held
//! against the app manifest's ([`scopes`]), and perch's Markdown written as Slack's mrkdwn
//! ([`mrkdwn`]).
//!
//! Nothing here opens a socket or sends a request: the channel's door does, and asks these
//! functions what each frame, answer and failure means. The tests read Slack's documented
//! examples from `tests/fixtures/slack/`.

pub mod envelope;
pub mod event;
pub mod mrkdwn;
pub mod pace;
pub mod scopes;
pub mod socket;
pub mod web;

/// One of `tests/fixtures/slack/`, read at compile time: `fixture!("socket-hello.json")`.
#[cfg(test)]
macro_rules! fixture {
    ($name:literal) => {
        $crate::slack::fixtures::Fixture::read(
            $name,
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../tests/fixtures/slack/",
                $name
            )),
        )
    };
}
#[cfg(test)]
pub(crate) use fixture;

#[cfg(test)]
pub(crate) mod fixtures {
    /// A documented example: what Slack sends, and for the Web API the HTTP answer around it.
    pub struct Fixture {
        pub body: serde_json::Value,
        pub status: Option<u16>,
        pub retry_after: Option<String>,
    }

    impl Fixture {
        pub fn read(name: &str, text: &str) -> Fixture {
            let file: serde_json::Value = serde_json::from_str(text).unwrap();
            assert!(
                file["source"]
                    .as_str()
                    .is_some_and(|source| source.starts_with("https://docs.slack.dev/")),
                "{name} names no source"
            );
            Fixture {
                body: file["body"].clone(),
                status: file["status"].as_u64().map(|status| status as u16),
                retry_after: file["headers"]["Retry-After"].as_str().map(str::to_owned),
            }
        }

        /// The body as the text of a frame or an HTTP answer.
        pub fn text(&self) -> String {
            self.body.to_string()
        }
    }
}
