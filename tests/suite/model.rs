//! The three wire APIs end to end against the fake model server: every reply shape and failure.

use super::support::fake_model::{FakeModel, Reply, Script};
use super::support::{new_agent, write};
use perch::agent::{self, AgentDir};
use perch::model::{
    self, Endpoint, Model, ModelError, ModelErrorKind, ModelReply, ModelRequest, StopReason,
    StreamEvent, ToolSpec, Usage,
};
use perch_core::config::{Api, ModelSpec, Thinking};
use perch_core::log::{Message, Part, Role};
use perch_core::name::EnvName;
use perch_core::secret::{EnvRef, Secret};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const APIS: [Api; 3] = [
    Api::OpenAiCompletions,
    Api::OpenAiResponses,
    Api::AnthropicMessages,
];

const KEY: &str = "sk-perch-test-5f0c2a7e9b1d4c3a";

fn key() -> Secret {
    EnvRef::new(EnvName::try_from("TEST_KEY").unwrap())
        .resolve(|_| Some(KEY.to_owned()))
        .unwrap()
}

fn endpoint(fake: &FakeModel) -> Endpoint {
    Endpoint {
        provider: "fake".into(),
        api: fake.api(),
        base_url: fake.base_url(),
        api_key: Some(key()),
        model: ModelSpec {
            id: "fake-model".into(),
            context_window: 128_000,
            max_tokens: 8192,
            reasoning: true,
            price: None,
        },
        timeout: Duration::from_secs(30),
    }
}

fn ask(text: &str) -> ModelRequest {
    ModelRequest {
        system: "You are terse.".into(),
        messages: vec![Message {
            role: Role::User,
            parts: vec![Part::Text { text: text.into() }],
            origins: Vec::new(),
            relay: None,
        }],
        tools: Vec::new(),
        thinking: Thinking::Off,
    }
}

async fn complete(
    model: &Arc<dyn Model>,
    request: &ModelRequest,
) -> (Result<ModelReply, ModelError>, Vec<StreamEvent>) {
    let (events, mut received) = mpsc::unbounded_channel();
    let result = model
        .complete(request, events, CancellationToken::new())
        .await;
    let mut shown = Vec::new();
    while let Ok(event) = received.try_recv() {
        shown.push(event);
    }
    (result, shown)
}

async fn reply_to(fake: &FakeModel, script: impl Into<Script>) -> (ModelReply, Vec<StreamEvent>) {
    fake.push(script);
    let model = model::connect(endpoint(fake));
    let (result, shown) = complete(&model, &ask("hello")).await;
    (
        result.unwrap_or_else(|error| panic!("{:?}: {error}", fake.api())),
        shown,
    )
}

async fn error_from(fake: &FakeModel, script: impl Into<Script>) -> ModelError {
    fake.push(script);
    let model = model::connect(endpoint(fake));
    let (result, _) = complete(&model, &ask("hello")).await;
    result.expect_err("the request fails")
}

#[tokio::test]
async fn text_streams_in_order_and_assembles() {
    for api in APIS {
        let fake = FakeModel::start(api);
        let text = "Hello there, how can I help you today?";
        let (reply, shown) = reply_to(&fake, Script::text(text)).await;
        assert_eq!(
            reply.parts,
            vec![Part::Text { text: text.into() }],
            "{api:?}"
        );
        assert_eq!(reply.stop, StopReason::End, "{api:?}");
        assert!(shown.len() > 3, "{api:?}: {shown:?}");
        let streamed: String = shown
            .iter()
            .map(|event| match event {
                StreamEvent::Text(delta) => delta.as_str(),
                other => panic!("{api:?}: {other:?}"),
            })
            .collect();
        assert_eq!(streamed, text, "{api:?}");
    }
}

#[tokio::test]
async fn an_empty_queue_answers_no_script() {
    for api in APIS {
        let fake = FakeModel::start(api);
        let model = model::connect(endpoint(&fake));
        let (result, _) = complete(&model, &ask("anyone?")).await;
        assert_eq!(
            result.unwrap().parts,
            vec![Part::Text {
                text: "(no script)".into()
            }],
            "{api:?}"
        );
    }
}

