//! Files in chat messages, on the host. Inbound: each attachment of a message is fetched through
//! its connector and saved under `workspace/inbox/<channel>/<message>/`, and the agent reads a
//! line per file saying where it is (or why it is not there). Outbound: the `attach:` lines of a
//! reply are checked against the workspace before anything is recorded, and the files are read
//! when the delivery is sent. The names, limits and lines are the core's
//! ([`perch_core::attachment`]); every file is reached through [`crate::host::workspace`], which
//! follows no symlink.

use crate::channel::{Connector, FetchError, InboundEvent, OutboundFile, Upload};
use crate::host::workspace::{
    read_workspace_bytes, save_workspace_file, saved_file_size, tree_size, workspace_file_size,
};
use crate::sandbox::GUEST_WORKSPACE;
use perch_core::attachment::{
    FILE_LIMIT, FileRefusal, INBOX_DEPTH_LIMIT, INBOX_DIR, INBOX_ENTRY_LIMIT, MAX_REPLY_FILES,
    MESSAGE_LIMIT, attachment_line, content_type_for, could_not_attach, download_limit, inbox_dir,
    inbox_has_room, safe_file_name, saved_names, take_attach_lines, unsaved_line, workspace_path,
};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// Held while the inbox is counted and a file saved into it, so that files of messages run at
/// once cannot pass [`perch_core::attachment::INBOX_LIMIT`] together.
static INBOX_WRITES: Mutex<()> = Mutex::new(());

/// What became of a message's attachments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Received {
    /// One line per attachment for the agent, in order.
    pub lines: Vec<String>,
    /// The attachments that were not saved, with why, for the service's log.
    pub unsaved: Vec<String>,
}

/// Fetches and saves every attachment of `event`, which arrived on `channel`, into the
/// workspace. A file already saved there (a redelivery, a restart) is not fetched again. A file
/// over [`FILE_LIMIT`], past [`MESSAGE_LIMIT`] for the message, or that would take what
/// `workspace/inbox/` holds past [`perch_core::attachment::INBOX_LIMIT`], is refused without
/// being written (nothing already there is removed to make room), by its declared size before
/// downloading and by its real size while downloading and again before saving.
pub async fn receive(
    connector: &dyn Connector,
    workspace: &Path,
    channel: &str,
    event: &InboundEvent,
) -> Received {
    let dir = PathBuf::from(inbox_dir(channel, &event.platform_id));
    let names = saved_names(&event.attachments);
    let mut remaining = MESSAGE_LIMIT;
    let mut received = Received::default();
    for (attachment, name) in event.attachments.iter().zip(names) {
        let guest = format!("{GUEST_WORKSPACE}/{}/{name}", dir.display());
        let saved = {
            let (workspace, dir, name) = (workspace.to_path_buf(), dir.clone(), name.clone());
            blocking(move || saved_file_size(&workspace, &dir, &name)).await
        };
        let outcome = match saved {
            Ok(Some(size)) => Ok(size),
            Ok(None) => {
                fetch_and_save(
                    connector, workspace, &dir, &name, event, attachment, remaining,
                )
                .await
            }
            Err(refusal) => Err(refusal),
        };
        match outcome {
            Ok(size) => {
                remaining = remaining.saturating_sub(size);
                received.lines.push(attachment_line(
                    &guest,
                    attachment.content_type.as_deref(),
                    size,
                ));
            }
            Err(refusal) => {
                received.unsaved.push(format!("{name}: {refusal}"));
                received
                    .lines
                    .push(unsaved_line(&name, attachment, &refusal));
            }
        }
    }
    received
}

