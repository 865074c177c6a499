//! How a handle asks its owner task: a request carrying a oneshot, and the owner's answer.

use tokio::sync::{mpsc, oneshot};

/// Sends the request `request` makes around a reply sender, and waits for the answer; `None`
/// when the owner has stopped (before taking the request, or before answering it).
pub(super) async fn ask<Request, Answer>(
    requests: &mpsc::UnboundedSender<Request>,
    request: impl FnOnce(oneshot::Sender<Answer>) -> Request,
) -> Option<Answer> {
    let (reply, answer) = oneshot::channel();
    requests.send(request(reply)).ok()?;
    answer.await.ok()
}
