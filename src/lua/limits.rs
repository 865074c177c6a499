//! What one Lua state may use: memory, instructions and time, per kind of call.

use std::time::Duration;

/// Resource limits for one Lua state.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most memory the state may allocate. Declared values held on the Rust side are held
    /// to the same amount.
    pub memory_bytes: usize,
    /// The most Lua instructions the state may run, counted across everything it runs. The
    /// work of pattern matching and of the table and string functions that loop in C counts
    /// too, about one instruction per element or step.
    pub instructions: u64,
    /// The longest the state may run, checked every thousand instructions; `None` for calls
    /// that spend most of their time waiting (tools, whose commands have their own timeouts).
    pub time: Option<Duration>,
}

impl Limits {
    /// The limits for a configuration file, which runs once when the agent loads.
    pub const CONFIG: Limits = Limits {
        memory_bytes: 32 << 20,
        instructions: 20_000_000,
        time: Some(Duration::from_secs(10)),
    };
}

impl Limits {
    /// The limits for one call of a tool's function; the instruction count starts afresh for
    /// every call, the memory limit covers the whole state.
    pub const TOOL_CALL: Limits = Limits {
        memory_bytes: 64 << 20,
        instructions: 100_000_000,
        time: None,
    };

    /// The limits for one call of a channel's hook (`on_message`, `format`), which runs for
    /// every message and must be quick.
    pub const HOOK_CALL: Limits = Limits {
        memory_bytes: 32 << 20,
        instructions: 10_000_000,
        time: Some(Duration::from_secs(2)),
    };
}

pub(super) fn mebibytes(bytes: usize) -> String {
    const MIB: usize = 1 << 20;
    if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        #[expect(clippy::cast_precision_loss, reason = "a rounded size for a message")]
        let mib = bytes as f64 / MIB as f64;
        format!("{mib:.2} MiB")
    }
}
