//! An error and its causes on one line, for messages and logs.

use std::error::Error;

/// `error`, then each cause whose text it does not already hold, joined with `: `.
pub fn on_one_line(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::on_one_line;
    use std::fmt;

    #[derive(Debug)]
    struct Layer {
        text: &'static str,
        cause: Option<Box<Layer>>,
    }

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.text)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.cause
                .as_deref()
                .map(|cause| cause as &(dyn std::error::Error + 'static))
        }
    }

    fn chain(texts: &[&'static str]) -> Layer {
        let mut layers = texts.iter().rev();
        let mut error = Layer {
            text: layers.next().copied().unwrap_or_default(),
            cause: None,
        };
        for text in layers {
            error = Layer {
                text,
                cause: Some(Box::new(error)),
            };
        }
        error
    }

    #[test]
    fn causes_follow_the_error_and_a_cause_already_said_is_left_out() {
        let cases: [(&[&'static str], &str); 3] = [
            (&["request failed"], "request failed"),
            (
                &["request failed", "connection refused", "os error 111"],
                "request failed: connection refused: os error 111",
            ),
            (
                &["error sending request: timed out", "timed out", "deadline"],
                "error sending request: timed out: deadline",
            ),
        ];
        for (texts, expected) in cases {
            assert_eq!(on_one_line(&chain(texts)), expected, "{texts:?}");
        }
    }
}
