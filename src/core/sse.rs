//! Server-sent events: an incremental parser fed the bytes of a response as they arrive.
//!
//! It follows the WHATWG event-stream rules: lines end in CRLF, LF or CR; a line starting with
//! `:` is a comment; `data:` lines of one event are joined with `\n`; one space after the colon
//! is dropped; a blank line ends the event, and an event without data is not dispatched. A chunk
//! may end anywhere, even between the CR and LF of one line ending or inside a UTF-8 character.
//! An event still open when the stream ends is incomplete and never yielded.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when the event had one.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
    /// The last `id:` field seen so far in the stream.
    pub id: Option<String>,
}

/// The parser's state between chunks.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    after_cr: bool,
    started: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
    id: Option<String>,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

impl SseParser {
    pub fn new() -> SseParser {
        SseParser::default()
    }

    /// Feeds the next chunk of the stream; returns the events it completed, in order.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        for &byte in chunk {
            if self.after_cr {
                self.after_cr = false;
                if byte == b'\n' {
                    continue;
                }
            }
            match byte {
                b'\r' => {
                    self.after_cr = true;
                    self.end_line(&mut events);
                }
                b'\n' => self.end_line(&mut events),
                _ => self.line.push(byte),
            }
        }
        events
    }

    /// Whether an event has begun that a blank line has not yet ended (bytes since the last
    /// dispatch that the end of the stream would throw away).
    pub fn has_partial_event(&self) -> bool {
        self.has_data || self.event.is_some() || !self.line.is_empty()
    }

    fn end_line(&mut self, events: &mut Vec<SseEvent>) {
        let mut line = std::mem::take(&mut self.line);
        if !self.started {
            self.started = true;
            if line.starts_with(BOM) {
                line.drain(..BOM.len());
            }
        }
        if line.is_empty() {
            self.dispatch(events);
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match line.iter().position(|&byte| byte == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (&line[..], &[][..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&value);
                self.has_data = true;
            }
            b"event" => self.event = Some(value.into_owned()),
            b"id" if !value.contains('\0') => self.id = Some(value.into_owned()),
            _ => {}
        }
    }

    fn dispatch(&mut self, events: &mut Vec<SseEvent>) {
        let event = self.event.take();
        if !std::mem::take(&mut self.has_data) {
            return;
        }
        events.push(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
            id: self.id.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: name.map(str::to_owned),
            data: data.to_owned(),
            id: None,
        }
    }

    fn parse_whole(stream: &[u8]) -> Vec<SseEvent> {
        SseParser::new().feed(stream)
    }

    #[test]
    fn events_with_and_without_names() {
        let stream = b"event: message_start\ndata: {\"a\":1}\n\ndata: [DONE]\n\n";
        assert_eq!(
            parse_whole(stream),
            vec![
                event(Some("message_start"), "{\"a\":1}"),
                event(None, "[DONE]")
            ]
        );
    }

    #[test]
    fn crlf_cr_and_lf_all_end_lines() {
        let stream = b"event: a\r\ndata: 1\r\n\r\nevent: b\rdata: 2\r\rdata: 3\n\n";
        assert_eq!(
            parse_whole(stream),
            vec![
                event(Some("a"), "1"),
                event(Some("b"), "2"),
                event(None, "3")
            ]
        );
    }

    #[test]
    fn multi_line_data_is_joined_with_newlines() {
        let stream = b"data: first\ndata:second\ndata:  third\ndata\n\n";
        assert_eq!(
            parse_whole(stream),
            vec![event(None, "first\nsecond\n third\n")]
        );
    }

    #[test]
    fn comments_and_unknown_fields_are_ignored() {
        let stream = b": keep-alive\n\nretry: 100\nfoo: bar\ndata: x\n: inside\n\n";
        assert_eq!(parse_whole(stream), vec![event(None, "x")]);
    }

    #[test]
    fn an_event_without_data_is_not_dispatched() {
        let stream = b"event: ping\n\ndata: after\n\n";
        assert_eq!(parse_whole(stream), vec![event(None, "after")]);
    }

    #[test]
    fn ids_carry_over_to_later_events() {
        let stream = b"id: 7\ndata: a\n\ndata: b\n\n";
        let events = parse_whole(stream);
        assert_eq!(events[0].id.as_deref(), Some("7"));
        assert_eq!(events[1].id.as_deref(), Some("7"));
    }

    #[test]
    fn a_leading_byte_order_mark_is_dropped() {
        let stream = b"\xEF\xBB\xBFdata: x\n\n";
        assert_eq!(parse_whole(stream), vec![event(None, "x")]);
    }

    #[test]
    fn an_unfinished_event_at_the_end_is_held_back() {
        let mut parser = SseParser::new();
        assert_eq!(
            parser.feed(b"data: whole\n\ndata: cut"),
            vec![event(None, "whole")]
        );
        assert!(parser.has_partial_event());
        let mut fresh = SseParser::new();
        fresh.feed(b"data: whole\n\n");
        assert!(!fresh.has_partial_event());
    }

    #[test]
    fn chunk_boundaries_anywhere_give_the_same_events() {
        let stream = "event: content_block_delta\r\ndata: {\"text\":\"héllo wörld ✓\"}\r\n\r\n: ping\r\nevent: b\rdata: 1\rdata: 2\r\r\ndata: [DONE]\n\n"
            .as_bytes();
        let expected = parse_whole(stream);
        assert_eq!(expected.len(), 3);
        assert_eq!(expected[0].data, "{\"text\":\"héllo wörld ✓\"}");
        assert_eq!(expected[1], event(Some("b"), "1\n2"));
        for split in 0..=stream.len() {
            let mut parser = SseParser::new();
            let mut events = parser.feed(&stream[..split]);
            events.extend(parser.feed(&stream[split..]));
            assert_eq!(events, expected, "split at {split}");
        }
        let mut parser = SseParser::new();
        let events: Vec<SseEvent> = stream
            .iter()
            .flat_map(|byte| parser.feed(std::slice::from_ref(byte)))
            .collect();
        assert_eq!(events, expected);
    }
}
