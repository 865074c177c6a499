//! The event streams of the three wire APIs, as the real services send them.

use super::*;

/// How a scripted stream ends.
pub(super) enum End {
    /// The last chunk is sent; the connection stays open for the next request.
    Finish,
    /// The connection is closed mid-response.
    Cut,
    /// Nothing more is sent, ever.
    Stall,
}

/// `text` in pieces the way models stream it: a word at a time, with its leading space.
fn pieces(text: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut current = String::new();
    for ch in text.chars() {
        if ch == ' ' && !current.trim().is_empty() {
            pieces.push(std::mem::take(&mut current));
        }
        current.push(ch);
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

/// JSON text in fragments of a few characters, cut anywhere (inside keys and strings too).
fn fragments(arguments: &str) -> Vec<String> {
    let chars: Vec<char> = arguments.chars().collect();
    chars
        .chunks(7)
        .map(|chunk| chunk.iter().collect())
        .collect()
}

/// One server-sent event with a name.
fn named_event(name: &str, data: &str) -> Vec<u8> {
    format!("event: {name}\ndata: {data}\n\n").into_bytes()
}

pub(super) fn render(api: Api, n: u64, request: &Value, script: Script) -> (Vec<Vec<u8>>, End) {
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("fake-model")
        .to_owned();
    let mut stream = match api {
        Api::OpenAiCompletions => Stream::Completions(Completions {
            id: format!("chatcmpl-fake{n}"),
            model,
            usage: request
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            events: Vec::new(),
        }),
        Api::OpenAiResponses => Stream::Responses(Responses {
            id: format!("resp_fake{n}"),
            model,
            sequence: 0,
            events: Vec::new(),
        }),
        Api::AnthropicMessages => Stream::Anthropic(Anthropic {
            id: format!("msg_fake{n}"),
            model,
            events: Vec::new(),
        }),
    };
    let end = match script {
        Script::Reply(reply) => {
            stream.reply(&reply);
            End::Finish
        }
        Script::StreamError { code, message } => {
            stream.error(&code, &message);
            End::Finish
        }
        Script::CutMidToolCall => {
            stream.cut_mid_call();
            End::Cut
        }
        Script::EndMidToolCall => {
            stream.cut_mid_call();
            End::Finish
        }
        Script::Garbage => {
            stream.garbage();
            End::Finish
        }
        Script::Stall => {
            stream.stall();
            End::Stall
        }
        Script::Status { .. } => unreachable!("statuses are answered without a stream"),
        Script::Held { .. } => unreachable!("a held script is released before it is answered"),
    };
    (stream.into_events(), end)
}

enum Stream {
    Completions(Completions),
    Responses(Responses),
    Anthropic(Anthropic),
}

impl Stream {
    fn reply(&mut self, reply: &Reply) {
        match self {
            Stream::Completions(stream) => stream.reply(reply),
            Stream::Responses(stream) => stream.reply(reply),
            Stream::Anthropic(stream) => stream.reply(reply),
        }
    }

    fn error(&mut self, code: &str, message: &str) {
        match self {
            Stream::Completions(stream) => {
                stream.start(false);
                stream.delta(json!({"content": "Partial"}), None);
                stream.data(&json!({"error": {"message": message, "type": code, "param": null, "code": null}}).to_string());
            }
            Stream::Responses(stream) => {
                stream.start();
                stream.event("error", json!({"error": {"type": code, "code": code, "message": message, "param": null}}));
                let mut response = stream.response("failed");
                response["error"] = json!({"code": code, "message": message});
                stream.event("response.failed", json!({"response": response}));
            }
            Stream::Anthropic(stream) => {
                stream.start(&Reply::new());
                stream.event(
                    "error",
                    json!({"type": "error", "error": {"type": code, "message": message}}),
                );
            }
        }
    }

    fn cut_mid_call(&mut self) {
        let arguments = json!({"cmd": "ls -la /workspace"}).to_string();
        let fragments = fragments(&arguments);
        let sent = &fragments[..2];
        match self {
            Stream::Completions(stream) => {
                stream.start(true);
                stream.delta(
                    json!({"tool_calls": [{"index": 0, "id": "call_cut", "type": "function",
                    "function": {"name": "bash", "arguments": ""}}]}),
                    None,
                );
                for fragment in sent {
                    stream.delta(
                        json!({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]}),
                        None,
                    );
                }
            }
            Stream::Responses(stream) => {
                stream.start();
                let item = json!({"id": "fc_cut", "type": "function_call", "status": "in_progress",
                    "arguments": "", "call_id": "call_cut", "name": "bash"});
                stream.event(
                    "response.output_item.added",
                    json!({"output_index": 0, "item": item}),
                );
                for fragment in sent {
                    stream.event(
                        "response.function_call_arguments.delta",
                        json!({"item_id": "fc_cut", "output_index": 0, "delta": fragment}),
                    );
                }
            }
            Stream::Anthropic(stream) => {
                stream.start(&Reply::new());
                stream.event("content_block_start", json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "tool_use", "id": "toolu_cut", "name": "bash", "input": {}}}));
                for fragment in sent {
                    stream.event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": 0,
                        "delta": {"type": "input_json_delta", "partial_json": fragment}}),
                    );
                }
            }
        }
    }

    fn garbage(&mut self) {
        match self {
            Stream::Completions(stream) => {
                stream.start(false);
                stream.delta(json!({"content": "Hel"}), None);
                stream.data("{\"choices\": [{\"delta\": {\"content\": \"lo\"");
                stream.data("[DONE]");
            }
            Stream::Responses(stream) => {
                stream.start();
                stream.raw(
                    "response.output_text.delta",
                    "{\"type\":\"response.output_text.delta\",\"delta\":",
                );
            }
            Stream::Anthropic(stream) => {
                stream.start(&Reply::new());
                stream.raw("content_block_delta", "<html>502 Bad Gateway</html>");
            }
        }
    }

    fn stall(&mut self) {
        let reply = Reply::text("Thinking about it");
        match self {
            Stream::Completions(stream) => {
                stream.start(false);
                stream.delta(json!({"content": "Thinking"}), None);
            }
            Stream::Responses(stream) => {
                stream.start();
                stream.message_start(0, "msg_stall");
                stream.event(
                    "response.output_text.delta",
                    json!({"item_id": "msg_stall", "output_index": 0,
                    "content_index": 0, "delta": "Thinking", "logprobs": []}),
                );
            }
            Stream::Anthropic(stream) => {
                stream.start(&reply);
                stream.event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
                );
                stream.event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": "Thinking"}}),
                );
            }
        }
    }

    fn into_events(self) -> Vec<Vec<u8>> {
        match self {
            Stream::Completions(stream) => stream.events,
            Stream::Responses(stream) => stream.events,
            Stream::Anthropic(stream) => stream.events,
        }
    }
}

