//! OpenAI's Responses API (`POST {baseUrl}/responses`).
//!
//! The stream is named events whose data carries the same `type`: `response.created`, then per
//! output item `response.output_item.added` ... `response.output_item.done`, with
//! `response.output_text.delta` for message text, `response.reasoning_summary_text.delta` (or
//! `response.reasoning_text.delta`) for reasoning and `response.function_call_arguments.delta`
//! / `.done` for a function call's arguments; it ends with `response.completed` (usage),
//! `response.incomplete` (cut short, with the reason) or `response.failed`, and an `error` event
//! may come first.
//!
//! perch keeps the conversation itself, so requests are sent with `store: false` and the whole
//! history as `input` items. Reasoning parts in the history are not sent back: they would need
//! the encrypted reasoning items, which perch does not keep.

use super::body::{set_system, set_tools, tool_results};
use super::draft::{CallSlot, Decoded, Decoder, Draft, str_at, stream_error, typed, u64_at};
use super::{Endpoint, ModelErrorKind, ModelRequest, StopReason, StreamEvent};
use perch_core::config::Thinking;
use perch_core::log::{Part, Role};
use perch_core::sse::SseEvent;
use serde_json::{Value, json};
use std::collections::HashMap;

pub(crate) const PATH: &str = "/responses";

/// The request body.
pub(crate) fn body(endpoint: &Endpoint, request: &ModelRequest) -> Value {
    let mut input = Vec::new();
    for message in &request.messages {
        match message.role {
            Role::User => push_user_text(&mut input, &message.parts),
            Role::Assistant => {
                let mut texts = Vec::new();
                for part in &message.parts {
                    match part {
                        Part::Text { text } if !text.is_empty() => {
                            texts.push(json!({"type": "output_text", "text": text}));
                        }
                        Part::ToolCall {
                            call_id,
                            name,
                            arguments,
                        } => {
                            flush_assistant_text(&mut input, &mut texts);
                            input.push(json!({
                                "type": "function_call",
                                "call_id": call_id,
                                "name": name,
                                "arguments": arguments.to_string(),
                            }));
                        }
                        _ => {}
                    }
                }
                flush_assistant_text(&mut input, &mut texts);
            }
            Role::Tool => {
                input.extend(tool_results(&message.parts).map(|(call_id, output)| {
                    json!({"type": "function_call_output", "call_id": call_id, "output": output})
                }));
                push_user_text(&mut input, &message.parts);
            }
        }
    }
    let mut body = json!({
        "model": endpoint.model.id,
        "input": input,
        "stream": true,
        "store": false,
        "max_output_tokens": endpoint.model.max_tokens,
    });
    set_system(&mut body, "instructions", request);
    set_tools(&mut body, request, |tool| {
        json!({
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "strict": false,
        })
    });
    if endpoint.model.reasoning && request.thinking != Thinking::Off {
        body["reasoning"] = json!({"effort": request.thinking.as_str(), "summary": "auto"});
    }
    body
}

fn push_user_text(input: &mut Vec<Value>, parts: &[Part]) {
    let content: Vec<Value> = parts
        .iter()
        .filter_map(|part| match part {
            Part::Text { text } if !text.is_empty() => {
                Some(json!({"type": "input_text", "text": text}))
            }
            _ => None,
        })
        .collect();
    if !content.is_empty() {
        input.push(json!({"type": "message", "role": "user", "content": content}));
    }
}

fn flush_assistant_text(input: &mut Vec<Value>, texts: &mut Vec<Value>) {
    if !texts.is_empty() {
        input.push(json!({
            "type": "message",
            "role": "assistant",
            "content": std::mem::take(texts),
        }));
    }
}

/// Assembles a reply from Responses API events.
#[derive(Debug, Default)]
pub(crate) struct ResponsesDecoder {
    draft: Draft,
    by_item: HashMap<String, CallSlot>,
    by_index: HashMap<u64, CallSlot>,
}

