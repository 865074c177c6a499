//! Anthropic's Messages API (`POST {baseUrl}/messages`).
//!
//! The stream is named events: `message_start` (input usage), then per content block
//! `content_block_start` (text, thinking or tool_use), `content_block_delta` (`text_delta`,
//! `thinking_delta`, `input_json_delta`, `signature_delta`) and `content_block_stop`, then
//! `message_delta` (stop reason, output usage) and `message_stop`, which ends the reply; `ping`
//! may come anywhere and `error` ends the stream with an error.
//!
//! A thinking block is kept with the signature it was streamed with (`signature_delta`), and sent
//! back, signed, when the request has thinking on. The API demands that signed block at the
//! start of an assistant turn that is still running tools, so a request that continues such a
//! turn (its last message holds tool results) has thinking on only if that turn's reply began
//! with a signed block; otherwise (a redacted block, a reply from before signatures were kept) it
//! goes without `thinking`, and thinking applies again from the next user message.

use super::body::{set_system, set_tools};
use super::draft::{CallSlot, Decoded, Decoder, Draft, str_at, stream_error, typed, u64_at};
use super::{Endpoint, ModelErrorKind, ModelRequest, StopReason, StreamEvent};
use perch_core::config::Thinking;
use perch_core::log::{Message, Part, Role};
use perch_core::sse::SseEvent;
use serde_json::{Value, json};
use std::collections::HashMap;

pub(crate) const PATH: &str = "/messages";

/// The fewest thinking tokens the API accepts, and the fewest left for the answer.
const MIN_BUDGET: u32 = 1024;

/// The request body.
pub(crate) fn body(endpoint: &Endpoint, request: &ModelRequest) -> Value {
    let continues_tool_use = request
        .messages
        .last()
        .is_some_and(|message| message.role == Role::Tool);
    let budget = thinking_budget(request.thinking, endpoint.model.max_tokens)
        .filter(|_| endpoint.model.reasoning)
        .filter(|_| !continues_tool_use || last_turn_signed(&request.messages));
    let mut messages: Vec<(&str, Vec<Value>)> = Vec::new();
    for message in &request.messages {
        let (role, blocks) = blocks(message, budget.is_some());
        if blocks.is_empty() {
            continue;
        }
        match messages.last_mut() {
            Some((last, content)) if *last == role => content.extend(blocks),
            _ => messages.push((role, blocks)),
        }
    }
    let messages: Vec<Value> = messages
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    let mut body = json!({
        "model": endpoint.model.id,
        "max_tokens": endpoint.model.max_tokens,
        "stream": true,
        "messages": messages,
    });
    set_system(&mut body, "system", request);
    set_tools(
        &mut body,
        request,
        |tool| json!({"name": tool.name, "description": tool.description, "input_schema": tool.parameters}),
    );
    if let Some(budget) = budget {
        body["thinking"] = json!({"type": "enabled", "budget_tokens": budget});
    }
    body
}

/// Whether the assistant turn the tool results answer began with a signed thinking block.
fn last_turn_signed(messages: &[Message]) -> bool {
    messages
        .iter()
        .rev()
        .find(|message| message.role == Role::Assistant)
        .and_then(|message| message.parts.first())
        .is_some_and(|part| {
            matches!(
                part,
                Part::Reasoning {
                    signature: Some(_),
                    ..
                }
            )
        })
}

/// Tokens the model may think for at each level, kept below `max_tokens` so that the answer
/// has at least [`MIN_BUDGET`] left; `None` when thinking is off or does not fit.
pub(crate) fn thinking_budget(thinking: Thinking, max_tokens: u32) -> Option<u32> {
    let wanted: u32 = match thinking {
        Thinking::Off => return None,
        Thinking::Low => 2048,
        Thinking::Medium => 8192,
        Thinking::High => 16384,
    };
    let budget = wanted.min(max_tokens.saturating_sub(MIN_BUDGET));
    (budget >= MIN_BUDGET).then_some(budget)
}

