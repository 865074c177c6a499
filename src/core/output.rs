//! Command output as the host keeps it and as the model sees it: bounded, with the rest kept in
//! the guest where it can be read.

use std::collections::VecDeque;

/// The most characters of one command's output the model is given.
pub const MODEL_OUTPUT_LIMIT: usize = 24_000;

/// The guest directory where perch keeps full outputs that were too long for the model.
pub const FULL_OUTPUT_DIR: &str = "/var/tmp/perch";

/// How much of one output stream of one command reaches perch's memory: its first `head` bytes
/// and its last `tail` bytes; what lies between is only counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamCap {
    pub head: usize,
    pub tail: usize,
}

impl StreamCap {
    /// What the host keeps of each stream of a command unless the command asks otherwise:
    /// 1 MiB in all, half from each end.
    pub const HOST_DEFAULT: StreamCap = StreamCap {
        head: 512 << 10,
        tail: 512 << 10,
    };

    /// Keeps the first `bytes` bytes and no tail, for a reader that needs the stream whole or
    /// not at all.
    pub const fn whole(bytes: usize) -> StreamCap {
        StreamCap {
            head: bytes,
            tail: 0,
        }
    }

    pub const fn bytes(self) -> usize {
        self.head + self.tail
    }
}

/// One output stream as the host kept it: the whole of it, or its two ends and the count of the
/// bytes between them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Captured {
    head: Vec<u8>,
    omitted: u64,
    /// Empty while nothing is omitted: a complete stream is all head.
    tail: Vec<u8>,
}

impl Captured {
    pub fn complete(bytes: impl Into<Vec<u8>>) -> Captured {
        Captured {
            head: bytes.into(),
            omitted: 0,
            tail: Vec::new(),
        }
    }

    pub fn is_complete(&self) -> bool {
        self.omitted == 0
    }

    pub fn is_empty(&self) -> bool {
        self.total() == 0
    }

    /// How many bytes the stream carried.
    pub fn total(&self) -> u64 {
        self.head.len() as u64 + self.omitted + self.tail.len() as u64
    }

    /// How many bytes between head and tail the host counted but did not keep.
    pub fn omitted(&self) -> u64 {
        self.omitted
    }

    pub fn head(&self) -> &[u8] {
        &self.head
    }

    pub fn tail(&self) -> &[u8] {
        &self.tail
    }

    /// The stream's bytes when nothing was left out.
    pub fn whole(&self) -> Option<&[u8]> {
        self.is_complete().then_some(self.head.as_slice())
    }

    pub fn into_whole(self) -> Result<Vec<u8>, Captured> {
        if self.is_complete() {
            Ok(self.head)
        } else {
            Err(self)
        }
    }

    /// The stream as text: whole, or its head and tail with a line between them that says how
    /// many bytes of `stream` were left out.
    pub fn marked_text(&self, stream: &str) -> String {
        let mut text = String::from_utf8_lossy(&self.head).into_owned();
        if !self.is_complete() {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!(
                "[... {} of {} bytes of {stream} left out ...]\n",
                self.omitted,
                self.total()
            ));
            text.push_str(&String::from_utf8_lossy(&self.tail));
        }
        text
    }
}

/// Takes a stream chunk by chunk and keeps only what its [`StreamCap`] allows, so that memory is
/// bounded by the cap however long the stream runs.
#[derive(Debug, Clone)]
pub struct HeadTail {
    cap: StreamCap,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    omitted: u64,
}

impl HeadTail {
    pub fn new(cap: StreamCap) -> HeadTail {
        HeadTail {
            cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            omitted: 0,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        let room = self.cap.head - self.head.len();
        let (into_head, rest) = chunk.split_at(room.min(chunk.len()));
        self.head.extend_from_slice(into_head);
        if rest.is_empty() {
            return;
        }
        let limit = self.cap.tail;
        if rest.len() >= limit {
            self.omitted += (self.tail.len() + rest.len() - limit) as u64;
            self.tail.clear();
            self.tail.extend(&rest[rest.len() - limit..]);
            return;
        }
        let overflow = (self.tail.len() + rest.len()).saturating_sub(limit);
        self.tail.drain(..overflow);
        self.omitted += overflow as u64;
        self.tail.extend(rest);
    }

    /// How many bytes have been pushed.
    pub fn total(&self) -> u64 {
        self.head.len() as u64 + self.omitted + self.tail.len() as u64
    }

    pub fn finish(self) -> Captured {
        let HeadTail {
            mut head,
            tail,
            omitted,
            ..
        } = self;
        if omitted == 0 {
            head.extend(tail);
            return Captured::complete(head);
        }
        Captured {
            head,
            omitted,
            tail: tail.into(),
        }
    }
}

/// The guest files a command's two streams are written to, whole, as it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptFiles {
    pub stdout: String,
    pub stderr: String,
}

