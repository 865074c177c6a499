//! Files in chat messages through `perch run`: saved for the model, sent back, hostile ones too.

use super::support::fake_discord::{
    Author, BOT_ID, Failure, FakeFile, Route, TOKEN as DISCORD_TOKEN,
};
use super::support::fake_model::Script;
use super::support::fake_telegram::{Chat, Incoming, Media, TOKEN as TELEGRAM_TOKEN};
use super::support::scenario::{Agent, Scenario, alice};
use super::support::{files_under, journal_text, names_in, user_text, write};
use perch_core::attachment::inbox_dir;
use serde_json::Value;

fn system_text(request: &Value) -> String {
    request["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn a_telegram_file_reaches_the_model_and_a_reply_attaches_a_workspace_file() {
    let agent = Scenario::telegram_dm().build();
    let (model, telegram) = (&agent.model, agent.telegram());
    let workspace = agent.path().join("workspace");
    write(&workspace, "out/report.txt", "the report body");
    std::os::unix::fs::symlink("/etc/hostname", workspace.join("out/link")).unwrap();
    let huge = std::fs::File::create(workspace.join("out/huge.bin")).unwrap();
    huge.set_len(26_000_000).unwrap();
    model.push(Script::text(
        "Here is **the report**.\n\nattach: out/report.txt\nattach: ../agent.lua\n\
         attach: `out/missing.pdf`\nattach: /workspace/out/link\nattach: out/huge.bin",
    ));
    let service = agent.start();
    let pushed = telegram.push(Incoming::document(
        &Chat::private(&alice()),
        &alice(),
        "../../etc/passwd",
        "text/plain",
        b"root:x:0:0",
        Some("what is this?"),
    ));
    agent.wait_for_a_reply();
    let stderr = service.stop();

    let inbox = inbox_dir("tg", &pushed.platform_id());
    let saved = workspace.join(&inbox).join("passwd");
    assert_eq!(std::fs::read(&saved).unwrap(), b"root:x:0:0");
    assert_eq!(names_in(&workspace.join(&inbox)), ["passwd"]);
    let request = model.last_request().body;
    assert_eq!(
        user_text(&request),
        format!("what is this?\n[attachment: /workspace/{inbox}/passwd (text/plain, 10 bytes)]")
    );
    let system = system_text(&request);
    assert!(
        system.contains("`attach: <path>`") && system.contains("/workspace/inbox/"),
        "the agent is told how files travel: {system}"
    );

    let sent = telegram.sent();
    assert_eq!(sent.len(), 1, "one document, the reply its caption");
    assert_eq!(
        sent[0].document,
        Some(("report.txt".to_owned(), b"the report body".to_vec()))
    );
    assert_eq!(sent[0].reply_to, Some(pushed.message_id));
    assert_eq!(
        sent[0].shown,
        "Here is the report.\n\n\
         (could not attach ../agent.lua: it is outside /workspace)\n\
         (could not attach out/missing.pdf: no such file)\n\
         (could not attach /workspace/out/link: a symlink is in the way)\n\
         (could not attach out/huge.bin: 26 MB is larger than the 25 MB limit)"
    );

    let secret = TELEGRAM_TOKEN.split_once(':').unwrap().1;
    let state = files_under(&agent.path().join(".perch"));
    assert!(!state.is_empty());
    for (path, bytes) in &state {
        let text = String::from_utf8_lossy(bytes);
        assert!(!text.contains(secret), "the token is in {}", path.display());
        assert!(
            !text.contains("the report body") && !text.contains("root:x:0:0"),
            "a file's bytes are in {}",
            path.display()
        );
    }
    let outbox = journal_text(&agent.path().join(".perch/outbox"));
    assert!(
        outbox.contains("\"path\":\"out/report.txt\""),
        "the outbox names the file: {outbox}"
    );
    let inbox_journal = journal_text(&agent.path().join(".perch/inbox"));
    assert!(inbox_journal.contains("\"attachments\""), "{inbox_journal}");
    assert!(!stderr.contains(secret), "{stderr}");
}

#[test]
fn a_file_too_large_is_refused_a_file_alone_still_arrives_and_a_saved_file_is_reused() {
    let agent = Scenario::telegram_dm().build();
    let (model, telegram) = (&agent.model, agent.telegram());
    let workspace = agent.path().join("workspace");
    let (alice, chat) = (alice(), Chat::private(&alice()));
    let big = telegram.push(
        Incoming::document(&chat, &alice, "big.zip", "application/zip", b"PK", None)
            .declared_size(30_000_000),
    );
    let photo = telegram.push(Incoming::media(
        &chat,
        &alice,
        Media::Photo,
        b"fresh photo bytes",
        None,
    ));
    let voice = telegram.push(Incoming::media(&chat, &alice, Media::Voice, b"OggS", None));
    let voice_dir = workspace.join(inbox_dir("tg", &voice.platform_id()));
    std::fs::create_dir_all(&voice_dir).unwrap();
    std::fs::write(voice_dir.join("audio.ogg"), b"saved before a restart").unwrap();
    for text in ["one", "two", "three"] {
        model.push(Script::text(text));
    }
    let service = agent.start();
    agent.wait_for_replies(3);
    service.stop();

    let asked = model.user_texts();
    assert_eq!(
        asked[0],
        "[attachment not saved: big.zip (application/zip, 30 MB): 30 MB is larger than the 25 MB limit]"
    );
    assert!(
        !workspace.join(inbox_dir("tg", &big.platform_id())).exists(),
        "nothing is written for a refused file"
    );
    let photo_dir = inbox_dir("tg", &photo.platform_id());
    assert_eq!(
        asked[1],
        format!("[attachment: /workspace/{photo_dir}/image.jpg (image/jpeg, 17 bytes)]"),
        "a photo without caption reaches the agent"
    );
    assert_eq!(
        std::fs::read(workspace.join(&photo_dir).join("image.jpg")).unwrap(),
        b"fresh photo bytes"
    );
    assert_eq!(
        asked[2],
        format!(
            "[attachment: /workspace/{}/audio.ogg (audio/ogg, 22 bytes)]",
            inbox_dir("tg", &voice.platform_id())
        )
    );
    assert_eq!(
        std::fs::read(voice_dir.join("audio.ogg")).unwrap(),
        b"saved before a restart",
        "an existing file is reused"
    );
    assert_eq!(
        telegram.downloads().len(),
        1,
        "only the photo was downloaded: {:?}",
        telegram.downloads()
    );
    let get_files = telegram.calls_of("GetFile").len();
    assert_eq!(
        get_files, 1,
        "the big file was refused by its declared size"
    );
}

/// A Discord agent answering in the general channel `555`.
fn discord_agent() -> Agent {
    let agent = Scenario::discord(super::delivery::GENERAL).build();
    agent.discord().guild_channel(555);
    agent
}

#[test]
fn discord_files_both_ways_with_hostile_names_made_safe() {
    let agent = discord_agent();
    let (model, discord) = (&agent.model, agent.discord());
    let workspace = agent.path().join("workspace");
    write(&workspace, "out/answer.md", "# Answer\n");
    model.push(Script::text("Done.\nattach: out/answer.md"));
    let service = agent.start();
    agent.wait_for_gateway();
    let long = format!("{}.txt", "x".repeat(300));
    let files = [
        FakeFile::new("../../etc/passwd", "text/plain", b"1"),
        FakeFile::new(".bashrc", "text/plain", b"2"),
        FakeFile::new("nul\0byte.txt", "text/plain", b"3"),
        FakeFile::new(&long, "text/plain", b"4"),
        FakeFile::new("dir/name.txt", "text/plain", b"5"),
        FakeFile::new("notes.txt", "text/plain", b"6"),
        FakeFile::new("notes.txt", "text/plain", b"7"),
    ];
    let dana = Author::user(77, "Dana");
    let asked = discord.push_files(555, &dana, &format!("<@{BOT_ID}> look"), &files);
    agent.wait_for_a_reply();
    let stderr = service.stop();

    let inbox = inbox_dir("dc", &asked.to_string());
    let short = format!("{}.txt", "x".repeat(96));
    let mut expected = vec![
        "passwd".to_owned(),
        "bashrc".to_owned(),
        "nul_byte.txt".to_owned(),
        short,
        "name.txt".to_owned(),
        "notes.txt".to_owned(),
        "notes-2.txt".to_owned(),
    ];
    let lines: Vec<String> = expected
        .iter()
        .map(|name| format!("[attachment: /workspace/{inbox}/{name} (text/plain, 1 byte)]"))
        .collect();
    assert_eq!(
        user_text(&model.last_request().body),
        format!("<@{BOT_ID}> look\n{}", lines.join("\n"))
    );
    let saved = files_under(&workspace.join("inbox"));
    assert_eq!(saved.len(), 7, "{saved:?}");
    let contents: Vec<Vec<u8>> = expected
        .iter()
        .map(|name| std::fs::read(workspace.join(&inbox).join(name)).unwrap())
        .collect();
    let bytes: Vec<Vec<u8>> = (1..=7).map(|n: u8| vec![b'0' + n]).collect();
    assert_eq!(contents, bytes);
    expected.sort();
    assert_eq!(names_in(&workspace.join(&inbox)), expected);
    assert!(!workspace.join("etc").exists() && !agent.path().join("etc").exists());
    assert!(
        discord
            .downloads()
            .iter()
            .all(|(_, authorized)| !authorized),
        "the bot token never goes to the CDN"
    );

    let posted = &discord.posted()[0];
    assert_eq!(posted.body["content"], "Done.");
    assert_eq!(
        posted.body["message_reference"]["message_id"],
        asked.to_string()
    );
    assert!(
        posted.body["nonce"]
            .as_str()
            .is_some_and(|nonce| nonce.len() <= 25)
    );
    let sent: Vec<(String, Vec<u8>)> = posted
        .files
        .iter()
        .map(|file| (file.name.clone(), file.bytes.clone()))
        .collect();
    assert_eq!(sent, [("answer.md".to_owned(), b"# Answer\n".to_vec())]);
    assert!(!stderr.contains(DISCORD_TOKEN));
}

#[test]
fn a_reply_the_platform_refuses_for_its_files_is_sent_without_them_saying_why() {
    let agent = discord_agent();
    let discord = agent.discord();
    agent.write("workspace/out/a.txt", "alpha");
    agent.model.push(Script::text("Here.\nattach: out/a.txt"));
    discord.fail_next(
        Route::CreateMessage,
        Failure::status(413, 40005, "Request entity too large"),
    );
    let service = agent.start();
    agent.wait_for_gateway();
    let asked = discord.push_message(555, &Author::user(77, "Dana"), &format!("<@{BOT_ID}> a?"));
    agent.wait_for_a_reply();
    service.stop();
    let posted = discord.posted();
    assert_eq!(posted.len(), 1);
    assert!(posted[0].files.is_empty());
    assert_eq!(
        posted[0].body["content"],
        "Here.\n\n(could not attach out/a.txt: the platform refused it: Discord answered 413 \
         (code 40005): Request entity too large)"
    );
    assert_eq!(
        posted[0].body["message_reference"]["message_id"],
        asked.to_string()
    );
    let outbox = journal_text(&agent.path().join(".perch/outbox"));
    assert!(outbox.contains("\"dropped\""), "{outbox}");
}
