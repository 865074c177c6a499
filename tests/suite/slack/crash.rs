//! Slack under SIGKILL: a burst over two rooms, a thread and three direct messages, pushed while
//! perch runs and while it is down, with perch killed at seeded random moments and the fake
//! sending again whatever it was not acknowledged. Every message is answered at most once, in
//! its room and thread; one is left unanswered only behind a delivery of unknown fate that
//! perch reports; every envelope is acknowledged in the end.

use super::*;
use crate::suite::support::crash::{Seeded, restart, restart_past_resumptions, unknown_deliveries};
use crate::suite::support::scenario::Scenario;
use crate::suite::support::wait::{Poll, WAIT};
use std::collections::{HashMap, HashSet};

const ROOMS: [&str; 2] = ["C0ONE", "C0TWO"];

/// Ada, Grace and Linus may talk to the agent, in `#one`, `#two` and directly.
const CHANNEL: &str = "rooms = { one = \"C0ONE\", two = \"C0TWO\" }, allow = { users = { \"U061F7AUR\", \"U0GRACE42\", \"U0LINUS77\" }, rooms = { \"one\", \"two\" } }, dm = \"allow\", groups = \"all\"";

/// Messages pushed at each step of the schedule: while perch runs, just as it stops, and while
/// it is down.
const WAVE: usize = 2;

/// How each stop of `perch run` comes. Three unclean stops in a row would start the next run
/// with its channels paused (the crash-loop breaker), so every third is a clean one.
const STOPS: [&str; 5] = ["SIGKILL", "SIGKILL", "SIGTERM", "SIGKILL", "SIGKILL"];

/// Where a conversation of the burst happens.
struct Conversation {
    name: String,
    channel: String,
    thread: Option<String>,
    /// The one person who writes there (a direct message), or anyone.
    only: Option<usize>,
}

/// A message of the burst as the fake took it.
#[derive(Debug)]
struct Message {
    channel: String,
    ts: String,
    thread: Option<String>,
}

impl Message {
    /// perch's id for it: `<channel>:<ts>`, what a delivery answering it names.
    fn platform_id(&self) -> String {
        format!("{}:{}", self.channel, self.ts)
    }
}

/// The burst: who writes where, and every message pushed, by the word it ends with (which the
/// echo model's answer ends with too).
struct Burst<'a> {
    slack: &'a FakeSlack,
    people: Vec<SlackUser>,
    conversations: Vec<Conversation>,
    pushed: HashMap<String, Message>,
}