struct Completions {
    id: String,
    model: String,
    usage: bool,
    events: Vec<Vec<u8>>,
}

impl Completions {
    fn data(&mut self, data: &str) {
        self.events.push(format!("data: {data}\n\n").into_bytes());
    }

    fn chunk(&mut self, choices: Value, usage: Option<Value>) {
        let mut chunk = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": 1_770_000_000,
            "model": self.model, "service_tier": "default", "system_fingerprint": "fp_fake",
            "choices": choices,
        });
        if self.usage {
            chunk["usage"] = usage.unwrap_or(Value::Null);
        }
        self.data(&chunk.to_string());
    }

    fn delta(&mut self, delta: Value, finish: Option<&str>) {
        self.chunk(
            json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]),
            None,
        );
    }

    fn start(&mut self, calls_only: bool) {
        let content = if calls_only { Value::Null } else { json!("") };
        self.delta(
            json!({"role": "assistant", "content": content, "refusal": null}),
            None,
        );
    }

    fn reply(&mut self, reply: &Reply) {
        self.start(reply.text.is_none() && !reply.calls.is_empty());
        for piece in pieces(reply.reasoning.as_deref().unwrap_or("")) {
            self.delta(json!({"reasoning_content": piece}), None);
        }
        for piece in pieces(reply.text.as_deref().unwrap_or("")) {
            self.delta(json!({"content": piece}), None);
        }
        for (index, (call_id, name, arguments)) in reply.calls.iter().enumerate() {
            self.delta(
                json!({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                "function": {"name": name, "arguments": ""}}]}),
                None,
            );
            for fragment in fragments(&arguments.to_string()) {
                self.delta(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}),
                    None,
                );
            }
        }
        let finish = if reply.max_tokens {
            "length"
        } else if reply.calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        };
        self.delta(json!({}), Some(finish));
        if self.usage {
            let (input, output, cached) = reply.usage;
            self.chunk(json!([]), Some(json!({
                "prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output,
                "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                    "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
            })));
        }
        self.data("[DONE]");
    }
}

