//! OpenAI's Chat Completions API (`POST {baseUrl}/chat/completions`), which most local and
//! hosted OpenAI-compatible servers speak too.
//!
//! The stream is `data:` lines of `chat.completion.chunk` objects: text in
//! `choices[0].delta.content`, reasoning in `delta.reasoning_content` or `delta.reasoning`
//! (servers that expose it), tool calls in `delta.tool_calls` fragments keyed by `index` (the
//! first fragment of a call carries its id and name, the rest pieces of its arguments),
//! `finish_reason` on the last choice chunk, then a chunk with `usage` and no choices, then
//! `data: [DONE]`, which ends the reply.
//!
//! Reasoning parts in the history are not sent back: the API has no field for them.

use super::body::{set_tools, tool_results};
use super::draft::{CallSlot, Decoded, Decoder, Draft, json, str_at, stream_error, u64_at};
use super::{Endpoint, ModelErrorKind, ModelRequest, StopReason, StreamEvent};
use perch_core::config::Thinking;
use perch_core::conversation::tool_calls;
use perch_core::log::{Part, Role};
use perch_core::sse::SseEvent;
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub(crate) const PATH: &str = "/chat/completions";

/// The request body.
pub(crate) fn body(endpoint: &Endpoint, request: &ModelRequest) -> Value {
    let mut messages = Vec::new();
    if !request.system.is_empty() {
        messages.push(json!({"role": "system", "content": request.system}));
    }
    for message in &request.messages {
        let texts: Vec<&str> = message
            .parts
            .iter()
            .filter_map(|part| match part {
                Part::Text { text } if !text.is_empty() => Some(text.as_str()),
                _ => None,
            })
            .collect();
        match message.role {
            Role::User => {
                if !texts.is_empty() {
                    messages.push(json!({"role": "user", "content": texts.join("\n\n")}));
                }
            }
            Role::Assistant => {
                let calls: Vec<Value> = tool_calls(message)
                    .into_iter()
                    .map(|(call_id, name, arguments)| {
                        json!({
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": arguments.to_string()},
                        })
                    })
                    .collect();
                if texts.is_empty() && calls.is_empty() {
                    continue;
                }
                let mut assistant = json!({
                    "role": "assistant",
                    "content": if texts.is_empty() { Value::Null } else { json!(texts.join("\n\n")) },
                });
                if !calls.is_empty() {
                    assistant["tool_calls"] = Value::Array(calls);
                }
                messages.push(assistant);
            }
            Role::Tool => {
                messages.extend(tool_results(&message.parts).map(|(call_id, output)| {
                    json!({"role": "tool", "tool_call_id": call_id, "content": output})
                }));
                if !texts.is_empty() {
                    messages.push(json!({"role": "user", "content": texts.join("\n\n")}));
                }
            }
        }
    }
    let mut body = json!({
        "model": endpoint.model.id,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_completion_tokens": endpoint.model.max_tokens,
    });
    set_tools(&mut body, request, |tool| {
        json!({
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        })
    });
    if endpoint.model.reasoning && request.thinking != Thinking::Off {
        body["reasoning_effort"] = json!(request.thinking.as_str());
    }
    body
}

/// Assembles a reply from `chat.completion.chunk` events.
#[derive(Debug, Default)]
pub(crate) struct CompletionsDecoder {
    draft: Draft,
    calls: BTreeMap<u64, CallSlot>,
    finish: Option<String>,
}

impl Decoder for CompletionsDecoder {
    fn event(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Decoded {
        if event.data.trim() == "[DONE]" {
            let Some(finish) = self.finish.take() else {
                return Err(ModelErrorKind::Garbage {
                    detail: "the stream ended without a finish_reason".into(),
                });
            };
            let draft = std::mem::take(&mut self.draft);
            return draft.finish(stop_reason(&finish)).map(Some);
        }
        let chunk = json(event)?;
        if let Some(error) = chunk.get("error").filter(|error| error.is_object()) {
            let code = str_at(error, "/code")
                .or_else(|| str_at(error, "/type"))
                .unwrap_or("error");
            return Err(stream_error(code, str_at(error, "/message").unwrap_or("")));
        }
        if let Some(usage) = chunk.get("usage").filter(|usage| usage.is_object()) {
            self.draft.usage.input = u64_at(usage, "/prompt_tokens");
            self.draft.usage.output = u64_at(usage, "/completion_tokens");
            self.draft.usage.cached = u64_at(usage, "/prompt_tokens_details/cached_tokens");
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return Ok(None);
        };
        if let Some(delta) = choice.get("delta") {
            let reasoning = str_at(delta, "/reasoning_content")
                .filter(|text| !text.is_empty())
                .or_else(|| str_at(delta, "/reasoning"));
            if let Some(text) = reasoning {
                self.draft.reasoning(text, out);
            }
            if let Some(text) = str_at(delta, "/content") {
                self.draft.text(text, out);
            }
            if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                for (position, call) in calls.iter().enumerate() {
                    self.tool_call_delta(position, call, out);
                }
            }
        }
        if let Some(reason) = str_at(choice, "/finish_reason") {
            self.finish = Some(reason.to_owned());
        }
        Ok(None)
    }
}

