//! Rules for what arrives from chat: which messages are chat commands, and the bot-loop guard's
//! count of bot turns per room.

use std::collections::BTreeMap;

/// A command perch answers itself, without a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatCommand {
    /// Aborts the conversation's run.
    Stop,
    /// Starts a fresh conversation.
    New,
    /// Says how perch is doing.
    Status,
}

impl ChatCommand {
    pub fn as_str(self) -> &'static str {
        match self {
            ChatCommand::Stop => "stop",
            ChatCommand::New => "new",
            ChatCommand::Status => "status",
        }
    }
}

/// A command as written: `/new`, or `/new@somebot` (as Telegram groups write them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandLine<'a> {
    pub command: ChatCommand,
    /// The bot named after `@`, if any.
    pub addressee: Option<&'a str>,
}

/// The command the first word of `text` is, if it is one.
pub fn parse_command(text: &str) -> Option<CommandLine<'_>> {
    let word = text.split_whitespace().next()?;
    let word = word.strip_prefix('/')?;
    let (name, addressee) = match word.split_once('@') {
        Some((_, "")) => return None,
        Some((name, addressee)) => (name, Some(addressee)),
        None => (word, None),
    };
    let command = match name {
        "stop" => ChatCommand::Stop,
        "new" => ChatCommand::New,
        "status" => ChatCommand::Status,
        _ => return None,
    };
    Some(CommandLine { command, addressee })
}

/// The command perch obeys in `text`. `addressed` is the platform's verdict that the message
/// addresses this agent (a mention, a reply, or on Telegram `/cmd@thisbot`): a command naming
/// another bot without addressing this one is ordinary text.
pub fn command_for_me(text: &str, addressed: bool) -> Option<ChatCommand> {
    let line = parse_command(text)?;
    match line.addressee {
        Some(_) if !addressed => None,
        _ => Some(line.command),
    }
}

/// What admission made of a message, as far as the bot-loop guard is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// It went to the hook (and so may be answered): a turn.
    Answered,
    /// Kept as group context; starts no run.
    Context,
    /// Stale or refused.
    No,
}

/// How many rooms the bot-loop guard keeps a count for; past it, the room with the lowest
/// count is forgotten.
pub const MAX_ROOMS_COUNTED: usize = 1024;

/// Bot-authored messages admitted per (channel, room) since the last human message admitted
/// there. Rooms at zero are not kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BotTurns {
    rooms: BTreeMap<(String, String), u32>,
}

impl BotTurns {
    /// The bot turns in a row in `room` of `channel`.
    pub fn in_room(&self, channel: &str, room: &str) -> u32 {
        self.rooms
            .get(&(channel.to_owned(), room.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// Counts one message: a bot's that was answered is a turn; a human's that was admitted
    /// (answered or kept as context) ends the run of bot turns.
    pub fn note(&mut self, channel: &str, room: &str, sender_is_bot: bool, admitted: Admitted) {
        let key = (channel.to_owned(), room.to_owned());
        match (sender_is_bot, admitted) {
            (true, Admitted::Answered) => {
                if !self.rooms.contains_key(&key) && self.rooms.len() >= MAX_ROOMS_COUNTED {
                    let lowest = self
                        .rooms
                        .iter()
                        .min_by_key(|(_, turns)| **turns)
                        .map(|(room, _)| room.clone());
                    if let Some(lowest) = lowest {
                        self.rooms.remove(&lowest);
                    }
                }
                let turns = self.rooms.entry(key).or_insert(0);
                *turns = turns.saturating_add(1);
            }
            (false, Admitted::Answered | Admitted::Context) => {
                self.rooms.remove(&key);
            }
            _ => {}
        }
    }

    /// How many rooms have a count.
    pub fn rooms(&self) -> usize {
        self.rooms.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_parsed_with_their_addressee() {
        type Parsed = Option<(ChatCommand, Option<&'static str>)>;
        let cases: &[(&str, Parsed)] = &[
            ("/new", Some((ChatCommand::New, None))),
            ("/stop please", Some((ChatCommand::Stop, None))),
            ("  /status", Some((ChatCommand::Status, None))),
            ("/new@otherbot", Some((ChatCommand::New, Some("otherbot")))),
            (
                "/status@perch_bot now",
                Some((ChatCommand::Status, Some("perch_bot"))),
            ),
            ("/new@", None),
            ("/newer", None),
            ("/New", None),
            ("new", None),
            ("please /new", None),
            ("", None),
            ("/", None),
            ("/help", None),
        ];
        for (text, expected) in cases {
            let parsed = parse_command(text).map(|line| (line.command, line.addressee));
            assert_eq!(&parsed, expected, "{text:?}");
        }
    }

    #[test]
    fn a_command_for_another_bot_is_not_obeyed() {
        let cases: &[(&str, bool, Option<ChatCommand>)] = &[
            ("/new", false, Some(ChatCommand::New)),
            ("/new", true, Some(ChatCommand::New)),
            ("/new@otherbot", false, None),
            ("/stop@otherbot", false, None),
            ("/status@otherbot", false, None),
            ("/stop@me", true, Some(ChatCommand::Stop)),
            ("hello", true, None),
        ];
        for (text, addressed, expected) in cases {
            assert_eq!(
                command_for_me(text, *addressed),
                *expected,
                "{text:?} addressed={addressed}"
            );
        }
    }

    #[test]
    fn bot_turns_count_answered_bot_messages_until_a_human_speaks() {
        use Admitted::{Answered, Context, No};
        let steps: &[(&str, bool, Admitted, u32)] = &[
            ("r", true, Answered, 1),
            ("r", true, Answered, 2),
            ("r", true, Context, 2),
            ("r", true, No, 2),
            ("r", false, No, 2),
            ("other", false, Answered, 2),
            ("r", true, Answered, 3),
            ("r", false, Context, 0),
            ("r", true, Answered, 1),
            ("r", false, Answered, 0),
        ];
        let mut turns = BotTurns::default();
        for (step, (room, bot, admitted, expected)) in steps.iter().enumerate() {
            turns.note("tg", room, *bot, *admitted);
            assert_eq!(turns.in_room("tg", "r"), *expected, "step {step}");
        }
        assert_eq!(turns.rooms(), 0, "a room at zero is not kept");
        turns.note("tg", "r", true, Answered);
        assert_eq!(turns.in_room("dc", "r"), 0, "counted per channel");
    }

    #[test]
    fn bot_turns_keep_a_bounded_number_of_rooms() {
        let mut turns = BotTurns::default();
        turns.note("tg", "busy", true, Admitted::Answered);
        turns.note("tg", "busy", true, Admitted::Answered);
        for room in 0..MAX_ROOMS_COUNTED + 10 {
            turns.note("tg", &room.to_string(), true, Admitted::Answered);
        }
        assert_eq!(turns.rooms(), MAX_ROOMS_COUNTED);
        assert_eq!(turns.in_room("tg", "busy"), 2, "the lowest counts go first");
    }
}
