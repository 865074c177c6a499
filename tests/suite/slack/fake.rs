//! The fake Slack's own rules on the wire, each read with perch's core.

use super::*;

#[tokio::test]
async fn each_method_wants_its_own_token() {
    let fake = FakeSlack::start();
    let cases: &[(Option<&str>, &str, &str)] = &[
        (None, "auth.test", "not_authed"),
        (Some("xoxb-1-2-somebodyelse"), "auth.test", "invalid_auth"),
        (Some(APP_TOKEN), "auth.test", "not_allowed_token_type"),
        (
            Some(BOT_TOKEN),
            "apps.connections.open",
            "not_allowed_token_type",
        ),
        (Some(BOT_TOKEN), "chat.deleteEverything", "unknown_method"),
    ];
    for (token, method, expected) in cases {
        let (status, retry_after, body) = call(&fake, *token, method, &[]).await;
        let failure = read_answer(status, retry_after.as_deref(), &body).unwrap_err();
        assert_eq!(
            failure,
            WebFailure::Error {
                error: (*expected).into(),
                needed: None
            },
            "{method} with {token:?}"
        );
    }
    let auth: AuthTest = bot_call(&fake, "auth.test", &[]).await.unwrap();
    assert_eq!(auth.me(), me());
    assert_eq!(fake.calls().len(), cases.len() + 1);
    assert_eq!(fake.calls()[0].token, "none");
}

#[tokio::test]
async fn a_refused_app_token_is_a_refusal_of_the_socket() {
    let fake = FakeSlack::start();
    fake.refuse_connections(Some("account_inactive"));
    let (status, retry_after, body) =
        call(&fake, Some(APP_TOKEN), "apps.connections.open", &[]).await;
    let failure = read_answer(status, retry_after.as_deref(), &body).unwrap_err();
    assert!(failure.refuses_credentials(), "{failure}");
    fake.refuse_connections(None);
    let mut socket = open_socket(&fake).await;
    hello(&mut socket).await;
    assert_eq!(fake.connections_opened(), 1);
}

#[tokio::test]
async fn a_ticket_opens_one_connection() {
    let fake = FakeSlack::start();
    let (_, _, body) = call(&fake, Some(APP_TOKEN), "apps.connections.open", &[]).await;
    let url: ConnectionsOpen = read(200, None, &body).unwrap();
    assert!(url.url.starts_with("ws://127.0.0.1:"), "{}", url.url);
    let (mut first, _) = tokio_tungstenite::connect_async(url.url.clone())
        .await
        .unwrap();
    hello(&mut first).await;
    let again = tokio_tungstenite::connect_async(url.url).await;
    assert!(again.is_err(), "a used ticket opened a second connection");
    let forged = fake
        .api_url()
        .replace("http://", "ws://")
        .replace("/api/", "/link/?ticket=0");
    assert!(tokio_tungstenite::connect_async(forged).await.is_err());
}

#[tokio::test]
async fn a_mention_comes_as_message_and_app_mention_and_is_held_until_acknowledged() {
    let fake = FakeSlack::start();
    let mut socket = open_socket(&fake).await;
    hello(&mut socket).await;
    let ts = fake.push_message("C123ABC456", &ada(), &format!("<@{BOT_USER}> hello"));
    let message = next_envelope(&mut socket).await;
    let mention = next_envelope(&mut socket).await;
    assert_eq!(message.payload["event"]["type"], "message");
    assert_eq!(mention.payload["event"]["type"], "app_mention");
    assert_ne!(message.payload["event_id"], mention.payload["event_id"]);
    let (message_event, mention_event) = (
        classify(&message.payload, &me())
            .inbound_event(Some("Ada"))
            .unwrap(),
        classify(&mention.payload, &me())
            .inbound_event(Some("Ada"))
            .unwrap(),
    );
    assert_eq!(message_event, mention_event);
    assert_eq!(message_event.platform_id, format!("C123ABC456:{ts}"));
    assert!(message_event.addressed);
    assert_eq!(fake.unacked(), 2);
    acknowledge(&mut socket, &message).await;
    acknowledge(&mut socket, &mention).await;
    until("both acknowledged", || fake.unacked() == 0).await;
    assert_eq!(fake.acked(), vec![message.envelope_id, mention.envelope_id]);

    fake.push_message("D024BE91L", &ada(), &format!("<@{BOT_USER}> in a DM"));
    let dm = next_envelope(&mut socket).await;
    assert!(
        classify(&dm.payload, &me())
            .inbound_event(None)
            .unwrap()
            .direct
    );
    acknowledge(&mut socket, &dm).await;
    until("the DM acknowledged", || fake.unacked() == 0).await;
    assert_eq!(fake.delivered().len(), 3, "a DM mention comes once");
}

