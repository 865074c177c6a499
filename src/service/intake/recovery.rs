//! After a restart: the inbox items still waiting, and the events still to decide.

use super::super::conversations::lane_name;
use super::super::deliveries::{Text, To, outcome_reply};
use super::task::{IntakeTask, Reply};
use crate::log::taken_run;
use crate::store::inbox::{Backlog, Disposition, consumes_id};
use crate::store::outbox::DeliveryLane;
use perch_core::log::{ItemAnswer, answer_taken};
use perch_core::starts::InboxRecovered;

impl IntakeTask {
    /// After a restart: an item whose run was already recorded (an `operation_started` names it)
    /// is decided by [`answer_taken`] (lane recovery has closed the run by now). A run that
    /// finished is answered with its reply, unless a reply was recorded; an interrupted chat run
    /// that started no tool declared `replay = "never"` and was not resumed before is resumed
    /// once, continuing from the lane's leaf; any other interrupted run gets a note saying what
    /// was interrupted. The other items are queued again, in order; events without a disposition
    /// are decided again, without carrying out a command or offering pairing again when a reply
    /// to the event was recorded before the crash.
    pub(super) async fn resume_inbox(
        &mut self,
        backlog: Backlog,
        replied_to: &std::collections::HashSet<(String, String)>,
    ) -> Result<InboxRecovered, String> {
        let sessions = self.dir.sessions_dir();
        let (mut answered, mut queued, undecided) = (0, 0, backlog.undecided.len());
        let (mut replied_after_restart, mut resumed, mut noted) = (0, 0, 0);
        for mut item in backlog.pending {
            let Some(run) = taken_run(&sessions, &item.lane, &consumes_id(item.event_seq)) else {
                queued += 1;
                self.conversations.dispatch(item)?;
                continue;
            };
            let replied =
                replied_to.contains(&(item.channel.clone(), item.event.platform_id.clone()));
            let answer = answer_taken(&run);
            if let (false, ItemAnswer::Resume(resumption)) = (replied, &answer) {
                resumed += 1;
                tracing::info!(
                    "lane {}: resuming the interrupted run of inbox item {}",
                    item.lane,
                    item.event_seq
                );
                item.resume = Some(*resumption);
                self.conversations.dispatch(item)?;
                continue;
            }
            answered += 1;
            if !replied && let Some(channel) = self.channels.get(&item.channel).cloned() {
                replied_after_restart += 1;
                match answer {
                    ItemAnswer::Note(note) => {
                        noted += 1;
                        let lane = DeliveryLane::new(lane_name(&item.lane)?, None);
                        self.reply(&channel, &item.event, note, Some(lane)).await?;
                    }
                    ItemAnswer::Deliver | ItemAnswer::Resume(_) => {
                        let lane = DeliveryLane::new(lane_name(&item.lane)?, Some(run.op));
                        let workspace = self.dir.workspace();
                        if let Some((reply, files)) =
                            outcome_reply(&workspace, &run.outcome, &run.text)
                        {
                            crate::host::failpoint::hit("before:delivery_intent");
                            let name = channel.loaded.config.name.to_string();
                            let formatted = self.format(&name, reply).await;
                            self.deliveries
                                .post(
                                    &channel,
                                    To::event(&item.event),
                                    Text::Formatted(formatted),
                                    files,
                                    Some(lane),
                                )
                                .await?;
                        }
                    }
                }
            }
            self.inbox
                .consume(vec![item.event_seq, item.disposition_seq])
                .await
                .map_err(|error| error.to_string())?;
        }
        self.consume_marks(backlog.settled_marks).await?;
        let rejected = backlog.interrupted.len();
        for interrupted in backlog.interrupted {
            let reason = format!(
                "perch stopped while the on_message hook of {} was deciding this message (a \
                 crash, a kill or a hang in the hook); it is not handed to the hook again",
                interrupted.hook
            );
            tracing::warn!(
                channel = %interrupted.channel,
                "channel {}: event {} rejected: {reason}",
                interrupted.channel,
                interrupted.event_seq
            );
            if let Some(channel) = self.channels.get(&interrupted.channel) {
                channel.hook_result(Some(&reason));
            }
            self.settle(interrupted.event_seq, Disposition::Error { reason })
                .await?;
            self.consume_marks([interrupted.mark_seq]).await?;
        }
        for (seq, channel, event) in backlog.undecided {
            let reply = if replied_to.contains(&(channel.clone(), event.platform_id.clone())) {
                Reply::Recorded
            } else {
                Reply::Due
            };
            self.decide(seq, &channel, event, reply).await?;
        }
        Ok(InboxRecovered {
            already_answered: answered,
            replied_after_restart,
            resumed,
            noted_as_interrupted: noted,
            queued_again: queued,
            decided_again: undecided,
            rejected_as_interrupted: rejected,
        })
    }
}