impl<'a> Burst<'a> {
    /// The rooms and the people's direct messages on `slack`, and a thread in the first room,
    /// started by a message of the burst.
    fn new(slack: &'a FakeSlack) -> Burst<'a> {
        let people = vec![
            ada(),
            SlackUser::person("U0GRACE42", "Grace"),
            SlackUser::person("U0LINUS77", "Linus"),
        ];
        let mut conversations = Vec::new();
        for (n, room) in ROOMS.iter().enumerate() {
            slack.channel(room, Kind::Channel);
            conversations.push(Conversation {
                name: format!("room{n}"),
                channel: (*room).to_owned(),
                thread: None,
                only: None,
            });
        }
        for (n, person) in people.iter().enumerate() {
            slack.user(person);
            let dm = format!("D0{}", person.name.to_uppercase());
            slack.channel(&dm, Kind::Im);
            conversations.push(Conversation {
                name: format!("dm-{}", person.name),
                channel: dm,
                thread: None,
                only: Some(n),
            });
        }
        let mut burst = Burst {
            slack,
            people,
            conversations,
            pushed: HashMap::new(),
        };
        let parent = burst.push(0, 0, false);
        burst.conversations.push(Conversation {
            name: "thread".to_owned(),
            channel: ROOMS[0].to_owned(),
            thread: Some(parent),
            only: None,
        });
        burst
    }

    /// Pushes [`WAVE`] messages, each in a conversation and from a person `random` picks; one in
    /// a room mentions the bot half the time, and Slack then sends it twice (as `message` and
    /// as `app_mention`).
    fn wave(&mut self, random: &mut Seeded) {
        for _ in 0..WAVE {
            let at = random.below(self.conversations.len() as u64) as usize;
            let person = self.conversations[at]
                .only
                .unwrap_or_else(|| random.below(self.people.len() as u64) as usize);
            let mention = random.below(2) == 0;
            self.push(at, person, mention);
        }
    }

    /// Pushes a message in the conversation `at` from `person`; returns its `ts`.
    fn push(&mut self, at: usize, person: usize, mention: bool) -> String {
        let conversation = &self.conversations[at];
        let word = format!("{}-m{}", conversation.name, self.pushed.len());
        let direct = conversation.only.is_some();
        let text = if mention && !direct {
            format!("<@{BOT_USER}> {word}")
        } else {
            word.clone()
        };
        let author = &self.people[person];
        let ts = match &conversation.thread {
            Some(thread) => self
                .slack
                .push_in_thread(&conversation.channel, author, &text, thread),
            None => self
                .slack
                .push_message(&conversation.channel, author, &text),
        };
        let message = Message {
            channel: conversation.channel.clone(),
            ts: ts.clone(),
            thread: conversation.thread.clone(),
        };
        self.pushed.insert(word, message);
        ts
    }
}

#[test]
fn a_burst_over_slack_rooms_survives_sigkills_answered_at_most_once_and_nothing_lost() {
    let mut random = Seeded::from_env();
    let seed = random.seed();
    let agent = Scenario::slack(CHANNEL).build();
    let slack = agent.slack();
    agent.model.echo_after(Duration::from_millis(700));
    let mut burst = Burst::new(slack);
    burst.wave(&mut random);
    let mut resumed = 0;
    for (n, stop) in STOPS.iter().enumerate() {
        let service = restart_past_resumptions(&agent, &mut resumed);
        super::run::wait_for_hello(&agent);
        burst.wave(&mut random);
        let after = random.moment();
        eprintln!("{stop} {n} after {after:?}");
        // The stop lands at a random moment of the work: this sleep is the schedule, not a wait.
        std::thread::sleep(after);
        // These are on their way, or being journaled, when the stop comes.
        burst.wave(&mut random);
        if *stop == "SIGKILL" {
            service.kill();
        } else {
            service.stop();
        }
        burst.wave(&mut random);
    }

    let service = restart(&agent);
    let settled = || {
        let status = agent.status();
        status.inbox_pending == 0
            && status.outbox_pending == 0
            && slack.unacked() == 0
            && slack.posted().len() + unknown_deliveries(agent.path()).len() >= burst.pushed.len()
    };
    assert!(
        Poll::within(WAIT).holds(settled),
        "every message answered or its answer's fate unknown, and every envelope acknowledged \
         (seed {seed}): {} posted, {} of unknown fate, {} message(s), {} envelope(s) \
         unacknowledged; {:#?}",
        slack.posted().len(),
        unknown_deliveries(agent.path()).len(),
        burst.pushed.len(),
        slack.unacked(),
        agent.status()
    );
    service.stop();

    let posted = slack.posted();
    let mut answered = HashSet::new();
    for post in &posted {
        let word = post.text.split_whitespace().last().unwrap_or_default();
        let message = burst
            .pushed
            .get(word)
            .unwrap_or_else(|| panic!("a post that answers no message (seed {seed}): {post:#?}"));
        assert!(
            post.method == "chat.postMessage" && post.text.starts_with("echo: "),
            "{word} answered by the model, not a note (seed {seed}): {post:#?}"
        );
        assert_eq!(
            (&post.channel, &post.thread_ts),
            (&message.channel, &message.thread),
            "{word} answered in its room and thread (seed {seed})"
        );
        assert!(
            answered.insert(word),
            "{word} answered twice (seed {seed}): {posted:#?}"
        );
    }
    // A delivery of unknown fate (perch died between recording it and its receipt) is never
    // resent: its message may have been answered (then it is among `answered`) or not.
    let unknown = unknown_deliveries(agent.path());
    let answering_unknown: HashSet<String> = unknown.iter().flatten().cloned().collect();
    let unanswered: Vec<(&String, &Message)> = burst
        .pushed
        .iter()
        .filter(|(word, _)| !answered.contains(word.as_str()))
        .collect();
    for (word, message) in &unanswered {
        assert!(
            answering_unknown.contains(&message.platform_id()),
            "{word} lost (seed {seed}): unanswered, and no delivery of unknown fate answers it; \
             {} unanswered, {} of unknown fate: {unknown:?}",
            unanswered.len(),
            unknown.len()
        );
    }

    let status = agent.status();
    assert_eq!(
        status.deliveries_unknown.len(),
        unknown.len(),
        "perch status reports every delivery of unknown fate (seed {seed}): {:?}",
        status.deliveries_unknown
    );
    assert!(
        status.inbox_pending == 0
            && status.outbox_pending == 0
            && status.lanes_with_open_operations.is_empty(),
        "nothing pending (seed {seed}): {status:#?}"
    );

    let delivered = slack.delivered();
    let redelivered = delivered
        .iter()
        .filter(|envelope| envelope["retry_attempt"].as_u64() > Some(0))
        .count();
    eprintln!(
        "{} message(s): {} answered, {} delivery(ies) of unknown fate, {resumed} run(s) \
         resumed, {} envelope(s) sent, {redelivered} of them again",
        burst.pushed.len(),
        answered.len(),
        unknown.len(),
        delivered.len()
    );
    assert!(
        redelivered > 0,
        "Slack sent again what perch had not acknowledged when it stopped (seed {seed})"
    );
    let acked: HashSet<String> = slack.acked().into_iter().collect();
    for envelope in &delivered {
        let id = envelope["envelope_id"].as_str().unwrap_or_default();
        assert!(
            acked.contains(id),
            "envelope {id} acknowledged in the end (seed {seed}): {envelope}"
        );
    }
    // Every envelope was acknowledged within Slack's retries: nothing was Slack's to lose.
    assert!(
        slack.abandoned().is_empty(),
        "envelopes abandoned (seed {seed}): {:?}",
        slack.abandoned()
    );
}
