//! The harness the scenarios share, and nothing else: the fakes of the chat platforms and of the
//! model server (and the real Synapse), the one way to wait, the typed reader of `perch status`,
//! and the [`scenario::Scenario`] that runs `perch run` on them.

mod binary;
pub mod container;
pub mod counting_proxy;
pub mod crash;
pub mod fake_discord;
pub mod fake_model;
pub mod fake_slack;
pub mod fake_telegram;
pub mod flock;
mod http;
#[cfg(feature = "sandbox-double")]
pub mod in_process;
pub mod procfs;
pub mod receiving;
pub mod scenario;
pub mod status;
pub mod synapse;
pub mod wait;

pub use binary::*;
pub use fake_model::{last_user_content, user_text, without_origins};
use perch::channel::{BoxFuture, Connector, Delivery, DeliveryError, Receipt};

/// What the connector tests post most: one message without files.
pub trait PostText {
    /// [`Connector::post`] with no files.
    fn deliver<'a>(
        &'a self,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<Receipt, DeliveryError>>;
}

impl<C: Connector + ?Sized> PostText for C {
    fn deliver<'a>(
        &'a self,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<Receipt, DeliveryError>> {
        self.post(delivery, &[])
    }
}

/// The code in a pairing offer: the last word of its first `` `command` ``.
pub fn pairing_code(offer: &str) -> String {
    offer
        .split('`')
        .nth(1)
        .and_then(|command| command.split_whitespace().last())
        .unwrap_or_else(|| panic!("a pairing code in {offer:?}"))
        .to_owned()
}

/// Every regular file under `dir`, with its bytes; symlinks are not followed, and what goes
/// away while it is read (a running service's files) is passed over.
pub fn files_under(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for path in entries.filter_map(Result::ok).map(|entry| entry.path()) {
        match std::fs::symlink_metadata(&path).map(|meta| meta.file_type()) {
            Ok(kind) if kind.is_dir() => found.extend(files_under(&path)),
            Ok(kind) if kind.is_file() => {
                if let Ok(bytes) = std::fs::read(&path) {
                    found.push((path, bytes));
                }
            }
            _ => {}
        }
    }
    found
}

/// The text of every file under `dir` (a journal's segments), in no particular order.
pub fn journal_text(dir: &std::path::Path) -> String {
    files_under(dir)
        .iter()
        .map(|(_, bytes)| String::from_utf8_lossy(bytes).into_owned())
        .collect()
}

/// Every JSON line of the `.jsonl` files under `dir`.
pub fn journal_lines(dir: &std::path::Path) -> Vec<serde_json::Value> {
    files_under(dir)
        .iter()
        .filter(|(path, _)| path.extension().is_some_and(|ext| ext == "jsonl"))
        .flat_map(|(_, bytes)| {
            String::from_utf8_lossy(bytes)
                .lines()
                .filter_map(|line| serde_json::from_str(line).ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Checks that every conversation of `requests` (the text before `-m` in each user turn, as in
/// `c7-m3`) reached the model in order, `<conversation>-m0` first; how many conversations there
/// were.
pub fn conversations_in_order(requests: &[fake_model::Received]) -> usize {
    let mut seen: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
    for request in requests {
        let text = user_text(&request.body);
        let (chat, round) = text.split_once("-m").unwrap();
        let round: i64 = round.parse().unwrap();
        let last = seen.insert(chat.to_owned(), round);
        assert_eq!(
            last.map_or(0, |last| last + 1),
            round,
            "{chat} out of order"
        );
    }
    seen.len()
}

/// The names of the entries of `dir`, sorted.
pub fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