struct Responses {
    id: String,
    model: String,
    sequence: u64,
    events: Vec<Vec<u8>>,
}

impl Responses {
    fn raw(&mut self, name: &str, data: &str) {
        self.events.push(named_event(name, data));
    }

    fn event(&mut self, name: &str, mut data: Value) {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        self.raw(name, &data.to_string());
    }

    fn response(&self, status: &str) -> Value {
        json!({
            "id": self.id, "object": "response", "created_at": 1_770_000_000, "status": status,
            "background": false, "error": null, "incomplete_details": null, "instructions": null,
            "max_output_tokens": null, "model": self.model, "output": [], "parallel_tool_calls": true,
            "previous_response_id": null, "reasoning": {"effort": null, "summary": null},
            "store": false, "temperature": 1.0, "text": {"format": {"type": "text"}},
            "tool_choice": "auto", "tools": [], "top_p": 1.0, "truncation": "disabled",
            "usage": null, "user": null, "metadata": {},
        })
    }

    fn start(&mut self) {
        let response = self.response("in_progress");
        self.event("response.created", json!({"response": response}));
        self.event("response.in_progress", json!({"response": response}));
    }

    fn message_start(&mut self, index: usize, id: &str) {
        self.event("response.output_item.added", json!({"output_index": index,
            "item": {"id": id, "type": "message", "status": "in_progress", "content": [], "role": "assistant"}}));
        self.event("response.content_part.added", json!({"item_id": id, "output_index": index,
            "content_index": 0, "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}}));
    }

    fn reply(&mut self, reply: &Reply) {
        self.start();
        let mut output = Vec::new();
        if let Some(reasoning) = &reply.reasoning {
            let index = output.len();
            let id = "rs_fake0";
            self.event(
                "response.output_item.added",
                json!({"output_index": index,
                "item": {"id": id, "type": "reasoning", "summary": []}}),
            );
            self.event(
                "response.reasoning_summary_part.added",
                json!({"item_id": id, "output_index": index,
                "summary_index": 0, "part": {"type": "summary_text", "text": ""}}),
            );
            for piece in pieces(reasoning) {
                self.event(
                    "response.reasoning_summary_text.delta",
                    json!({"item_id": id, "output_index": index,
                    "summary_index": 0, "delta": piece}),
                );
            }
            self.event(
                "response.reasoning_summary_text.done",
                json!({"item_id": id, "output_index": index,
                "summary_index": 0, "text": reasoning}),
            );
            let part = json!({"type": "summary_text", "text": reasoning});
            self.event(
                "response.reasoning_summary_part.done",
                json!({"item_id": id, "output_index": index,
                "summary_index": 0, "part": part}),
            );
            let item = json!({"id": id, "type": "reasoning", "summary": [part]});
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            output.push(item);
        }
        if let Some(text) = &reply.text {
            let index = output.len();
            let id = "msg_fake0";
            self.message_start(index, id);
            for piece in pieces(text) {
                self.event(
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": index,
                    "content_index": 0, "delta": piece, "logprobs": []}),
                );
            }
            self.event(
                "response.output_text.done",
                json!({"item_id": id, "output_index": index,
                "content_index": 0, "text": text, "logprobs": []}),
            );
            let part =
                json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text});
            self.event(
                "response.content_part.done",
                json!({"item_id": id, "output_index": index,
                "content_index": 0, "part": part}),
            );
            let item = json!({"id": id, "type": "message", "status": "completed", "content": [part], "role": "assistant"});
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            output.push(item);
        }
        for (number, (call_id, name, arguments)) in reply.calls.iter().enumerate() {
            let index = output.len();
            let id = format!("fc_fake{number}");
            let arguments = arguments.to_string();
            self.event("response.output_item.added", json!({"output_index": index,
                "item": {"id": id, "type": "function_call", "status": "in_progress", "arguments": "",
                         "call_id": call_id, "name": name}}));
            for fragment in fragments(&arguments) {
                self.event(
                    "response.function_call_arguments.delta",
                    json!({"item_id": id,
                    "output_index": index, "delta": fragment}),
                );
            }
            self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id,
                "output_index": index, "arguments": arguments}),
            );
            let item = json!({"id": id, "type": "function_call", "status": "completed",
                "arguments": arguments, "call_id": call_id, "name": name});
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            output.push(item);
        }
        let (input, output_tokens, cached) = reply.usage;
        let (name, status) = if reply.max_tokens {
            ("response.incomplete", "incomplete")
        } else {
            ("response.completed", "completed")
        };
        let mut response = self.response(status);
        response["output"] = Value::Array(output);
        if reply.max_tokens {
            response["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        response["usage"] = json!({
            "input_tokens": input, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input + output_tokens,
        });
        self.event(name, json!({"response": response}));
    }
}

