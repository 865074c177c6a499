//! Command output as the model sees it: bounded, with the rest kept where it can be read.

/// The most characters of one command's output the model is given.
pub const MODEL_OUTPUT_LIMIT: usize = 24_000;

/// The guest directory where perch keeps full outputs that were too long for the model.
pub const FULL_OUTPUT_DIR: &str = "/var/tmp/perch";

/// `text` if it fits in `limit` characters; otherwise its beginning and end with a line in
/// between that says how much was left out and where the whole of it is.
pub fn shorten(text: &str, limit: usize, kept_at: &str) -> String {
    let total = text.chars().count();
    if total <= limit {
        return text.to_owned();
    }
    let head_chars = limit / 2;
    let tail_chars = limit - head_chars;
    let head_end = text
        .char_indices()
        .nth(head_chars)
        .map_or(text.len(), |(index, _)| index);
    let tail_start = text
        .char_indices()
        .nth(total - tail_chars)
        .map_or(text.len(), |(index, _)| index);
    format!(
        "{}\n[... {} of {total} characters left out; the whole output is in {kept_at} ...]\n{}",
        &text[..head_end],
        total - head_chars - tail_chars,
        &text[tail_start..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_unchanged() {
        assert_eq!(shorten("hello", 10, "/x"), "hello");
        assert_eq!(shorten("héllo", 5, "/x"), "héllo");
    }

    #[test]
    fn long_text_keeps_both_ends_and_says_where_the_rest_is() {
        let text = format!("{}{}{}", "a".repeat(10), "é".repeat(100), "z".repeat(10));
        let short = shorten(&text, 20, "/var/tmp/perch/1.txt");
        assert!(short.starts_with("aaaaaaaaaa\n"), "{short}");
        assert!(short.ends_with("\nzzzzzzzzzz"), "{short}");
        assert!(short.contains("100 of 120 characters left out"), "{short}");
        assert!(short.contains("/var/tmp/perch/1.txt"), "{short}");
    }
}