#[tokio::test]
async fn an_envelope_not_acknowledged_comes_again_with_its_retry_count() {
    let fake = FakeSlack::start();
    fake.set_ack_timeout(Duration::from_millis(300));
    fake.push_message("C1", &ada(), "sent while nobody listens");
    let mut socket = open_socket(&fake).await;
    hello(&mut socket).await;
    let first = next_envelope(&mut socket).await;
    assert_eq!(
        (first.retry_attempt, first.retry_reason.as_deref()),
        (0, None)
    );
    let again = next_envelope(&mut socket).await;
    assert_eq!(again.envelope_id, first.envelope_id);
    assert_eq!(
        (again.retry_attempt, again.retry_reason.as_deref()),
        (1, Some("timeout"))
    );
    assert_eq!(again.payload, first.payload);

    fake.set_ack_timeout(Duration::from_secs(60));
    drop(socket);
    until("the connection gone", || fake.live_connections() == 0).await;
    let mut socket = open_socket(&fake).await;
    hello(&mut socket).await;
    let after_reconnect = next_envelope(&mut socket).await;
    assert_eq!(after_reconnect.envelope_id, first.envelope_id);
    assert!(
        after_reconnect.retry_attempt >= 2,
        "{}",
        after_reconnect.retry_attempt
    );
    acknowledge(&mut socket, &after_reconnect).await;
    until("acknowledged", || fake.unacked() == 0).await;

    fake.set_ack_timeout(Duration::from_millis(300));
    fake.push_message("C1", &ada(), "never acknowledged");
    let mut attempts = Vec::new();
    while let Ok(Some(Frame::Events(envelope))) =
        tokio::time::timeout(Duration::from_secs(3), next_frame(&mut socket)).await
    {
        attempts.push(envelope.retry_attempt);
    }
    assert_eq!(attempts, vec![0, 1, 2, 3]);
    until("given up", || fake.abandoned().len() == 1).await;
}

#[tokio::test]
async fn refresh_and_warning_say_so_and_the_old_connection_closes_after_the_grace() {
    let fake = FakeSlack::start();
    fake.set_refresh_grace(Duration::from_millis(200));
    for (ask, reason) in [
        (
            FakeSlack::request_refresh as fn(&FakeSlack),
            DisconnectReason::RefreshRequested,
        ),
        (FakeSlack::warn, DisconnectReason::Warning),
    ] {
        let mut old = open_socket(&fake).await;
        hello(&mut old).await;
        ask(&fake);
        assert_eq!(
            next_frame(&mut old).await,
            Some(Frame::Disconnect { reason })
        );
        let mut new = open_socket(&fake).await;
        hello(&mut new).await;
        assert_eq!(
            next_frame(&mut old).await,
            None,
            "the old connection closes"
        );
        until("one connection", || fake.live_connections() == 1).await;
        fake.push_message("C1", &ada(), "on the new connection");
        let envelope = next_envelope(&mut new).await;
        acknowledge(&mut new, &envelope).await;
        until("acknowledged", || fake.unacked() == 0).await;
        drop(new);
        until("no connection", || fake.live_connections() == 0).await;
    }
}

#[tokio::test]
async fn socket_mode_turned_off_disconnects_every_connection_with_link_disabled() {
    let fake = FakeSlack::start();
    let mut socket = open_socket(&fake).await;
    hello(&mut socket).await;
    fake.disable_socket_mode();
    assert_eq!(
        next_frame(&mut socket).await,
        Some(Frame::Disconnect {
            reason: DisconnectReason::LinkDisabled
        })
    );
    assert_eq!(next_frame(&mut socket).await, None);
    let mut later = open_socket(&fake).await;
    assert_eq!(
        next_frame(&mut later).await,
        Some(Frame::Disconnect {
            reason: DisconnectReason::LinkDisabled
        })
    );
}