impl KeptFiles {
    /// `<FULL_OUTPUT_DIR>/<id>.out` and `.err`.
    pub fn for_id(id: &str) -> KeptFiles {
        KeptFiles {
            stdout: format!("{FULL_OUTPUT_DIR}/{id}.out"),
            stderr: format!("{FULL_OUTPUT_DIR}/{id}.err"),
        }
    }
}

/// Room [`streams_for_model`] leaves for its line about what was left out and for a line the
/// caller adds about how the command ended.
const MARK_ROOM: usize = 600;

/// A command's stdout followed by its stderr, as the model sees it: whole when both streams are
/// complete and fit in `limit` characters; otherwise the beginning and end of the two together,
/// at most `limit - 600` bytes, with a line between them saying how many bytes were left out
/// and which guest files hold the whole of each stream.
pub fn streams_for_model(
    stdout: &Captured,
    stderr: &Captured,
    limit: usize,
    kept: &KeptFiles,
) -> String {
    let complete = stdout.is_complete() && stderr.is_complete();
    if complete {
        let mut text = String::from_utf8_lossy(stdout.head()).into_owned();
        text.push_str(&String::from_utf8_lossy(stderr.head()));
        if text.chars().count() <= limit {
            return text;
        }
    }
    let known = [
        (stdout.head(), stdout.omitted()),
        (stdout.tail(), 0),
        (stderr.head(), stderr.omitted()),
        (stderr.tail(), 0),
    ];
    let mut front = Vec::new();
    for (bytes, gap) in known {
        front.extend_from_slice(bytes);
        if gap > 0 {
            break;
        }
    }
    let mut back_parts = Vec::new();
    for index in (0..known.len()).rev() {
        if index + 1 < known.len() && known[index].1 > 0 {
            break;
        }
        back_parts.push(known[index].0);
    }
    let back: Vec<u8> = back_parts.into_iter().rev().flatten().copied().collect();
    let budget = limit.saturating_sub(MARK_ROOM);
    let head_end = char_start_at_or_before(&front, (budget / 2).min(front.len()));
    let tail_start =
        char_start_at_or_after(&back, back.len() - (budget - budget / 2).min(back.len()));
    let (head, tail) = (&front[..head_end], &back[tail_start..]);
    let total = stdout.total() + stderr.total();
    let left_out = total - head.len() as u64 - tail.len() as u64;
    let whole_in = if stderr.is_empty() {
        kept.stdout.clone()
    } else if stdout.is_empty() {
        kept.stderr.clone()
    } else {
        format!("{} (stdout) and {} (stderr)", kept.stdout, kept.stderr)
    };
    format!(
        "{}\n[... {left_out} of {total} bytes left out; the whole output is in {whole_in} ...]\n{}",
        String::from_utf8_lossy(head),
        String::from_utf8_lossy(tail)
    )
}

fn is_continuation(byte: u8) -> bool {
    byte & 0b1100_0000 == 0b1000_0000
}

fn char_start_at_or_before(bytes: &[u8], mut index: usize) -> usize {
    while index > 0 && index < bytes.len() && is_continuation(bytes[index]) {
        index -= 1;
    }
    index
}