struct Anthropic {
    id: String,
    model: String,
    events: Vec<Vec<u8>>,
}

impl Anthropic {
    fn event(&mut self, name: &str, data: Value) {
        self.raw(name, &data.to_string());
    }

    fn start(&mut self, reply: &Reply) {
        let (input, _, cached) = reply.usage;
        self.event("message_start", json!({"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input - cached, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": cached, "output_tokens": 1, "service_tier": "standard"},
        }}));
    }

    fn block(&mut self, index: usize, block: Value, deltas: Vec<Value>) {
        self.event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
        if index == 0 {
            self.event("ping", json!({"type": "ping"}));
        }
        for delta in deltas {
            self.event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            );
        }
        self.event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        );
    }

    fn reply(&mut self, reply: &Reply) {
        self.start(reply);
        let mut index = 0;
        if let Some(reasoning) = &reply.reasoning {
            let mut deltas: Vec<Value> = pieces(reasoning)
                .into_iter()
                .map(|piece| json!({"type": "thinking_delta", "thinking": piece}))
                .collect();
            deltas.push(
                json!({"type": "signature_delta", "signature": "EqQBCkYIARgCKkBfakesignature"}),
            );
            self.block(
                index,
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                deltas,
            );
            index += 1;
        }
        if let Some(text) = &reply.text {
            let deltas = pieces(text)
                .into_iter()
                .map(|piece| json!({"type": "text_delta", "text": piece}))
                .collect();
            self.block(index, json!({"type": "text", "text": ""}), deltas);
            index += 1;
        }
        for (call_id, name, arguments) in &reply.calls {
            let mut deltas = vec![json!({"type": "input_json_delta", "partial_json": ""})];
            deltas.extend(
                fragments(&arguments.to_string())
                    .into_iter()
                    .map(|fragment| json!({"type": "input_json_delta", "partial_json": fragment})),
            );
            self.block(
                index,
                json!({"type": "tool_use", "id": call_id, "name": name, "input": {}}),
                deltas,
            );
            index += 1;
        }
        let stop = if reply.max_tokens {
            "max_tokens"
        } else if reply.calls.is_empty() {
            "end_turn"
        } else {
            "tool_use"
        };
        self.event(
            "message_delta",
            json!({"type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": null},
            "usage": {"output_tokens": reply.usage.1}}),
        );
        self.event("message_stop", json!({"type": "message_stop"}));
    }

    fn raw(&mut self, name: &str, data: &str) {
        self.events.push(named_event(name, data));
    }
}