impl Decoder for ResponsesDecoder {
    fn event(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Decoded {
        let (data, kind) = typed(event)?;
        match kind.as_str() {
            "response.output_text.delta" => {
                self.draft.text(str_at(&data, "/delta").unwrap_or(""), out);
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                self.draft
                    .reasoning(str_at(&data, "/delta").unwrap_or(""), out);
            }
            "response.output_item.added" | "response.output_item.done"
                if str_at(&data, "/item/type") == Some("function_call") =>
            {
                let slot = self.call_item(&data, out);
                if kind == "response.output_item.done"
                    && let Some(arguments) = str_at(&data, "/item/arguments")
                {
                    self.draft.set_call_arguments(slot, arguments);
                }
            }
            "response.function_call_arguments.delta" => {
                let slot = self.slot_of(&data)?;
                self.draft
                    .call_arguments(slot, str_at(&data, "/delta").unwrap_or(""));
            }
            "response.function_call_arguments.done" => {
                let slot = self.slot_of(&data)?;
                if let Some(arguments) = str_at(&data, "/arguments") {
                    self.draft.set_call_arguments(slot, arguments);
                }
            }
            "response.completed" | "response.incomplete" => {
                let response = data.get("response").unwrap_or(&Value::Null);
                if let Some(usage) = response.get("usage").filter(|usage| usage.is_object()) {
                    self.draft.usage.input = u64_at(usage, "/input_tokens");
                    self.draft.usage.output = u64_at(usage, "/output_tokens");
                    self.draft.usage.cached = u64_at(usage, "/input_tokens_details/cached_tokens");
                }
                let stop = if kind == "response.completed" {
                    StopReason::End
                } else {
                    match str_at(response, "/incomplete_details/reason") {
                        Some("max_output_tokens") => StopReason::MaxTokens,
                        Some(reason) => StopReason::Other(reason.to_owned()),
                        None => StopReason::Other("incomplete".into()),
                    }
                };
                return std::mem::take(&mut self.draft).finish(stop).map(Some);
            }
            "response.failed" => {
                let error = data.pointer("/response/error").unwrap_or(&Value::Null);
                return Err(stream_error(
                    str_at(error, "/code").unwrap_or("server_error"),
                    str_at(error, "/message").unwrap_or("the response failed"),
                ));
            }
            "error" => {
                let error = data
                    .get("error")
                    .filter(|error| error.is_object())
                    .unwrap_or(&data);
                let code = str_at(error, "/code")
                    .or_else(|| str_at(error, "/type").filter(|kind| *kind != "error"))
                    .unwrap_or("server_error");
                return Err(stream_error(code, str_at(error, "/message").unwrap_or("")));
            }
            _ => {}
        }
        Ok(None)
    }
}

impl ResponsesDecoder {
    fn call_item(&mut self, data: &Value, out: &mut Vec<StreamEvent>) -> CallSlot {
        let item_id = str_at(data, "/item/id").unwrap_or("").to_owned();
        let index = data.get("output_index").and_then(Value::as_u64);
        let call_id = str_at(data, "/item/call_id");
        let name = str_at(data, "/item/name");
        let known = self
            .by_item
            .get(&item_id)
            .or_else(|| index.and_then(|index| self.by_index.get(&index)))
            .copied();
        let slot = match known {
            Some(slot) => {
                self.draft.complete_call(slot, call_id, name, out);
                slot
            }
            None => self
                .draft
                .start_call(call_id.unwrap_or(""), name.unwrap_or(""), out),
        };
        if !item_id.is_empty() {
            self.by_item.insert(item_id, slot);
        }
        if let Some(index) = index {
            self.by_index.insert(index, slot);
        }
        slot
    }

