//! What every wire API shares once its events are decoded: a reply being put together from
//! deltas, and the mapping from an API's error names to [`ModelErrorKind`]. Pure; no I/O.

use super::http::excerpt;
use super::{ModelErrorKind, ModelReply, StopReason, StreamEvent, Usage};
use perch_core::log::Part;
use perch_core::sse::SseEvent;

/// What a [`Decoder`] makes of an event: the reply once the event that ends the stream has come.
pub(crate) type Decoded = Result<Option<ModelReply>, ModelErrorKind>;

/// Turns one API's events into a reply.
pub(crate) trait Decoder: Send {
    /// Takes the next event, pushing what should be displayed onto `out`.
    fn event(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Decoded;
}

/// A reply under construction, in the order its parts arrived.
#[derive(Debug, Default)]
pub(crate) struct Draft {
    parts: Vec<DraftPart>,
    pub(crate) usage: Usage,
}

#[derive(Debug)]
enum DraftPart {
    Text(String),
    Reasoning {
        text: String,
        signature: Option<String>,
    },
    Call(DraftCall),
}

#[derive(Debug)]
struct DraftCall {
    call_id: String,
    name: String,
    arguments: String,
    announced: bool,
}

/// Which tool call of a [`Draft`] a later delta belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallSlot(usize);

impl Draft {
    pub(crate) fn text(&mut self, delta: &str, out: &mut Vec<StreamEvent>) {
        if delta.is_empty() {
            return;
        }
        match self.parts.last_mut() {
            Some(DraftPart::Text(text)) => text.push_str(delta),
            _ => self.parts.push(DraftPart::Text(delta.to_owned())),
        }
        out.push(StreamEvent::Text(delta.to_owned()));
    }

    pub(crate) fn reasoning(&mut self, delta: &str, out: &mut Vec<StreamEvent>) {
        if delta.is_empty() {
            return;
        }
        match self.parts.last_mut() {
            Some(DraftPart::Reasoning { text, .. }) => text.push_str(delta),
            _ => self.parts.push(DraftPart::Reasoning {
                text: delta.to_owned(),
                signature: None,
            }),
        }
        out.push(StreamEvent::Reasoning(delta.to_owned()));
    }

    /// Begins a reasoning block of its own (a signed block is never merged with another).
    pub(crate) fn begin_reasoning(&mut self) {
        self.parts.push(DraftPart::Reasoning {
            text: String::new(),
            signature: None,
        });
    }

    /// Adds to the signature of the reasoning block in progress.
    pub(crate) fn sign(&mut self, delta: &str) {
        if let Some(DraftPart::Reasoning { signature, .. }) = self.parts.last_mut() {
            signature.get_or_insert_with(String::new).push_str(delta);
        }
    }

    /// Begins a tool call; it is announced on `out` as soon as both its id and name are known.
    pub(crate) fn start_call(
        &mut self,
        call_id: &str,
        name: &str,
        out: &mut Vec<StreamEvent>,
    ) -> CallSlot {
        self.parts.push(DraftPart::Call(DraftCall {
            call_id: call_id.to_owned(),
            name: name.to_owned(),
            arguments: String::new(),
            announced: false,
        }));
        let slot = CallSlot(self.parts.len() - 1);
        self.announce(slot, out);
        slot
    }

    /// Fills in an id or name that the call's first delta did not carry.
    pub(crate) fn complete_call(
        &mut self,
        slot: CallSlot,
        call_id: Option<&str>,
        name: Option<&str>,
        out: &mut Vec<StreamEvent>,
    ) {
        if let Some(call) = self.call(slot) {
            if let Some(call_id) = call_id.filter(|id| !id.is_empty())
                && call.call_id.is_empty()
            {
                call.call_id = call_id.to_owned();
            }
            if let Some(name) = name.filter(|name| !name.is_empty())
                && call.name.is_empty()
            {
                call.name = name.to_owned();
            }
        }
        self.announce(slot, out);
    }

    pub(crate) fn call_arguments(&mut self, slot: CallSlot, delta: &str) {
        if let Some(call) = self.call(slot) {
            call.arguments.push_str(delta);
        }
    }

    /// Replaces the arguments streamed so far with the whole text the API sent at the end.
    pub(crate) fn set_call_arguments(&mut self, slot: CallSlot, arguments: &str) {
        if let Some(call) = self.call(slot) {
            call.arguments = arguments.to_owned();
        }
    }

    fn call(&mut self, slot: CallSlot) -> Option<&mut DraftCall> {
        match self.parts.get_mut(slot.0) {
            Some(DraftPart::Call(call)) => Some(call),
            _ => None,
        }
    }

