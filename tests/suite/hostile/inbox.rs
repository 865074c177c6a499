//! Files in chat played against the workspace: a chat user filling `workspace/inbox/` past its
//! cap, and a reply attaching a file hard-linked to one outside the agent.

use super::super::support::fake_model::Script;
use super::super::support::fake_telegram::{Chat, Incoming};
use super::super::support::scenario::alice;
use super::super::support::scenario::{Agent, Scenario};
use super::super::support::{names_in, write};
use perch_core::attachment::INBOX_LIMIT;
use std::path::Path;

/// What earlier messages left in the inbox: `inbox/tg/earlier/old.bin`, a sparse file of
/// `size` bytes, and `inbox/tg/earlier/note.txt`, whose content must survive.
fn earlier_files(workspace: &Path, size: u64) {
    let earlier = workspace.join("inbox/tg/earlier");
    std::fs::create_dir_all(&earlier).unwrap();
    std::fs::File::create(earlier.join("old.bin"))
        .unwrap()
        .set_len(size)
        .unwrap();
    std::fs::write(earlier.join("note.txt"), "kept").unwrap();
}

/// Sends a document of `bytes` named `name` (announced as `declared` bytes when given), and
/// waits for the answer the model is given now; the text the agent read for it.
fn send_file(
    agent: &Agent,
    name: &str,
    bytes: &[u8],
    declared: Option<u64>,
    answer: &str,
) -> String {
    let before = agent.replies();
    agent.model.push(Script::text(answer));
    let mut incoming = Incoming::document(
        &Chat::private(&alice()),
        &alice(),
        name,
        "text/plain",
        bytes,
        Some(name),
    );
    if let Some(size) = declared {
        incoming = incoming.declared_size(size);
    }
    agent.telegram().push(incoming);
    agent.wait_for_replies(before + 1);
    agent.model.user_texts().pop().unwrap()
}

#[test]
fn a_chat_filling_the_inbox_past_its_cap_gets_each_file_refused_and_every_message_answered() {
    let agent = Scenario::telegram_dm().build();
    let workspace = agent.path().join("workspace");
    // Earlier files leave 30 bytes of room.
    earlier_files(&workspace, INBOX_LIMIT - 30 - 4);
    let service = agent.start();

    let fits = send_file(&agent, "fits.txt", &[b'a'; 20], None, "one");
    assert!(
        fits.starts_with("fits.txt\n[attachment: /workspace/inbox/tg/")
            && fits.ends_with("/fits.txt (text/plain, 20 bytes)]"),
        "{fits}"
    );
    let full = "/workspace/inbox holds 250 MB and may hold at most 250 MB; delete files there to make room";
    // Refused by its declared size, before any download.
    let declared = send_file(&agent, "declared.txt", &[b'b'; 20], None, "two");
    assert_eq!(
        declared,
        format!(
            "declared.txt\n[attachment not saved: declared.txt (text/plain, 20 bytes): {full}]"
        )
    );
    // Announced as one byte: refused by what the download brought.
    let understated = send_file(&agent, "understated.txt", &[b'c'; 20], Some(1), "three");
    assert_eq!(
        understated,
        format!(
            "understated.txt\n[attachment not saved: understated.txt (text/plain, 1 byte): {full}]"
        )
    );
    assert_eq!(
        agent.telegram().downloads().len(),
        2,
        "the declared size kept one file from being downloaded"
    );

    // Once files are deleted (by the agent, in the guest), files fit again.
    std::fs::remove_file(workspace.join("inbox/tg/earlier/old.bin")).unwrap();
    let after = send_file(&agent, "after.txt", &[b'd'; 20], None, "four");
    assert!(
        after.ends_with("/after.txt (text/plain, 20 bytes)]"),
        "{after}"
    );
    let stderr = service.stop();

    let sent: Vec<String> = agent
        .telegram()
        .sent()
        .iter()
        .map(|message| message.shown.clone())
        .collect();
    assert_eq!(
        sent,
        ["one", "two", "three", "four"],
        "every message answered"
    );
    for refused in ["declared.txt", "understated.txt"] {
        assert!(
            stderr.contains(&format!("was not saved: {refused}: {full}")),
            "the operator is told: {stderr}"
        );
    }
    let mut saved: Vec<String> = Vec::new();
    for dir in names_in(&workspace.join("inbox/tg")) {
        saved.extend(names_in(&workspace.join("inbox/tg").join(dir)));
    }
    saved.sort();
    assert_eq!(
        saved,
        ["after.txt", "fits.txt", "note.txt"],
        "nothing else lost"
    );
    assert_eq!(
        std::fs::read_to_string(workspace.join("inbox/tg/earlier/note.txt")).unwrap(),
        "kept"
    );
}

#[test]
fn a_reply_attaching_a_hard_linked_file_sends_nothing_of_it() {
    let host = tempfile::tempdir().unwrap();
    let secret = host.path().join("secret.txt");
    std::fs::write(&secret, "host-only-secret-9b3e").unwrap();
    let agent = Scenario::telegram_dm().build();
    let workspace = agent.path().join("workspace");
    write(&workspace, "out/report.txt", "the report");
    std::fs::hard_link(&secret, workspace.join("out/linked.txt")).unwrap();
    agent.model.push(Script::text(
        "Here.\nattach: out/report.txt\nattach: out/linked.txt",
    ));
    let service = agent.start();
    agent.send(&alice(), "send me the files");
    agent.wait_for_a_reply();
    let stderr = service.stop();

    let sent = agent.telegram().sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].document,
        Some(("report.txt".to_owned(), b"the report".to_vec()))
    );
    assert_eq!(
        sent[0].shown,
        "Here.\n\n(could not attach out/linked.txt: it has 2 hard links, and perch reads no \
         workspace file linked from elsewhere)"
    );
    let outbox = super::super::support::journal_text(&agent.path().join(".perch/outbox"));
    assert!(outbox.contains("\"path\":\"out/report.txt\""), "{outbox}");
    assert!(!outbox.contains("\"path\":\"out/linked.txt\""), "{outbox}");
    for text in [outbox, stderr, format!("{sent:?}")] {
        assert!(!text.contains("host-only-secret"), "{text}");
    }
}
