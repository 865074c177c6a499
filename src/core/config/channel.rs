//! `channels/<name>.lua`: one chat connection, named by its file stem. The types here; `check`
//! reads a file into them.

mod check;

pub use check::{channel_secret_problems, channel_stem, check_channel};

use crate::name::{ChannelName, RoomAlias};
use crate::problem::Pos;
use crate::secret::EnvRef;
use crate::tree::FunctionId;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The chat platform a channel connects to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelKind {
    Discord,
    Telegram,
    Matrix,
    Slack,
}

impl ChannelKind {
    /// Every kind, in the order they are listed in messages.
    pub const ALL: [ChannelKind; 4] = [
        ChannelKind::Discord,
        ChannelKind::Telegram,
        ChannelKind::Matrix,
        ChannelKind::Slack,
    ];

    /// The word written in `kind = "..."`.
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelKind::Discord => "discord",
            ChannelKind::Telegram => "telegram",
            ChannelKind::Matrix => "matrix",
            ChannelKind::Slack => "slack",
        }
    }

    /// The kind written `text`, if there is one.
    pub fn parse(text: &str) -> Option<ChannelKind> {
        ChannelKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == text)
    }

    /// The keys only this kind takes: its credentials and connection details.
    fn own_keys(self) -> &'static [&'static str] {
        match self {
            ChannelKind::Discord => &["token", "api_url"],
            ChannelKind::Telegram => &["token", "api_url", "threads"],
            ChannelKind::Matrix => &[
                "homeserver",
                "user",
                "password",
                "store_passphrase",
                "threads",
            ],
            ChannelKind::Slack => &["app_token", "bot_token", "api_url", "threads"],
        }
    }

    fn credential_example(self) -> &'static str {
        match self {
            ChannelKind::Discord => "token = env \"DISCORD_TOKEN\"",
            ChannelKind::Telegram => "token = env \"TELEGRAM_TOKEN\"",
            ChannelKind::Matrix => {
                "homeserver = \"https://matrix.example.org\", user = \"@perch:example.org\", \
                 password = env \"MATRIX_PASSWORD\", store_passphrase = env \"MATRIX_STORE_PASSPHRASE\""
            }
            ChannelKind::Slack => {
                "app_token = env \"SLACK_APP_TOKEN\", bot_token = env \"SLACK_BOT_TOKEN\""
            }
        }
    }
}

impl std::fmt::Display for ChannelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The platform and how to log in to it. Credentials are references to host environment
/// variables, never values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Platform {
    /// A Discord bot, logged in with its bot token.
    Discord { token: EnvRef },
    /// A Telegram bot, logged in with the token BotFather gave it.
    Telegram { token: EnvRef },
    /// A Matrix account on `homeserver`. `store_passphrase` encrypts the state and crypto store
    /// kept under `.perch/`.
    Matrix {
        /// The homeserver's URL, such as `https://matrix.example.org`.
        homeserver: String,
        /// The account, such as `@perch:example.org`.
        user: String,
        password: EnvRef,
        store_passphrase: EnvRef,
    },
    /// A Slack app over Socket Mode: the app-level token (`xapp-…`, scope `connections:write`)
    /// opens the socket, the bot token (`xoxb-…`) makes every Web API call.
    Slack {
        app_token: EnvRef,
        bot_token: EnvRef,
    },
}

impl Platform {
    /// The platform this is.
    pub fn kind(&self) -> ChannelKind {
        match self {
            Platform::Discord { .. } => ChannelKind::Discord,
            Platform::Telegram { .. } => ChannelKind::Telegram,
            Platform::Matrix { .. } => ChannelKind::Matrix,
            Platform::Slack { .. } => ChannelKind::Slack,
        }
    }

    /// Each credential with the key it is written under.
    pub fn credentials(&self) -> Vec<(&'static str, &EnvRef)> {
        match self {
            Platform::Discord { token } | Platform::Telegram { token } => vec![("token", token)],
            Platform::Matrix {
                password,
                store_passphrase,
                ..
            } => vec![
                ("password", password),
                ("store_passphrase", store_passphrase),
            ],
            Platform::Slack {
                app_token,
                bot_token,
            } => vec![("app_token", app_token), ("bot_token", bot_token)],
        }
    }
}

/// Who may talk to the agent in direct messages, beyond `allow.users`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DmPolicy {
    /// An unknown sender gets a pairing code for the owner to approve (the default).
    Pair,
    /// Anyone.
    Allow,
    /// Nobody else.
    Refuse,
}