#[tokio::test]
async fn reasoning_streams_before_the_answer() {
    for api in APIS {
        let fake = FakeModel::start(api);
        let reply =
            Reply::text("It is 42.").with_reasoning("The user wants the answer, so compute it.");
        let (reply, shown) = reply_to(&fake, reply).await;
        assert_eq!(
            reply.parts,
            vec![
                Part::Reasoning {
                    text: "The user wants the answer, so compute it.".into(),
                    // Anthropic signs its thinking; the block is kept with its signature.
                    signature: (api == Api::AnthropicMessages)
                        .then(|| "EqQBCkYIARgCKkBfakesignature".to_owned()),
                },
                Part::Text {
                    text: "It is 42.".into()
                },
            ],
            "{api:?}"
        );
        let first_text = shown
            .iter()
            .position(|event| matches!(event, StreamEvent::Text(_)))
            .unwrap();
        assert!(
            shown[..first_text]
                .iter()
                .all(|event| matches!(event, StreamEvent::Reasoning(_))),
            "{api:?}: {shown:?}"
        );
        assert!(first_text > 1, "{api:?}: {shown:?}");
    }
}

#[tokio::test]
async fn parallel_tool_calls_arrive_whole_from_fragments() {
    let first = json!({"cmd": "ls -la /workspace", "timeout": 30});
    let second = json!({"path": "notes/2026-11-30.md", "lines": {"from": 1, "to": 40}});
    for api in APIS {
        let fake = FakeModel::start(api);
        let reply = Reply::text("Let me look.")
            .with_call("call_one", "bash", first.clone())
            .with_call("call_two", "read", second.clone())
            .with_usage(300, 45, 0);
        let (reply, shown) = reply_to(&fake, reply).await;
        assert_eq!(
            reply.parts,
            vec![
                Part::Text {
                    text: "Let me look.".into()
                },
                Part::ToolCall {
                    call_id: "call_one".into(),
                    name: "bash".into(),
                    arguments: first.clone()
                },
                Part::ToolCall {
                    call_id: "call_two".into(),
                    name: "read".into(),
                    arguments: second.clone()
                },
            ],
            "{api:?}"
        );
        assert_eq!(reply.stop, StopReason::ToolUse, "{api:?}");
        let calls: Vec<&StreamEvent> = shown
            .iter()
            .filter(|event| matches!(event, StreamEvent::ToolCall { .. }))
            .collect();
        assert_eq!(
            calls,
            vec![
                &StreamEvent::ToolCall {
                    call_id: "call_one".into(),
                    name: "bash".into()
                },
                &StreamEvent::ToolCall {
                    call_id: "call_two".into(),
                    name: "read".into()
                },
            ],
            "{api:?}"
        );
    }
}

#[tokio::test]
async fn usage_counts_cached_input() {
    for api in APIS {
        let fake = FakeModel::start(api);
        let (reply, _) = reply_to(&fake, Reply::text("ok").with_usage(1200, 80, 1024)).await;
        assert_eq!(
            reply.usage,
            Usage {
                input: 1200,
                output: 80,
                cached: 1024
            },
            "{api:?}"
        );
    }
}

#[tokio::test]
async fn a_reply_at_the_token_limit_says_so() {
    for api in APIS {
        let fake = FakeModel::start(api);
        let (reply, _) = reply_to(
            &fake,
            Reply::text("This answer goes on and").cut_at_max_tokens(),
        )
        .await;
        assert_eq!(reply.stop, StopReason::MaxTokens, "{api:?}");
        assert_eq!(
            reply.parts,
            vec![Part::Text {
                text: "This answer goes on and".into()
            }],
            "{api:?}"
        );
    }
}

fn tool_request() -> ModelRequest {
    ModelRequest {
        system: "You are terse.".into(),
        messages: vec![
            Message {
                role: Role::User,
                parts: vec![Part::Text {
                    text: "what is here?".into(),
                }],
                origins: Vec::new(),
                relay: None,
            },
            Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Reasoning {
                        text: "never sent back".into(),
                        signature: None,
                    },
                    Part::ToolCall {
                        call_id: "call_a".into(),
                        name: "bash".into(),
                        arguments: json!({"cmd": "ls"}),
                    },
                    Part::ToolCall {
                        call_id: "call_b".into(),
                        name: "bash".into(),
                        arguments: json!({"cmd": "id"}),
                    },
                ],
                origins: Vec::new(),
                relay: None,
            },
            Message {
                role: Role::Tool,
                parts: vec![
                    Part::ToolResult {
                        call_id: "call_a".into(),
                        output: "notes\nskills".into(),
                        is_error: false,
                    },
                    Part::ToolResult {
                        call_id: "call_b".into(),
                        output: "denied".into(),
                        is_error: true,
                    },
                ],
                origins: Vec::new(),
                relay: None,
            },
        ],
        tools: vec![ToolSpec {
            name: "bash".into(),
            description: "Run a shell command in the sandbox".into(),
            parameters: json!({"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}),
        }],
        thinking: Thinking::Medium,
    }
}