impl CompletionsDecoder {
    fn tool_call_delta(&mut self, position: usize, call: &Value, out: &mut Vec<StreamEvent>) {
        let index = call
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or(position as u64);
        let id = str_at(call, "/id");
        let name = str_at(call, "/function/name");
        let slot = match self.calls.get(&index) {
            Some(&slot) => {
                self.draft.complete_call(slot, id, name, out);
                slot
            }
            None => {
                let slot = self
                    .draft
                    .start_call(id.unwrap_or(""), name.unwrap_or(""), out);
                self.calls.insert(index, slot);
                slot
            }
        };
        if let Some(arguments) = str_at(call, "/function/arguments") {
            self.draft.call_arguments(slot, arguments);
        }
    }
}

fn stop_reason(finish: &str) -> StopReason {
    match finish {
        "stop" => StopReason::End,
        "tool_calls" | "function_call" => StopReason::ToolUse,
        "length" => StopReason::MaxTokens,
        other => StopReason::Other(other.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{
        assert_tool_use, endpoint, feed, history, reasoning_part, request, request_with_bash,
        tool_call, usage,
    };
    use perch_core::config::Api;

    #[test]
    fn the_body_carries_system_history_tools_and_effort() {
        let endpoint = endpoint(Api::OpenAiCompletions, true);
        let request = request_with_bash(
            json!({"type": "object", "properties": {"cmd": {"type": "string"}}}),
            Thinking::High,
        );
        assert_eq!(
            body(&endpoint, &request),
            json!({
                "model": "test-model",
                "stream": true,
                "stream_options": {"include_usage": true},
                "max_completion_tokens": 4096,
                "reasoning_effort": "high",
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "list files"},
                    {"role": "assistant", "content": "Looking.", "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "bash", "arguments": "{\"cmd\":\"ls\"}"}},
                        {"id": "call_2", "type": "function",
                         "function": {"name": "bash", "arguments": "{\"cmd\":\"pwd\"}"}},
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
                    {"role": "tool", "tool_call_id": "call_2", "content": "no such dir"},
                    {"role": "assistant", "content": "Done."},
                    {"role": "user", "content": "thanks"},
                ],
                "tools": [{"type": "function", "function": {
                    "name": "bash", "description": "Run a command",
                    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
                }}],
            })
        );
    }

    #[test]
    fn no_effort_without_a_reasoning_model_or_with_thinking_off() {
        let mut request = request(history());
        request.thinking = Thinking::Low;
        let plain = body(&endpoint(Api::OpenAiCompletions, false), &request);
        assert!(plain.get("reasoning_effort").is_none());
        request.thinking = Thinking::Off;
        let off = body(&endpoint(Api::OpenAiCompletions, true), &request);
        assert!(off.get("reasoning_effort").is_none());
        assert!(off.get("tools").is_none());
    }

    fn chunk(delta: Value, finish: Option<&str>) -> String {
        json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            "usage": null,
        })
        .to_string()
    }

    #[test]
    fn interleaved_tool_call_fragments_are_assembled_by_index() {
        let events = [
            chunk(json!({"role": "assistant", "content": null}), None),
            chunk(json!({"reasoning_content": "Two calls."}), None),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                "function": {"name": "read", "arguments": ""}}]}),
                None,
            ),
            chunk(
                json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                "function": {"name": "bash", "arguments": "{\"cm"}}]}),
                None,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"path\":"}}]}),
                None,
            ),
            chunk(
                json!({"tool_calls": [{"index": 1, "function": {"arguments": "d\":\"ls\"}"}}]}),
                None,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"a\"}"}}]}),
                None,
            ),
            chunk(json!({}), Some("tool_calls")),
            json!({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 50,
                "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 32}}})
            .to_string(),
            "[DONE]".to_owned(),
        ];
        let out = assert_tool_use(
            &mut CompletionsDecoder::default(),
            &events,
            vec![
                reasoning_part("Two calls.", None),
                tool_call("call_a", "read", json!({"path": "a"})),
                tool_call("call_b", "bash", json!({"cmd": "ls"})),
            ],
            usage(50, 9, 32),
        );
        assert_eq!(
            out,
            vec![
                StreamEvent::Reasoning("Two calls.".into()),
                StreamEvent::ToolCall {
                    call_id: "call_a".into(),
                    name: "read".into()
                },
                StreamEvent::ToolCall {
                    call_id: "call_b".into(),
                    name: "bash".into()
                },
            ]
        );
    }

    #[test]
    fn finish_reasons_map_to_stops() {
        for (finish, stop) in [
            ("stop", StopReason::End),
            ("length", StopReason::MaxTokens),
            ("content_filter", StopReason::Other("content_filter".into())),
        ] {
            let events = [
                chunk(json!({"content": "hi"}), None),
                chunk(json!({}), Some(finish)),
                "[DONE]".to_owned(),
            ];
            let (reply, _) = feed(&mut CompletionsDecoder::default(), &events).unwrap();
            assert_eq!(reply.unwrap().stop, stop);
        }
    }

    #[test]
    fn an_error_chunk_and_a_missing_finish_reason_are_errors() {
        let error =
            json!({"error": {"message": "The server had an error", "type": "server_error"}});
        let result = feed(&mut CompletionsDecoder::default(), &[error.to_string()]);
        assert!(
            matches!(result, Err(ModelErrorKind::Server { status: 500, .. })),
            "{result:?}"
        );
        let result = feed(
            &mut CompletionsDecoder::default(),
            &[chunk(json!({"content": "hi"}), None), "[DONE]".into()],
        );
        assert!(
            matches!(result, Err(ModelErrorKind::Garbage { .. })),
            "{result:?}"
        );
    }
}
