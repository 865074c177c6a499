//! The agent's tools and what they read on the host: the [`toolbox`] every call goes through,
//! the [`builtin`] tools, the agent's Lua tools ([`lua_tool`]), the [`skills`] catalog, the
//! system [`prompt`]'s files, and the files chat messages bring and replies attach
//! ([`attachments`]). What a tool gives back ([`Ran`], [`ToolOutcome`]) lives here, where every
//! kind of tool and the toolbox can name it.

pub mod attachments;
pub mod builtin;
pub mod lua_tool;
pub mod prompt;
pub mod skills;
pub mod toolbox;

/// What one tool call gives back to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutcome {
    /// At most [`MODEL_OUTPUT_LIMIT`](perch_core::output::MODEL_OUTPUT_LIMIT) characters; a
    /// longer result is shortened, and the whole of it kept in the guest.
    pub output: String,
    /// The call failed: an unknown tool, arguments that do not fit its schema, a Lua error, a
    /// command killed on timeout or cancel, a sandbox that cannot run commands. A command that
    /// exits non-zero is not an error: its exit code is in the output.
    pub is_error: bool,
    /// The exit status of the command the tool ran: `bash`'s command, or a Lua tool's last
    /// `ctx.sh`. `None` when it ran none, or it was killed before it exited.
    pub exit_code: Option<i32>,
}

/// What running a tool gave: the result for the model (`Err` an error result), and the exit
/// status of the command it ran, if it ran one that exited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    pub result: Result<String, String>,
    pub exit_code: Option<i32>,
}

impl Ran {
    /// A result from a tool that ran no command (or none that exited).
    pub fn without_command(result: Result<String, String>) -> Ran {
        Ran {
            result,
            exit_code: None,
        }
    }
}