impl DmPolicy {
    /// The word written in `dm = "..."`.
    pub fn as_str(self) -> &'static str {
        match self {
            DmPolicy::Pair => "pair",
            DmPolicy::Allow => "allow",
            DmPolicy::Refuse => "refuse",
        }
    }
}

/// Which group messages the agent answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupPolicy {
    /// Only messages that mention the agent or reply to it (the default).
    Mention,
    /// Every message.
    All,
}

impl GroupPolicy {
    /// The word written in `groups = "..."`.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupPolicy::Mention => "mention",
            GroupPolicy::All => "all",
        }
    }
}

/// Which conversation a message in a thread belongs to. Discord has no such choice: a thread
/// there is a channel, and so a room of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThreadPolicy {
    /// Each thread is a conversation of its own (the default).
    #[default]
    Own,
    /// A thread's messages join the conversation of the room it is in.
    Room,
}

impl ThreadPolicy {
    /// The word written in `threads = "..."`.
    pub fn as_str(self) -> &'static str {
        match self {
            ThreadPolicy::Own => "own",
            ThreadPolicy::Room => "room",
        }
    }

    /// The thread that names the conversation of a message posted in `thread`: the thread
    /// itself, or none when threads join their room's conversation. Replies still go to the
    /// thread the message was posted in.
    pub fn conversation_thread(self, thread: Option<&str>) -> Option<&str> {
        match self {
            ThreadPolicy::Own => thread,
            ThreadPolicy::Room => None,
        }
    }
}

/// What happens to a message that arrives while its lane is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusyPolicy {
    /// Queued and run next (the default).
    Followup,
    /// Given to the running turn at its next tool boundary.
    Steer,
    /// Messages arriving within `window` of each other become one turn.
    Collect { window: Duration },
    /// The running turn is aborted and the message runs next.
    Interrupt,
}

impl BusyPolicy {
    /// The word written in `busy = "..."`.
    pub fn as_str(self) -> &'static str {
        match self {
            BusyPolicy::Followup => "followup",
            BusyPolicy::Steer => "steer",
            BusyPolicy::Collect { .. } => "collect",
            BusyPolicy::Interrupt => "interrupt",
        }
    }
}

/// Who may talk to the agent without pairing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Access {
    /// Platform user ids.
    pub users: Vec<String>,
    /// Rooms, by alias, in which everyone may talk to the agent.
    pub rooms: Vec<RoomAlias>,
}

/// One checked `channels/<name>.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelConfig {
    /// The file stem.
    pub name: ChannelName,
    /// Where `channel { ... }` was declared.
    pub pos: Pos,
    pub platform: Platform,
    /// The platform's endpoint, when not the public one (a self-hosted Bot API server, a test
    /// double; Slack's Web API base). Discord, Telegram and Slack only: a Matrix channel names
    /// its homeserver.
    pub api_url: Option<String>,
    /// Platform room ids by alias.
    pub rooms: BTreeMap<RoomAlias, String>,
    pub allow: Access,
    pub dm: DmPolicy,
    pub groups: GroupPolicy,
    pub busy: BusyPolicy,
    /// Whether a thread is a conversation of its own or part of its room's.
    pub threads: ThreadPolicy,
    /// Events older than this when perch sees them are stale and not answered.
    pub max_age: Duration,
    /// Messages that may wait per lane before more are answered with an overflow message.
    pub queue_limit: u32,
    /// Other bots' user ids the agent answers; every other bot is ignored.
    pub allow_bots: Vec<String>,
    /// How many consecutive bot-to-bot exchanges are answered per room.
    pub bot_turns: u32,
    /// `on_message(msg, store)`.
    pub on_message: Option<FunctionId>,
    /// `format(reply, store)`.
    pub format: Option<FunctionId>,
}

impl ChannelConfig {
    /// The platform the channel connects to.
    pub fn kind(&self) -> ChannelKind {
        self.platform.kind()
    }

    /// The alias the file gives the platform room `room`.
    pub fn room_alias(&self, room: &str) -> Option<&RoomAlias> {
        self.rooms
            .iter()
            .find(|(_, id)| id.as_str() == room)
            .map(|(alias, _)| alias)
    }
}

/// The channel name perch chat uses for the terminal.
pub const TERMINAL_CHANNEL: &str = "terminal";

#[cfg(test)]
mod tests;