fn blocks(message: &Message, with_thinking: bool) -> (&'static str, Vec<Value>) {
    let role = match message.role {
        Role::Assistant => "assistant",
        Role::User | Role::Tool => "user",
    };
    let mut blocks = Vec::new();
    for part in &message.parts {
        if let Part::ToolResult {
            call_id,
            output,
            is_error,
        } = part
        {
            let mut block =
                json!({"type": "tool_result", "tool_use_id": call_id, "content": output});
            if *is_error {
                block["is_error"] = json!(true);
            }
            blocks.push(block);
        }
    }
    for part in &message.parts {
        match part {
            Part::Reasoning {
                text,
                signature: Some(signature),
            } if with_thinking && message.role == Role::Assistant => {
                blocks.push(json!({"type": "thinking", "thinking": text, "signature": signature}));
            }
            Part::Text { text } if !text.trim().is_empty() => {
                blocks.push(json!({"type": "text", "text": text}));
            }
            Part::ToolCall {
                call_id,
                name,
                arguments,
            } if message.role == Role::Assistant => {
                let input = if arguments.is_object() {
                    arguments.clone()
                } else {
                    json!({})
                };
                blocks
                    .push(json!({"type": "tool_use", "id": call_id, "name": name, "input": input}));
            }
            _ => {}
        }
    }
    (role, blocks)
}

#[derive(Debug, Clone, Copy)]
enum Block {
    Text,
    Thinking,
    Call(CallSlot),
    Other,
}

/// Assembles a reply from Messages API events.
#[derive(Debug, Default)]
pub(crate) struct AnthropicDecoder {
    draft: Draft,
    blocks: HashMap<u64, Block>,
    stop: Option<StopReason>,
}

