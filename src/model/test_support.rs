//! Shared fixtures for the wire APIs' unit tests.

use super::draft::Decoder;
use super::{
    Endpoint, ModelErrorKind, ModelReply, ModelRequest, StopReason, StreamEvent, ToolSpec, Usage,
};
use perch_core::config::{Api, ModelSpec, Thinking};
use perch_core::log::{Message, Part, Role};
use perch_core::sse::SseEvent;
use serde_json::{Value, json};
use std::time::Duration;

pub(crate) fn endpoint(api: Api, reasoning: bool) -> Endpoint {
    Endpoint {
        provider: "test".into(),
        api,
        base_url: "http://127.0.0.1:9/v1".into(),
        api_key: None,
        model: ModelSpec {
            id: "test-model".into(),
            context_window: 128_000,
            max_tokens: 4096,
            reasoning,
            price: None,
        },
        timeout: Duration::from_secs(5),
    }
}

pub(crate) fn request(messages: Vec<Message>) -> ModelRequest {
    ModelRequest {
        system: "Be brief.".into(),
        messages,
        tools: Vec::new(),
        thinking: Thinking::Off,
    }
}

/// [`history`] asked with `thinking`, offering one tool, `bash`, whose arguments `parameters`
/// describes.
pub(crate) fn request_with_bash(parameters: Value, thinking: Thinking) -> ModelRequest {
    let mut request = request(history());
    request.tools = vec![ToolSpec {
        name: "bash".into(),
        description: "Run a command".into(),
        parameters,
    }];
    request.thinking = thinking;
    request
}

pub(crate) fn text(text: &str) -> Part {
    Part::Text { text: text.into() }
}

pub(crate) fn reasoning_part(text: &str, signature: Option<&str>) -> Part {
    Part::Reasoning {
        text: text.into(),
        signature: signature.map(str::to_owned),
    }
}

pub(crate) fn tool_call(call_id: &str, name: &str, arguments: Value) -> Part {
    Part::ToolCall {
        call_id: call_id.into(),
        name: name.into(),
        arguments,
    }
}

pub(crate) fn usage(input: u64, output: u64, cached: u64) -> Usage {
    Usage {
        input,
        output,
        cached,
    }
}

/// A user asks, the assistant thinks and calls two tools, both answer (one with an error), the
/// assistant replies, the user thanks it.
pub(crate) fn history() -> Vec<Message> {
    vec![
        Message::new(Role::User, vec![text("list files")]),
        Message::new(
            Role::Assistant,
            vec![
                reasoning_part("I should look.", None),
                text("Looking."),
                tool_call("call_1", "bash", json!({"cmd": "ls"})),
                tool_call("call_2", "bash", json!({"cmd": "pwd"})),
            ],
        ),
        Message::new(
            Role::Tool,
            vec![
                Part::ToolResult {
                    call_id: "call_1".into(),
                    output: "a.txt".into(),
                    is_error: false,
                },
                Part::ToolResult {
                    call_id: "call_2".into(),
                    output: "no such dir".into(),
                    is_error: true,
                },
            ],
        ),
        Message::new(
            Role::Assistant,
            vec![reasoning_part("Answer now.", None), text("Done.")],
        ),
        Message::new(Role::User, vec![text("thanks")]),
    ]
}

/// Feeds `events` to `decoder` and asserts they end in a reply of `parts` that stops for tool
/// use, having used `usage`; returns what was displayed.
pub(crate) fn assert_tool_use(
    decoder: &mut dyn Decoder,
    events: &[String],
    parts: Vec<Part>,
    usage: Usage,
) -> Vec<StreamEvent> {
    let (reply, out) = feed(decoder, events).expect("the events decode");
    let reply = reply.expect("the events end in a reply");
    assert_eq!(reply.parts, parts);
    assert_eq!(reply.stop, StopReason::ToolUse);
    assert_eq!(reply.usage, usage);
    out
}

/// Feeds each data string as one event; stops at the first reply or error.
pub(crate) fn feed(
    decoder: &mut dyn Decoder,
    data: &[String],
) -> Result<(Option<ModelReply>, Vec<StreamEvent>), ModelErrorKind> {
    let mut out = Vec::new();
    for data in data {
        let event = SseEvent {
            event: None,
            data: data.clone(),
            id: None,
        };
        if let Some(reply) = decoder.event(&event, &mut out)? {
            return Ok((Some(reply), out));
        }
    }
    Ok((None, out))
}