    fn announce(&mut self, slot: CallSlot, out: &mut Vec<StreamEvent>) {
        if let Some(call) = self.call(slot)
            && !call.announced
            && !call.call_id.is_empty()
            && !call.name.is_empty()
        {
            call.announced = true;
            out.push(StreamEvent::ToolCall {
                call_id: call.call_id.clone(),
                name: call.name.clone(),
            });
        }
    }

    /// The finished reply. Tool call arguments must be JSON (empty means `{}`), or the reply is
    /// [`ModelErrorKind::Garbage`]; a reply cut off by the token limit drops the calls it could
    /// not finish instead. A reply with tool calls stops for them whatever the API said.
    pub(crate) fn finish(self, stop: StopReason) -> Result<ModelReply, ModelErrorKind> {
        let truncated = stop == StopReason::MaxTokens;
        let mut parts = Vec::with_capacity(self.parts.len());
        let mut calls = 0;
        for part in self.parts {
            match part {
                DraftPart::Text(text) => parts.push(Part::Text { text }),
                DraftPart::Reasoning { text, signature } => {
                    if !text.is_empty() || signature.is_some() {
                        parts.push(Part::Reasoning { text, signature });
                    }
                }
                DraftPart::Call(call) => {
                    let arguments = if call.arguments.trim().is_empty() {
                        Ok(serde_json::json!({}))
                    } else {
                        serde_json::from_str::<serde_json::Value>(&call.arguments)
                    };
                    let complete = !call.call_id.is_empty() && !call.name.is_empty();
                    match arguments {
                        Ok(arguments) if complete => {
                            calls += 1;
                            parts.push(Part::ToolCall {
                                call_id: call.call_id,
                                name: call.name,
                                arguments,
                            });
                        }
                        _ if truncated => {}
                        Ok(_) => {
                            return Err(ModelErrorKind::Garbage {
                                detail: format!(
                                    "a tool call without {} (call id {:?}, name {:?})",
                                    if call.call_id.is_empty() {
                                        "an id"
                                    } else {
                                        "a name"
                                    },
                                    call.call_id,
                                    call.name
                                ),
                            });
                        }
                        Err(error) => {
                            return Err(ModelErrorKind::Garbage {
                                detail: format!(
                                    "the arguments of tool call {} ({}) are not JSON: {error}",
                                    call.call_id, call.name
                                ),
                            });
                        }
                    }
                }
            }
        }
        let stop = match stop {
            StopReason::End if calls > 0 => StopReason::ToolUse,
            stop => stop,
        };
        Ok(ModelReply {
            parts,
            usage: self.usage,
            stop,
        })
    }
}

/// Parses an event's data as JSON, or says the stream is garbage.
pub(crate) fn json(event: &SseEvent) -> Result<serde_json::Value, ModelErrorKind> {
    serde_json::from_str(&event.data).map_err(|error| ModelErrorKind::Garbage {
        detail: format!("an event is not JSON ({error}): {}", excerpt(&event.data)),
    })
}

/// An event of a stream of named events: its JSON data, and its type (the data's `type`, else
/// the event's name).
pub(crate) fn typed(event: &SseEvent) -> Result<(serde_json::Value, String), ModelErrorKind> {
    let data = json(event)?;
    let kind = str_at(&data, "/type")
        .or(event.event.as_deref())
        .unwrap_or("")
        .to_owned();
    Ok((data, kind))
}

pub(crate) fn str_at<'v>(value: &'v serde_json::Value, pointer: &str) -> Option<&'v str> {
    value.pointer(pointer).and_then(serde_json::Value::as_str)
}

pub(crate) fn u64_at(value: &serde_json::Value, pointer: &str) -> u64 {
    value
        .pointer(pointer)
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0)
}