async fn sent_body(
    api: Api,
    request: &ModelRequest,
) -> (Value, super::support::fake_model::Received) {
    let fake = FakeModel::start(api);
    let model = model::connect(endpoint(&fake));
    let (result, _) = complete(&model, request).await;
    result.unwrap();
    let received = fake.last_request();
    (received.body.clone(), received)
}

#[tokio::test]
async fn chat_completions_requests_have_the_api_shape() {
    let (body, received) = sent_body(Api::OpenAiCompletions, &tool_request()).await;
    assert_eq!(received.method, "POST");
    assert_eq!(received.path, "/v1/chat/completions");
    assert_eq!(
        received.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(received.header("x-api-key"), None);
    assert_eq!(body["model"], "fake-model");
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
    assert_eq!(body["reasoning_effort"], "medium");
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "what is here?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\":\"ls\"}"}},
                {"id": "call_b", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\":\"id\"}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_a", "content": "notes\nskills"},
            {"role": "tool", "tool_call_id": "call_b", "content": "denied"},
        ])
    );
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "function": {"name": "bash",
            "description": "Run a shell command in the sandbox",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}])
    );
}

#[tokio::test]
async fn responses_requests_have_the_api_shape() {
    let (body, received) = sent_body(Api::OpenAiResponses, &tool_request()).await;
    assert_eq!(received.path, "/v1/responses");
    assert_eq!(
        received.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(body["instructions"], "You are terse.");
    assert_eq!(body["stream"], true);
    assert_eq!(body["store"], false);
    assert_eq!(
        body["reasoning"],
        json!({"effort": "medium", "summary": "auto"})
    );
    assert_eq!(
        body["input"],
        json!([
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "what is here?"}]},
            {"type": "function_call", "call_id": "call_a", "name": "bash", "arguments": "{\"cmd\":\"ls\"}"},
            {"type": "function_call", "call_id": "call_b", "name": "bash", "arguments": "{\"cmd\":\"id\"}"},
            {"type": "function_call_output", "call_id": "call_a", "output": "notes\nskills"},
            {"type": "function_call_output", "call_id": "call_b", "output": "denied"},
        ])
    );
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "name": "bash", "description": "Run a shell command in the sandbox",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
            "strict": false}])
    );
}