fn char_start_at_or_after(bytes: &[u8], mut index: usize) -> usize {
    while index < bytes.len() && is_continuation(bytes[index]) {
        index += 1;
    }
    index
}

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

    fn captured(cap: StreamCap, chunks: &[&[u8]]) -> Captured {
        let mut stream = HeadTail::new(cap);
        for chunk in chunks {
            stream.push(chunk);
        }
        stream.finish()
    }

    #[test]
    fn a_stream_within_the_cap_is_kept_whole() {
        let cap = StreamCap { head: 4, tail: 3 };
        for chunks in [
            &[][..],
            &[b"abc".as_slice()],
            &[b"abcd", b"efg"],
            &[b"a", b"bcdefg"],
        ] {
            let kept = captured(cap, chunks);
            let whole: Vec<u8> = chunks.concat();
            assert_eq!(kept.whole(), Some(whole.as_slice()), "{chunks:?}");
            assert_eq!(kept.total(), whole.len() as u64);
            assert!(kept.tail().is_empty());
        }
    }

    #[test]
    fn a_longer_stream_keeps_its_ends_and_counts_the_middle_however_it_is_chunked() {
        let cap = StreamCap { head: 4, tail: 3 };
        let stream = b"abcdefghijklmnopqrstuvwxyz";
        let splits: Vec<Vec<&[u8]>> = vec![
            vec![stream],
            stream.chunks(1).collect(),
            stream.chunks(2).collect(),
            stream.chunks(5).collect(),
            vec![&stream[..3], &stream[3..24], &stream[24..]],
        ];
        for chunks in splits {
            let kept = captured(cap, &chunks);
            assert_eq!(kept.head(), b"abcd", "{chunks:?}");
            assert_eq!(kept.tail(), b"xyz", "{chunks:?}");
            assert_eq!(kept.omitted(), 19);
            assert_eq!(kept.total(), 26);
            assert_eq!(kept.whole(), None);
        }
    }

    #[test]
    fn memory_stays_within_the_cap_while_the_stream_runs() {
        let cap = StreamCap {
            head: 1000,
            tail: 500,
        };
        let mut stream = HeadTail::new(cap);
        let chunk = vec![b'y'; 4096];
        for _ in 0..10_000 {
            stream.push(&chunk);
            assert!(stream.head.len() + stream.tail.len() <= cap.bytes());
        }
        assert_eq!(stream.total(), 4096 * 10_000);
        assert_eq!(stream.finish().omitted(), 4096 * 10_000 - 1500);
    }

    #[test]
    fn a_whole_cap_keeps_no_tail_and_says_the_stream_was_cut() {
        let kept = captured(StreamCap::whole(5), &[b"0123456789"]);
        assert_eq!(kept.head(), b"01234");
        assert!(kept.tail().is_empty());
        assert_eq!(kept.omitted(), 5);
        assert!(kept.into_whole().is_err());
        assert_eq!(
            captured(StreamCap::whole(5), &[b"01234"]).into_whole(),
            Ok(b"01234".to_vec())
        );
    }

    #[test]
    fn marked_text_says_how_much_of_which_stream_was_left_out() {
        let kept = captured(StreamCap { head: 3, tail: 3 }, &[b"abc-middle-xyz"]);
        assert_eq!(
            kept.marked_text("stdout"),
            "abc\n[... 8 of 14 bytes of stdout left out ...]\nxyz"
        );
        assert_eq!(Captured::complete("all").marked_text("stdout"), "all");
    }

    fn files() -> KeptFiles {
        KeptFiles::for_id("ID")
    }

    #[test]
    fn short_complete_streams_reach_the_model_whole_stdout_first() {
        let text = streams_for_model(
            &Captured::complete("out\n"),
            &Captured::complete("err\n"),
            100,
            &files(),
        );
        assert_eq!(text, "out\nerr\n");
    }

    #[test]
    fn a_flooded_stream_reaches_the_model_as_head_tail_and_the_omitted_count() {
        let cap = StreamCap {
            head: 5000,
            tail: 5000,
        };
        let mut stream = HeadTail::new(cap);
        stream.push(b"BEGIN");
        for _ in 0..1000 {
            stream.push(&[b'y'; 1000]);
        }
        stream.push(b"END");
        let stdout = stream.finish();
        let text = streams_for_model(&stdout, &Captured::default(), 1600, &files());
        let total = 5 + 1_000_000 + 3;
        assert!(text.starts_with("BEGINyyy"), "{text}");
        assert!(text.ends_with("yyyEND"), "{text}");
        assert!(text.chars().count() <= 1600, "{}", text.len());
        let shown = text.len() - text.lines().nth(1).unwrap().len() - 2;
        assert!(
            text.contains(&format!(
                "[... {} of {total} bytes left out; the whole output is in /var/tmp/perch/ID.out ...]",
                total - shown
            )),
            "{text}"
        );
    }

    #[test]
    fn both_streams_cut_show_the_start_of_stdout_and_the_end_of_stderr() {
        let cap = StreamCap {
            head: 2000,
            tail: 2000,
        };
        let flood = |first: u8, last: &[u8]| {
            let mut stream = HeadTail::new(cap);
            stream.push(&[first; 10_000]);
            stream.push(last);
            stream.finish()
        };
        let text = streams_for_model(&flood(b'o', b"!"), &flood(b'e', b"?"), 1600, &files());
        assert!(text.starts_with("oooo"), "{text}");
        assert!(text.ends_with("eee?"), "{text}");
        assert!(
            text.contains(
                "the whole output is in /var/tmp/perch/ID.out (stdout) and /var/tmp/perch/ID.err (stderr)"
            ),
            "{text}"
        );
        assert!(text.contains("of 20002 bytes left out"), "{text}");
    }

    #[test]
    fn a_short_stdout_and_a_cut_stderr_keep_stdout_in_the_head() {
        let mut stderr = HeadTail::new(StreamCap {
            head: 10,
            tail: 2000,
        });
        stderr.push(&[b'e'; 50_000]);
        let text = streams_for_model(
            &Captured::complete("result\n"),
            &stderr.finish(),
            1600,
            &files(),
        );
        assert!(text.starts_with("result\neeeeeeeeee\n[... "), "{text}");
        assert!(text.ends_with("eee"), "{text}");
    }

    #[test]
    fn complete_but_long_text_is_cut_on_character_boundaries() {
        let long = "é".repeat(5000);
        let text = streams_for_model(
            &Captured::complete(long),
            &Captured::default(),
            1600,
            &files(),
        );
        assert!(text.starts_with("éé") && text.ends_with("éé"), "{text}");
        assert!(!text.contains('\u{fffd}'), "no character was split");
        assert!(text.contains("of 10000 bytes left out"), "{text}");
        assert!(text.chars().count() <= 1600);
    }
}