#[tokio::test]
async fn edits_subtypes_and_unreadable_frames_reach_the_client() {
    let fake = FakeSlack::start();
    let mut socket = open_socket(&fake).await;
    hello(&mut socket).await;
    let ts = fake.push_message("C1", &ada(), "first");
    let first = next_envelope(&mut socket).await;
    fake.push_edit("C1", &ada(), &ts, "second");
    let edit = next_envelope(&mut socket).await;
    let Classified::Edited { edit_of, .. } = classify(&edit.payload, &me()) else {
        panic!("not an edit: {:?}", edit.payload);
    };
    assert_eq!(edit_of, format!("C1:{ts}"));
    fake.push_subtype("C1", &ada(), "a new kind", "huddle_thread_v9");
    let unknown = next_envelope(&mut socket).await;
    assert!(matches!(
        classify(&unknown.payload, &me()),
        Classified::Refused { .. }
    ));
    let guest = SlackUser::connect_guest("U0GUEST", "Grace", "T0THEIRS");
    fake.push_message("C1", &guest, "from another organisation");
    let shared = next_envelope(&mut socket).await;
    let Classified::Message(message) = classify(&shared.payload, &me()) else {
        panic!("{:?}", shared.payload);
    };
    assert_eq!(message.other_team.as_deref(), Some("T0THEIRS"));
    fake.push_frame("{\"type\":\"events_api\",\"envelope_id\":\"broken\"}");
    assert!(matches!(
        next_frame(&mut socket).await,
        Some(Frame::Unreadable { envelope_id: Some(id), .. }) if id == "broken"
    ));
    for envelope in [first, edit, unknown, shared] {
        acknowledge(&mut socket, &envelope).await;
    }
    until("all acknowledged", || fake.unacked() == 0).await;
}

#[tokio::test]
async fn posts_are_checked_rate_limited_and_echoed_as_the_bots_own() {
    let fake = FakeSlack::start();
    fake.channel("C1", Kind::Channel);
    let mut socket = open_socket(&fake).await;
    hello(&mut socket).await;
    let posted: Posted = bot_call(
        &fake,
        "chat.postMessage",
        &[
            ("channel", "C1"),
            ("text", "hello *there*"),
            ("thread_ts", "1.2"),
        ],
    )
    .await
    .unwrap();
    assert_eq!(posted.channel, "C1");
    let sent = &fake.posted()[0];
    assert_eq!(
        (sent.text.as_str(), sent.thread_ts.as_deref()),
        ("hello *there*", Some("1.2"))
    );
    let echo = next_envelope(&mut socket).await;
    assert_eq!(
        classify(&echo.payload, &me()),
        Classified::Own {
            channel: "C1".into(),
            ts: posted.ts.clone()
        }
    );

    fake.fail_next("chat.postMessage", Failure::RateLimited { seconds: 7 });
    let limited = bot_call::<Posted>(
        &fake,
        "chat.postMessage",
        &[("channel", "C1"), ("text", "x")],
    )
    .await;
    assert_eq!(
        limited,
        Err(WebFailure::RateLimited {
            retry_after: Duration::from_secs(7)
        })
    );
    fake.fail_next("chat.postMessage", Failure::Status(502));
    let upstream = bot_call::<Posted>(
        &fake,
        "chat.postMessage",
        &[("channel", "C1"), ("text", "x")],
    )
    .await;
    assert_eq!(upstream, Err(WebFailure::Status { status: 502 }));
    let too_long = "x".repeat(40_001);
    let refusals: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            vec![("channel", "C404"), ("text", "x")],
            "channel_not_found",
        ),
        (vec![("channel", "C1")], "no_text"),
        (vec![("channel", "C1"), ("text", &too_long)], "msg_too_long"),
    ];
    for (arguments, expected) in refusals {
        let failure = bot_call::<Posted>(&fake, "chat.postMessage", &arguments)
            .await
            .unwrap_err();
        assert_eq!(
            failure,
            WebFailure::Error {
                error: expected.into(),
                needed: None
            }
        );
    }
    assert_eq!(fake.posted().len(), 1);
}