#[tokio::test]
async fn anthropic_requests_have_the_api_shape() {
    let (body, received) = sent_body(Api::AnthropicMessages, &tool_request()).await;
    assert_eq!(received.path, "/v1/messages");
    assert_eq!(received.header("x-api-key"), Some(KEY));
    assert_eq!(received.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(received.header("authorization"), None);
    assert_eq!(body["system"], "You are terse.");
    assert_eq!(body["max_tokens"], 8192);
    assert_eq!(body["stream"], true);
    assert_eq!(
        body.get("thinking"),
        None,
        "no thinking while a tool-use turn continues"
    );
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "what is here?"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_a", "name": "bash", "input": {"cmd": "ls"}},
                {"type": "tool_use", "id": "call_b", "name": "bash", "input": {"cmd": "id"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": "notes\nskills"},
                {"type": "tool_result", "tool_use_id": "call_b", "content": "denied", "is_error": true},
            ]},
        ])
    );
    assert_eq!(
        body["tools"],
        json!([{"name": "bash", "description": "Run a shell command in the sandbox",
            "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}])
    );

    let mut fresh_turn = ask("and now?");
    fresh_turn.thinking = Thinking::High;
    let (body, _) = sent_body(Api::AnthropicMessages, &fresh_turn).await;
    assert_eq!(
        body["thinking"],
        json!({"type": "enabled", "budget_tokens": 7168})
    );
}

#[tokio::test]
async fn a_local_server_gets_no_key() {
    for api in APIS {
        let fake = FakeModel::start(api);
        let mut endpoint = endpoint(&fake);
        endpoint.api_key = None;
        let model = model::connect(endpoint);
        let (result, _) = complete(&model, &ask("hi")).await;
        result.unwrap();
        let received = fake.last_request();
        assert_eq!(received.header("authorization"), None, "{api:?}");
        assert_eq!(received.header("x-api-key"), None, "{api:?}");
    }
}

#[tokio::test]
async fn rate_limits_carry_retry_after() {
    for api in APIS {
        let fake = FakeModel::start(api);
        let error = error_from(
            &fake,
            Script::status(429, "Rate limit reached for requests").retry_after("7"),
        )
        .await;
        assert_eq!(
            error.kind,
            ModelErrorKind::RateLimited {
                retry_after: Some(Duration::from_secs(7))
            },
            "{api:?}"
        );
        assert_eq!(error.kind.retry(), Some(Some(Duration::from_secs(7))));
        assert_eq!(error.provider, "fake");
        assert_eq!(error.model, "fake-model");
    }
}

#[tokio::test]
async fn server_errors_are_retryable() {
    for api in APIS {
        let fake = FakeModel::start(api);
        let error = error_from(
            &fake,
            Script::status(500, "The server had an error processing your request"),
        )
        .await;
        let ModelErrorKind::Server {
            status: 500,
            message,
        } = &error.kind
        else {
            panic!("{api:?}: {error:?}");
        };
        assert!(
            message.contains("The server had an error"),
            "{api:?}: {message}"
        );
        assert_eq!(error.kind.retry(), Some(None));
    }
}

#[tokio::test]
async fn a_rejected_key_is_never_repeated() {
    for api in APIS {
        let fake = FakeModel::start(api);
        let echo = match api {
            Api::AnthropicMessages => {
                json!({"type": "error", "error": {"type": "authentication_error",
                "message": format!("invalid x-api-key {KEY}")}})
            }
            _ => json!({"error": {"message": format!("Incorrect API key provided: {KEY}."),
                "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}),
        };
        let error = error_from(&fake, Script::status_body(401, &echo.to_string())).await;
        assert!(
            matches!(&error.kind, ModelErrorKind::Rejected { status: 401, .. }),
            "{api:?}: {error:?}"
        );
        assert_eq!(error.kind.retry(), None);
        let shown = format!("{error} {error:?}");
        assert!(!shown.contains(KEY), "{api:?}: {shown}");
        assert!(shown.contains("<redacted>"), "{api:?}: {shown}");
    }
}

#[tokio::test]
async fn errors_inside_the_stream_are_classified() {
    let cases = [
        (Api::OpenAiCompletions, "server_error", 500),
        (Api::OpenAiResponses, "server_error", 500),
        (Api::AnthropicMessages, "overloaded_error", 529),
    ];
    for (api, code, expected) in cases {
        let fake = FakeModel::start(api);
        let error = error_from(&fake, Script::stream_error(code, "Overloaded")).await;
        assert!(
            matches!(error.kind, ModelErrorKind::Server { status, .. } if status == expected),
            "{api:?}: {error:?}"
        );
        let fake = FakeModel::start(api);
        let limited = error_from(
            &fake,
            Script::stream_error(
                if api == Api::AnthropicMessages {
                    "rate_limit_error"
                } else {
                    "rate_limit_exceeded"
                },
                "slow down",
            ),
        )
        .await;
        assert_eq!(
            limited.kind,
            ModelErrorKind::RateLimited { retry_after: None },
            "{api:?}"
        );
    }
}

#[tokio::test]
async fn a_line_that_is_not_json_is_garbage() {
    for api in APIS {
        let fake = FakeModel::start(api);
        let error = error_from(&fake, Script::Garbage).await;
        assert!(
            matches!(error.kind, ModelErrorKind::Garbage { .. }),
            "{api:?}: {error:?}"
        );
        assert_eq!(error.kind.retry(), None);
    }
}

#[tokio::test]
async fn a_stream_cut_mid_tool_call_is_a_disconnect() {
    for api in APIS {
        let fake = FakeModel::start(api);
        let error = error_from(&fake, Script::CutMidToolCall).await;
        assert!(
            matches!(error.kind, ModelErrorKind::Disconnected { .. }),
            "{api:?}: {error:?}"
        );
        assert_eq!(error.kind.retry(), Some(None));
    }
}

#[tokio::test]
async fn a_stream_that_ends_before_its_last_event_is_a_disconnect() {
    for api in APIS {
        let fake = FakeModel::start(api);
        let error = error_from(&fake, Script::EndMidToolCall).await;
        let ModelErrorKind::Disconnected { detail } = &error.kind else {
            panic!("{api:?}: {error:?}");
        };
        assert!(
            detail.contains("ended before the reply was complete"),
            "{api:?}: {detail}"
        );
    }
}

#[tokio::test]
async fn a_stalled_stream_times_out() {
    for api in APIS {
        let fake = FakeModel::start(api);
        fake.push(Script::Stall);
        let mut endpoint = endpoint(&fake);
        endpoint.timeout = Duration::from_millis(300);
        let model = model::connect(endpoint);
        let (result, shown) = complete(&model, &ask("hello")).await;
        assert_eq!(result.unwrap_err().kind, ModelErrorKind::Timeout, "{api:?}");
        assert_eq!(shown, vec![StreamEvent::Text("Thinking".into())], "{api:?}");
    }
}

#[tokio::test]
async fn cancelling_ends_the_request() {
    for api in APIS {
        let fake = FakeModel::start(api);
        fake.push(Script::Stall);
        let model = model::connect(endpoint(&fake));
        let request = ask("hello");
        let cancel = CancellationToken::new();
        let (events, mut shown) = mpsc::unbounded_channel();
        let running = {
            let model = model.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move { model.complete(&request, events, cancel).await })
        };
        assert_eq!(
            shown.recv().await,
            Some(StreamEvent::Text("Thinking".into())),
            "{api:?}"
        );
        cancel.cancel();
        let error = running.await.unwrap().unwrap_err();
        assert_eq!(error.kind, ModelErrorKind::Cancelled, "{api:?}");
        assert_eq!(error.kind.retry(), None);
    }
}

#[tokio::test]
async fn an_unreachable_server_is_a_disconnect() {
    let fake = FakeModel::start(Api::OpenAiResponses);
    let endpoint = endpoint(&fake);
    drop(fake);
    let model = model::connect(endpoint);
    let (result, _) = complete(&model, &ask("hello")).await;
    let error = result.unwrap_err();
    assert!(
        matches!(error.kind, ModelErrorKind::Disconnected { .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn the_agent_directory_names_the_endpoint() {
    let fake = FakeModel::start(Api::AnthropicMessages);
    let dir = new_agent();
    write(
        dir.path(),
        "agent.lua",
        "agent { model = \"fake/claude-fake\", thinking = \"low\" }\n",
    );
    write(
        dir.path(),
        "models.yml",
        &fake.models_yml_with_key("fake", "claude-fake", "FAKE_MODEL_KEY"),
    );
    let agent = agent::load(&AgentDir::open(dir.path()).unwrap())
        .unwrap_or_else(|problems| panic!("{problems}"));

    let missing = model::endpoint_for(&agent, |_| None).unwrap_err();
    assert!(missing.contains("FAKE_MODEL_KEY"), "{missing}");
    assert!(missing.contains("models.yml"), "{missing}");

    let endpoint = model::endpoint_for(&agent, |name| {
        (name == "FAKE_MODEL_KEY").then(|| KEY.to_owned())
    })
    .unwrap();
    assert_eq!(endpoint.provider, "fake");
    assert_eq!(endpoint.api, Api::AnthropicMessages);
    assert_eq!(endpoint.base_url, fake.base_url());
    assert_eq!(endpoint.model.id, "claude-fake");
    assert!(!format!("{endpoint:?}").contains(KEY));
    let model = model::connect(endpoint);
    let (result, _) = complete(&model, &ask("hello")).await;
    assert_eq!(
        result.unwrap().parts,
        vec![Part::Text {
            text: "(no script)".into()
        }]
    );
    assert_eq!(fake.last_request().header("x-api-key"), Some(KEY));

    write(
        dir.path(),
        "models.yml",
        &fake.models_yml("fake", "claude-fake"),
    );
    let agent = agent::load(&AgentDir::open(dir.path()).unwrap())
        .unwrap_or_else(|problems| panic!("{problems}"));
    assert!(
        model::endpoint_for(&agent, |_| None)
            .unwrap()
            .api_key
            .is_none()
    );
}