impl Decoder for AnthropicDecoder {
    fn event(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Decoded {
        let (data, kind) = typed(event)?;
        let index = data.get("index").and_then(Value::as_u64).unwrap_or(0);
        match kind.as_str() {
            "message_start" => {
                if let Some(usage) = data.pointer("/message/usage") {
                    self.usage(usage);
                }
            }
            "content_block_start" => {
                let block = data.get("content_block").unwrap_or(&Value::Null);
                let started = match str_at(block, "/type") {
                    Some("text") => {
                        self.draft.text(str_at(block, "/text").unwrap_or(""), out);
                        Block::Text
                    }
                    Some("thinking") => {
                        self.draft.begin_reasoning();
                        self.draft
                            .reasoning(str_at(block, "/thinking").unwrap_or(""), out);
                        if let Some(signature) =
                            str_at(block, "/signature").filter(|signature| !signature.is_empty())
                        {
                            self.draft.sign(signature);
                        }
                        Block::Thinking
                    }
                    Some("tool_use") => {
                        let slot = self.draft.start_call(
                            str_at(block, "/id").unwrap_or(""),
                            str_at(block, "/name").unwrap_or(""),
                            out,
                        );
                        if let Some(input) = block
                            .get("input")
                            .and_then(Value::as_object)
                            .filter(|input| !input.is_empty())
                        {
                            self.draft.set_call_arguments(
                                slot,
                                &Value::Object(input.clone()).to_string(),
                            );
                        }
                        Block::Call(slot)
                    }
                    _ => Block::Other,
                };
                self.blocks.insert(index, started);
            }
            "content_block_delta" => {
                let delta = data.get("delta").unwrap_or(&Value::Null);
                let block = self.blocks.get(&index).copied();
                match (str_at(delta, "/type"), block) {
                    (Some("text_delta"), Some(Block::Text)) => {
                        self.draft.text(str_at(delta, "/text").unwrap_or(""), out);
                    }
                    (Some("thinking_delta"), Some(Block::Thinking)) => {
                        self.draft
                            .reasoning(str_at(delta, "/thinking").unwrap_or(""), out);
                    }
                    (Some("signature_delta"), Some(Block::Thinking)) => {
                        self.draft.sign(str_at(delta, "/signature").unwrap_or(""));
                    }
                    (Some("input_json_delta"), Some(Block::Call(slot))) => {
                        self.draft
                            .call_arguments(slot, str_at(delta, "/partial_json").unwrap_or(""));
                    }
                    (Some("text_delta" | "thinking_delta" | "input_json_delta"), _) => {
                        return Err(ModelErrorKind::Garbage {
                            detail: format!(
                                "a delta for content block {index}, which never started as its kind"
                            ),
                        });
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = str_at(&data, "/delta/stop_reason") {
                    self.stop = Some(stop_reason(reason));
                }
                if let Some(usage) = data.get("usage") {
                    self.usage(usage);
                }
            }
            "message_stop" => {
                let Some(stop) = self.stop.take() else {
                    return Err(ModelErrorKind::Garbage {
                        detail: "the message stopped without a stop_reason".into(),
                    });
                };
                return std::mem::take(&mut self.draft).finish(stop).map(Some);
            }
            "error" => {
                return Err(stream_error(
                    str_at(&data, "/error/type").unwrap_or("api_error"),
                    str_at(&data, "/error/message").unwrap_or(""),
                ));
            }
            _ => {}
        }
        Ok(None)
    }
}

impl AnthropicDecoder {
    fn usage(&mut self, usage: &Value) {
        if usage.get("input_tokens").is_some() {
            let read = u64_at(usage, "/cache_read_input_tokens");
            self.draft.usage.input = u64_at(usage, "/input_tokens")
                + u64_at(usage, "/cache_creation_input_tokens")
                + read;
            self.draft.usage.cached = read;
        }
        if usage.get("output_tokens").is_some() {
            self.draft.usage.output = u64_at(usage, "/output_tokens");
        }
    }
}

fn stop_reason(reason: &str) -> StopReason {
    match reason {
        "end_turn" | "stop_sequence" => StopReason::End,
        "tool_use" => StopReason::ToolUse,
        "max_tokens" => StopReason::MaxTokens,
        other => StopReason::Other(other.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{
        assert_tool_use, endpoint, feed, history, reasoning_part, request, request_with_bash, text,
        tool_call, usage,
    };
    use perch_core::config::Api;

    #[test]
    fn the_body_carries_system_blocks_tools_and_thinking() {
        let endpoint = endpoint(Api::AnthropicMessages, true);
        let request = request_with_bash(json!({"type": "object"}), Thinking::Low);
        assert_eq!(
            body(&endpoint, &request),
            json!({
                "model": "test-model",
                "max_tokens": 4096,
                "stream": true,
                "system": "Be brief.",
                "thinking": {"type": "enabled", "budget_tokens": 2048},
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "list files"}]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Looking."},
                        {"type": "tool_use", "id": "call_1", "name": "bash", "input": {"cmd": "ls"}},
                        {"type": "tool_use", "id": "call_2", "name": "bash", "input": {"cmd": "pwd"}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "call_1", "content": "a.txt"},
                        {"type": "tool_result", "tool_use_id": "call_2", "content": "no such dir", "is_error": true},
                    ]},
                    {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
                    {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
                ],
                "tools": [{"name": "bash", "description": "Run a command", "input_schema": {"type": "object"}}],
            })
        );
    }

    #[test]
    fn thinking_stays_below_max_tokens_and_off_mid_tool_use() {
        assert_eq!(thinking_budget(Thinking::Off, 32000), None);
        assert_eq!(thinking_budget(Thinking::Low, 32000), Some(2048));
        assert_eq!(thinking_budget(Thinking::Medium, 32000), Some(8192));
        assert_eq!(thinking_budget(Thinking::High, 32000), Some(16384));
        assert_eq!(thinking_budget(Thinking::High, 4096), Some(3072));
        assert_eq!(thinking_budget(Thinking::Low, 2000), None);

        let reasoning = endpoint(Api::AnthropicMessages, true);
        let plain = endpoint(Api::AnthropicMessages, false);
        let mut request = request(history());
        request.thinking = Thinking::High;
        assert!(body(&reasoning, &request).get("thinking").is_some());
        assert!(body(&plain, &request).get("thinking").is_none());
        request.messages.truncate(3);
        assert_eq!(request.messages.last().unwrap().role, Role::Tool);
        assert!(
            body(&reasoning, &request).get("thinking").is_none(),
            "an unsigned turn cannot continue with thinking on"
        );
    }

    #[test]
    fn a_signed_thinking_block_goes_back_and_keeps_thinking_on_mid_tool_use() {
        let reasoning = endpoint(Api::AnthropicMessages, true);
        let mut request = request(history());
        request.thinking = Thinking::Low;
        request.messages.truncate(3);
        let turn = request
            .messages
            .iter_mut()
            .rev()
            .find(|message| message.role == Role::Assistant)
            .unwrap();
        turn.parts
            .retain(|part| !matches!(part, Part::Reasoning { .. }));
        turn.parts
            .insert(0, reasoning_part("I should look.", Some("sig-1")));
        let sent = body(&reasoning, &request);
        assert_eq!(sent["thinking"]["type"], "enabled");
        let assistant = sent["messages"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|message| message["role"] == "assistant")
            .unwrap();
        assert_eq!(
            assistant["content"][0],
            json!({"type": "thinking", "thinking": "I should look.", "signature": "sig-1"})
        );
        request.thinking = Thinking::Off;
        let sent = body(&reasoning, &request);
        assert!(sent.get("thinking").is_none());
        assert!(
            !sent.to_string().contains("sig-1"),
            "thinking blocks go back only with thinking on"
        );
    }

    #[test]
    fn blocks_assemble_with_usage_and_stop() {
        let events = [
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                   "usage": {"input_tokens": 10, "cache_creation_input_tokens": 5, "cache_read_input_tokens": 100, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
            json!({"type": "ping"}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Let me"}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": " check."}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQB"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Checking."}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}}),
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}}),
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"cmd\": "}}),
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "\"ls\"}"}}),
            json!({"type": "content_block_stop", "index": 2}),
            json!({"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "toolu_2", "name": "now", "input": {}}}),
            json!({"type": "content_block_stop", "index": 3}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 42}}),
            json!({"type": "message_stop"}),
        ]
        .map(|event| event.to_string());
        let out = assert_tool_use(
            &mut AnthropicDecoder::default(),
            &events,
            vec![
                reasoning_part("Let me check.", Some("EqQB")),
                text("Checking."),
                tool_call("toolu_1", "bash", json!({"cmd": "ls"})),
                tool_call("toolu_2", "now", json!({})),
            ],
            usage(115, 42, 100),
        );
        assert_eq!(out.len(), 5);
    }

    #[test]
    fn stop_reasons_and_errors() {
        for (reason, stop) in [
            ("end_turn", StopReason::End),
            ("stop_sequence", StopReason::End),
            ("max_tokens", StopReason::MaxTokens),
            ("refusal", StopReason::Other("refusal".into())),
        ] {
            let events = [
                json!({"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": 1}}).to_string(),
                json!({"type": "message_stop"}).to_string(),
            ];
            let (reply, _) = feed(&mut AnthropicDecoder::default(), &events).unwrap();
            assert_eq!(reply.unwrap().stop, stop);
        }
        let error = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
        let result = feed(&mut AnthropicDecoder::default(), &[error.to_string()]);
        assert!(
            matches!(result, Err(ModelErrorKind::Server { status: 529, .. })),
            "{result:?}"
        );
        let stray = json!({"type": "content_block_delta", "index": 4, "delta": {"type": "input_json_delta", "partial_json": "{}"}});
        let result = feed(&mut AnthropicDecoder::default(), &[stray.to_string()]);
        assert!(
            matches!(result, Err(ModelErrorKind::Garbage { .. })),
            "{result:?}"
        );
    }
}