async fn fetch_and_save(
    connector: &dyn Connector,
    workspace: &Path,
    dir: &Path,
    name: &str,
    event: &InboundEvent,
    attachment: &crate::channel::Attachment,
    remaining: u64,
) -> Result<u64, FileRefusal> {
    let used = {
        let workspace = workspace.to_path_buf();
        blocking(move || inbox_used(&workspace)).await?
    };
    let limit = download_limit(attachment.size, remaining, used)?;
    let bytes = match connector.fetch(event, attachment, limit.bytes).await {
        Ok(bytes) if bytes.len() as u64 > limit.bytes => {
            return Err(limit.refusal(Some(bytes.len() as u64)));
        }
        Ok(bytes) => bytes,
        Err(FetchError::TooLarge { size }) => return Err(limit.refusal(size)),
        Err(error @ FetchError::Failed { .. }) => {
            return Err(FileRefusal::Failed(error.to_string()));
        }
    };
    let size = bytes.len() as u64;
    let (workspace, dir, name) = (workspace.to_path_buf(), dir.to_path_buf(), name.to_owned());
    blocking(move || {
        let _writing = INBOX_WRITES.lock().unwrap_or_else(PoisonError::into_inner);
        inbox_has_room(inbox_used(&workspace)?, size)?;
        save_workspace_file(&workspace, &dir, &name, &bytes)
    })
    .await?;
    Ok(size)
}

/// The bytes `workspace/inbox/` holds, or `None` when it holds too many entries to count.
fn inbox_used(workspace: &Path) -> Result<Option<u64>, FileRefusal> {
    tree_size(
        workspace,
        Path::new(INBOX_DIR),
        INBOX_ENTRY_LIMIT,
        INBOX_DEPTH_LIMIT,
    )
}

/// A reply with its `attach:` lines taken out, and the files they name that may be sent: inside
/// the workspace with no symlink on the way, regular, not empty, at most [`FILE_LIMIT`] each and
/// [`MESSAGE_LIMIT`] together, at most [`MAX_REPLY_FILES`]. Each line that names a file which
/// may not be sent becomes a note at the end of the reply instead.
pub fn reply_files(workspace: &Path, reply: &str) -> (String, Vec<OutboundFile>) {
    let taken = take_attach_lines(reply);
    if taken.paths.is_empty() {
        return (reply.to_owned(), Vec::new());
    }
    let mut files: Vec<OutboundFile> = Vec::new();
    let mut notes = Vec::new();
    let mut total = 0;
    for written in &taken.paths {
        let checked = workspace_path(written, GUEST_WORKSPACE).and_then(|relative| {
            if files.len() >= MAX_REPLY_FILES {
                return Err(FileRefusal::TooMany);
            }
            let size = workspace_file_size(workspace, Path::new(&relative))?;
            if size == 0 {
                return Err(FileRefusal::Failed("the file is empty".into()));
            }
            if size > FILE_LIMIT {
                return Err(FileRefusal::TooLarge { size: Some(size) });
            }
            if total + size > MESSAGE_LIMIT {
                return Err(FileRefusal::MessageTooLarge);
            }
            Ok((relative, size))
        });
        match checked {
            Ok((relative, size)) => {
                total += size;
                let last = relative.rsplit('/').next().unwrap_or(&relative);
                let name = safe_file_name(Some(last), None);
                files.push(OutboundFile {
                    path: relative,
                    name,
                });
            }
            Err(refusal) => notes.push(could_not_attach(written, &refusal)),
        }
    }
    let text = with_notes(&taken.text, &notes);
    (text, files)
}

/// `text` with `notes` after it, a paragraph apart.
pub fn with_notes(text: &str, notes: &[String]) -> String {
    perch_core::attachment::followed_by(text, notes, "\n\n")
}

/// Reads the files a delivery attaches, for sending; a file that can no longer be sent (gone,
/// replaced by a symlink, grown past the limit) is left out with a note.
pub async fn uploads(workspace: &Path, files: &[OutboundFile]) -> (Vec<Upload>, Vec<String>) {
    let workspace = workspace.to_path_buf();
    let files = files.to_vec();
    blocking(move || {
        let mut uploads = Vec::new();
        let mut notes = Vec::new();
        for file in &files {
            match read_workspace_bytes(&workspace, Path::new(&file.path), FILE_LIMIT) {
                Ok(bytes) => uploads.push(Upload {
                    name: file.name.clone(),
                    content_type: content_type_for(&file.name).to_owned(),
                    bytes,
                }),
                Err(refusal) => notes.push(could_not_attach(&file.path, &refusal)),
            }
        }
        Ok::<_, FileRefusal>((uploads, notes))
    })
    .await
    .unwrap_or_else(|refusal| {
        (
            Vec::new(),
            vec![format!("(could not attach files: {refusal})")],
        )
    })
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, FileRefusal> + Send + 'static,
) -> Result<T, FileRefusal> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|error| Err(FileRefusal::Failed(error.to_string())))
}