#[tokio::test]
async fn a_file_goes_up_in_three_steps_and_down_only_with_the_bot_token() {
    let fake = FakeSlack::start();
    fake.channel("C1", Kind::Channel);
    fake.echo_own_posts(false);
    let bytes = b"report bytes";
    let slot: UploadUrl = bot_call(
        &fake,
        "files.getUploadURLExternal",
        &[
            ("filename", "report.txt"),
            ("length", &bytes.len().to_string()),
        ],
    )
    .await
    .unwrap();
    let files = json!([{"id": slot.file_id, "title": "report.txt"}]).to_string();
    let early = bot_call::<CompletedUpload>(
        &fake,
        "files.completeUploadExternal",
        &[("files", &files), ("channel_id", "C1")],
    )
    .await;
    assert!(matches!(early, Err(WebFailure::Error { error, .. }) if error == "file_not_found"));
    let uploaded = reqwest::Client::new()
        .post(&slot.upload_url)
        .body(bytes.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(uploaded.status(), 200);
    let done: CompletedUpload = bot_call(
        &fake,
        "files.completeUploadExternal",
        &[
            ("files", &files),
            ("channel_id", "C1"),
            ("thread_ts", "1.2"),
            ("initial_comment", "here"),
        ],
    )
    .await
    .unwrap();
    assert_eq!(done.files[0].id, slot.file_id);
    let posted = &fake.posted()[0];
    assert_eq!(
        posted.files,
        vec![("report.txt".to_owned(), bytes.to_vec())]
    );
    assert_eq!(posted.thread_ts.as_deref(), Some("1.2"));

    let mut socket = open_socket(&fake).await;
    hello(&mut socket).await;
    fake.push_file(
        "D1",
        &ada(),
        "a picture",
        "cat.png",
        "image/png",
        b"\x89PNG",
    );
    let envelope = next_envelope(&mut socket).await;
    let event = classify(&envelope.payload, &me())
        .inbound_event(None)
        .unwrap();
    let url = &event.attachments[0].source;
    assert!(
        perch_core::slack::web::sends_token_to(&fake.api_url(), url),
        "{url}"
    );
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let anonymous = client.get(url).send().await.unwrap();
    assert_eq!(anonymous.status(), 302);
    let with_token = client
        .get(url)
        .header("authorization", format!("Bearer {BOT_TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(with_token.bytes().await.unwrap().as_ref(), b"\x89PNG");
    fake.redirect_downloads_to("http://198.51.100.7/elsewhere");
    let redirected = client
        .get(url)
        .header("authorization", format!("Bearer {BOT_TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(redirected.status(), 302);
    assert_eq!(
        fake.downloads()
            .iter()
            .map(|(_, token)| *token)
            .collect::<Vec<_>>(),
        vec![false, true, true]
    );
}

#[tokio::test]
async fn users_info_names_people_and_knows_their_workspace() {
    let fake = FakeSlack::start();
    fake.user(&ada());
    fake.user(&SlackUser::connect_guest("U0GUEST", "Grace", "T0THEIRS"));
    let info: UserInfo = bot_call(&fake, "users.info", &[("user", "U061F7AUR")])
        .await
        .unwrap();
    assert_eq!(info.user.display_name(), "Ada");
    let guest: UserInfo = bot_call(&fake, "users.info", &[("user", "U0GUEST")])
        .await
        .unwrap();
    assert_eq!(guest.user.team_id.as_deref(), Some("T0THEIRS"));
    let bot: UserInfo = bot_call(&fake, "users.info", &[("user", BOT_USER)])
        .await
        .unwrap();
    assert!(bot.user.is_bot);
    let unknown = bot_call::<UserInfo>(&fake, "users.info", &[("user", "U404")]).await;
    assert!(matches!(unknown, Err(WebFailure::Error { error, .. }) if error == "user_not_found"));
}

#[tokio::test]
async fn a_lost_connection_hands_its_envelopes_to_the_next() {
    let fake = FakeSlack::start();
    let mut socket = open_socket(&fake).await;
    hello(&mut socket).await;
    fake.push_message("C1", &ada(), "in flight");
    let first = next_envelope(&mut socket).await;
    fake.drop_connections();
    assert_eq!(next_frame(&mut socket).await, None);
    let mut next = open_socket(&fake).await;
    hello(&mut next).await;
    let again = next_envelope(&mut next).await;
    assert_eq!(
        (again.envelope_id.as_str(), again.retry_attempt),
        (first.envelope_id.as_str(), 1)
    );
}

#[test]
fn every_fixture_names_its_source_and_holds_a_body() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/slack");
    let mut read = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|extension| extension != "json") {
            continue;
        }
        let file: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            file["source"]
                .as_str()
                .is_some_and(|source| source.starts_with("https://docs.slack.dev/")),
            "{name}"
        );
        assert!(file["body"].is_object(), "{name}");
        if name.starts_with("web-") {
            assert!(
                file["status"].is_u64() && file["headers"].is_object(),
                "{name}"
            );
        }
        read += 1;
    }
    assert!(read >= 18, "{read} fixtures");
}