    fn slot_of(&self, data: &Value) -> Result<CallSlot, ModelErrorKind> {
        str_at(data, "/item_id")
            .and_then(|item| self.by_item.get(item))
            .or_else(|| {
                data.get("output_index")
                    .and_then(Value::as_u64)
                    .and_then(|index| self.by_index.get(&index))
            })
            .copied()
            .ok_or_else(|| ModelErrorKind::Garbage {
                detail: "function call arguments for an item that was never added".into(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{
        assert_tool_use, endpoint, feed, reasoning_part, request_with_bash, text, tool_call, usage,
    };
    use perch_core::config::Api;

    #[test]
    fn the_body_carries_instructions_input_items_tools_and_effort() {
        let endpoint = endpoint(Api::OpenAiResponses, true);
        let mut request = request_with_bash(json!({"type": "object"}), Thinking::Medium);
        assert_eq!(
            body(&endpoint, &request),
            json!({
                "model": "test-model",
                "instructions": "Be brief.",
                "stream": true,
                "store": false,
                "max_output_tokens": 4096,
                "reasoning": {"effort": "medium", "summary": "auto"},
                "input": [
                    {"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": "list files"}]},
                    {"type": "message", "role": "assistant",
                     "content": [{"type": "output_text", "text": "Looking."}]},
                    {"type": "function_call", "call_id": "call_1", "name": "bash",
                     "arguments": "{\"cmd\":\"ls\"}"},
                    {"type": "function_call", "call_id": "call_2", "name": "bash",
                     "arguments": "{\"cmd\":\"pwd\"}"},
                    {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
                    {"type": "function_call_output", "call_id": "call_2", "output": "no such dir"},
                    {"type": "message", "role": "assistant",
                     "content": [{"type": "output_text", "text": "Done."}]},
                    {"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": "thanks"}]},
                ],
                "tools": [{"type": "function", "name": "bash", "description": "Run a command",
                           "parameters": {"type": "object"}, "strict": false}],
            })
        );
        request.thinking = Thinking::Off;
        assert!(body(&endpoint, &request).get("reasoning").is_none());
    }

    #[test]
    fn items_text_reasoning_and_calls_assemble_in_order() {
        let events = [
            json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}),
            json!({"type": "response.output_item.added", "output_index": 0,
                   "item": {"id": "rs_1", "type": "reasoning", "summary": []}}),
            json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "summary_index": 0, "delta": "**Plan**"}),
            json!({"type": "response.output_item.added", "output_index": 1,
                   "item": {"id": "msg_1", "type": "message", "role": "assistant", "content": []}}),
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1, "content_index": 0, "delta": "On it"}),
            json!({"type": "response.output_item.added", "output_index": 2,
                   "item": {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "read", "arguments": "", "status": "in_progress"}}),
            json!({"type": "response.output_item.added", "output_index": 3,
                   "item": {"id": "fc_2", "type": "function_call", "call_id": "call_2", "name": "bash", "arguments": "", "status": "in_progress"}}),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_2", "output_index": 3, "delta": "{\"cmd\""}),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 2, "delta": "{\"path\":\"a\"}"}),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_2", "output_index": 3, "delta": ":\"ls\"}"}),
            json!({"type": "response.function_call_arguments.done", "item_id": "fc_2", "output_index": 3, "arguments": "{\"cmd\":\"ls\"}"}),
            json!({"type": "response.output_item.done", "output_index": 2,
                   "item": {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "read", "arguments": "{\"path\":\"a\"}", "status": "completed"}}),
            json!({"type": "response.completed", "response": {"id": "resp_1", "status": "completed",
                   "usage": {"input_tokens": 120, "input_tokens_details": {"cached_tokens": 64},
                             "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 12}, "total_tokens": 150}}}),
        ]
        .map(|event| event.to_string());
        let out = assert_tool_use(
            &mut ResponsesDecoder::default(),
            &events,
            vec![
                reasoning_part("**Plan**", None),
                text("On it"),
                tool_call("call_1", "read", json!({"path": "a"})),
                tool_call("call_2", "bash", json!({"cmd": "ls"})),
            ],
            usage(120, 30, 64),
        );
        assert_eq!(out.len(), 4);
    }

    #[test]
    fn incomplete_and_failed_responses() {
        let incomplete = json!({"type": "response.incomplete", "response": {"status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"}, "usage": null}});
        let (reply, _) = feed(&mut ResponsesDecoder::default(), &[incomplete.to_string()]).unwrap();
        assert_eq!(reply.unwrap().stop, StopReason::MaxTokens);

        let error = json!({"type": "error", "sequence_number": 2, "error": {"type": "insufficient_quota",
            "code": "insufficient_quota", "message": "You exceeded your current quota", "param": null}});
        let result = feed(&mut ResponsesDecoder::default(), &[error.to_string()]);
        assert!(
            matches!(result, Err(ModelErrorKind::OutOfCredit { status: 429, .. })),
            "{result:?}"
        );

        let flat = json!({"type": "error", "code": "rate_limit_exceeded", "message": "slow down", "param": null});
        let result = feed(&mut ResponsesDecoder::default(), &[flat.to_string()]);
        assert_eq!(
            result.unwrap_err(),
            ModelErrorKind::RateLimited { retry_after: None }
        );

        let failed = json!({"type": "response.failed", "response": {"status": "failed",
            "error": {"code": "server_error", "message": "Something went wrong"}}});
        let result = feed(&mut ResponsesDecoder::default(), &[failed.to_string()]);
        assert!(
            matches!(result, Err(ModelErrorKind::Server { .. })),
            "{result:?}"
        );
    }
}