/// The kind of an error the API reported inside a stream that began well, from its type or code
/// (OpenAI's `rate_limit_exceeded`, `server_error`; Anthropic's `overloaded_error`, ...).
pub(crate) fn stream_error(code: &str, message: &str) -> ModelErrorKind {
    let message = if message.is_empty() {
        code.to_owned()
    } else {
        excerpt(&format!("{message} ({code})"))
    };
    let rejected = |status| ModelErrorKind::Rejected {
        status,
        message: message.clone(),
    };
    match code {
        "rate_limit_error" | "rate_limit_exceeded" | "rate_limit" => {
            ModelErrorKind::RateLimited { retry_after: None }
        }
        "overloaded_error" => ModelErrorKind::Server {
            status: 529,
            message,
        },
        "invalid_request_error"
        | "invalid_prompt"
        | "context_length_exceeded"
        | "invalid_api_key"
        | "request_too_large" => rejected(400),
        "authentication_error" => rejected(401),
        "permission_error" => rejected(403),
        "not_found_error" | "model_not_found" => rejected(404),
        "billing_error" => ModelErrorKind::OutOfCredit {
            status: 402,
            message,
        },
        "insufficient_quota" => ModelErrorKind::OutOfCredit {
            status: 429,
            message,
        },
        _ => ModelErrorKind::Server {
            status: 500,
            message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deltas_of_one_kind_join_and_kinds_alternate_in_order() {
        let mut out = Vec::new();
        let mut draft = Draft::default();
        draft.reasoning("think", &mut out);
        draft.reasoning("ing", &mut out);
        draft.text("", &mut out);
        draft.text("Hel", &mut out);
        draft.text("lo", &mut out);
        let slot = draft.start_call("c1", "bash", &mut out);
        draft.call_arguments(slot, "{\"cmd\":");
        draft.call_arguments(slot, "\"ls\"}");
        draft.text("after", &mut out);
        let reply = draft.finish(StopReason::End).unwrap();
        assert_eq!(
            reply.parts,
            vec![
                Part::Reasoning {
                    text: "thinking".into(),
                    signature: None,
                },
                Part::Text {
                    text: "Hello".into()
                },
                Part::ToolCall {
                    call_id: "c1".into(),
                    name: "bash".into(),
                    arguments: json!({"cmd": "ls"})
                },
                Part::Text {
                    text: "after".into()
                },
            ]
        );
        assert_eq!(reply.stop, StopReason::ToolUse);
        assert_eq!(
            out,
            vec![
                StreamEvent::Reasoning("think".into()),
                StreamEvent::Reasoning("ing".into()),
                StreamEvent::Text("Hel".into()),
                StreamEvent::Text("lo".into()),
                StreamEvent::ToolCall {
                    call_id: "c1".into(),
                    name: "bash".into()
                },
                StreamEvent::Text("after".into()),
            ]
        );
    }

    #[test]
    fn a_call_is_announced_once_its_id_and_name_are_known() {
        let mut out = Vec::new();
        let mut draft = Draft::default();
        let slot = draft.start_call("", "", &mut out);
        assert!(out.is_empty());
        draft.complete_call(slot, Some("c1"), None, &mut out);
        assert!(out.is_empty());
        draft.complete_call(slot, None, Some("read"), &mut out);
        draft.complete_call(slot, Some("c2"), Some("other"), &mut out);
        assert_eq!(
            out,
            vec![StreamEvent::ToolCall {
                call_id: "c1".into(),
                name: "read".into()
            }]
        );
        let reply = draft.finish(StopReason::ToolUse).unwrap();
        assert_eq!(
            reply.parts,
            vec![Part::ToolCall {
                call_id: "c1".into(),
                name: "read".into(),
                arguments: json!({})
            }]
        );
    }

    #[test]
    fn arguments_that_are_not_json_are_garbage() {
        let mut out = Vec::new();
        let mut draft = Draft::default();
        let slot = draft.start_call("c1", "bash", &mut out);
        draft.call_arguments(slot, "{\"cmd\": \"ls");
        let error = draft.finish(StopReason::ToolUse).unwrap_err();
        assert!(matches!(error, ModelErrorKind::Garbage { .. }), "{error:?}");
    }

    #[test]
    fn a_reply_cut_by_the_token_limit_drops_its_unfinished_call() {
        let mut out = Vec::new();
        let mut draft = Draft::default();
        draft.text("Let me look", &mut out);
        let slot = draft.start_call("c1", "bash", &mut out);
        draft.call_arguments(slot, "{\"cmd\": \"ls");
        let reply = draft.finish(StopReason::MaxTokens).unwrap();
        assert_eq!(
            reply.parts,
            vec![Part::Text {
                text: "Let me look".into()
            }]
        );
        assert_eq!(reply.stop, StopReason::MaxTokens);
    }

    #[test]
    fn error_codes_map_to_kinds() {
        assert_eq!(
            stream_error("rate_limit_exceeded", "slow down"),
            ModelErrorKind::RateLimited { retry_after: None }
        );
        assert_eq!(
            stream_error("overloaded_error", "Overloaded"),
            ModelErrorKind::Server {
                status: 529,
                message: "Overloaded (overloaded_error)".into()
            }
        );
        assert!(matches!(
            stream_error("insufficient_quota", "quota"),
            ModelErrorKind::OutOfCredit { status: 429, .. }
        ));
        assert!(matches!(
            stream_error("billing_error", "pay up"),
            ModelErrorKind::OutOfCredit { status: 402, .. }
        ));
        assert!(matches!(
            stream_error("server_error", "oops"),
            ModelErrorKind::Server { status: 500, .. }
        ));
    }
}
