//! The instruction budget and the deadline: a hook counts what a state runs and stops it when
//! it passes its [`Limits`].

use super::limits::Limits;
use super::record::calling_line;
use mlua::debug::Debug as HookDebug;
use mlua::{HookTriggers, Lua, VmState};
use perch_core::problem::{Pos, Problem};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Counts the instructions a state runs and stops it when they pass the limit or the call
/// runs past its deadline.
pub(super) struct InstructionBudget {
    limit: AtomicU64,
    used: AtomicU64,
    exhausted: AtomicBool,
    /// The line running when the limit was passed; 0 when unknown.
    stopped_on_line: AtomicU32,
    /// When the running call must stop, and how long it was given.
    deadline: Mutex<Option<(Instant, Duration)>>,
    /// Set when the deadline rather than the instruction count stopped the call.
    overtime: AtomicBool,
}

impl InstructionBudget {
    /// Instructions between two checks of the budget while it lasts.
    const STEP: u32 = 1000;

    pub(super) fn new(limits: Limits) -> Self {
        InstructionBudget {
            limit: AtomicU64::new(limits.instructions),
            used: AtomicU64::new(0),
            exhausted: AtomicBool::new(false),
            stopped_on_line: AtomicU32::new(0),
            deadline: Mutex::new(Self::deadline_for(limits)),
            overtime: AtomicBool::new(false),
        }
    }

    fn deadline_for(limits: Limits) -> Option<(Instant, Duration)> {
        limits.time.map(|time| (Instant::now() + time, time))
    }

    fn is_overtime(&self) -> bool {
        let deadline = *self.deadline.lock().unwrap_or_else(PoisonError::into_inner);
        deadline.is_some_and(|(at, _)| Instant::now() >= at)
    }

    /// The instructions left to the running call.
    pub(super) fn remaining(&self) -> u64 {
        if self.is_exhausted() {
            return 0;
        }
        self.limit
            .load(Ordering::Relaxed)
            .saturating_sub(self.used.load(Ordering::Relaxed))
    }

    /// Counts `work` done in C on behalf of the running call; an error, as when the hook stops
    /// the call, when it does not fit in what is left.
    pub(super) fn charge(self: &Arc<Self>, lua: &Lua, work: u64) -> mlua::Result<()> {
        let used = self
            .used
            .fetch_add(work, Ordering::Relaxed)
            .saturating_add(work);
        if used <= self.limit.load(Ordering::Relaxed) && !self.is_exhausted() {
            return Ok(());
        }
        Err(self.stop(lua, calling_line(lua)))
    }

    /// Marks the budget spent and makes every further instruction fail.
    pub(super) fn stop(self: &Arc<Self>, lua: &Lua, line: u32) -> mlua::Error {
        if !self.exhausted.swap(true, Ordering::Relaxed) {
            self.stopped_on_line.store(line, Ordering::Relaxed);
        }
        // A `pcall` may catch the error; failing again on the very next instruction, wherever it
        // is, leaves the file no instruction to carry on with.
        if let Err(error) = self.install_every(lua, 1) {
            return error;
        }
        mlua::Error::runtime(self.message())
    }

    /// A global hook reaches the coroutines the file creates as well as the main chunk.
    pub(super) fn install(self: &Arc<Self>, lua: &Lua) -> mlua::Result<()> {
        self.install_every(lua, Self::STEP)
    }

    fn install_every(self: &Arc<Self>, lua: &Lua, instructions: u32) -> mlua::Result<()> {
        let budget = Arc::clone(self);
        lua.set_global_hook(
            HookTriggers::new().every_nth_instruction(instructions),
            move |lua, frame| budget.spend(lua, frame, instructions),
        )
    }

    fn spend(
        self: &Arc<Self>,
        lua: &Lua,
        frame: &HookDebug,
        instructions: u32,
    ) -> mlua::Result<VmState> {
        let used = self
            .used
            .fetch_add(u64::from(instructions), Ordering::Relaxed)
            .saturating_add(u64::from(instructions));
        let overtime = !self.is_exhausted() && self.is_overtime();
        if used <= self.limit.load(Ordering::Relaxed) && !self.is_exhausted() && !overtime {
            return Ok(VmState::Continue);
        }
        if overtime {
            self.overtime.store(true, Ordering::Relaxed);
        }
        let line = frame
            .current_line()
            .and_then(|line| u32::try_from(line).ok())
            .unwrap_or(0);
        Err(self.stop(lua, line))
    }

    /// A fresh budget for the next call.
    pub(super) fn renew(self: &Arc<Self>, lua: &Lua, limits: Limits) -> mlua::Result<()> {
        self.limit.store(limits.instructions, Ordering::Relaxed);
        self.used.store(0, Ordering::Relaxed);
        self.exhausted.store(false, Ordering::Relaxed);
        self.overtime.store(false, Ordering::Relaxed);
        self.stopped_on_line.store(0, Ordering::Relaxed);
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner) = Self::deadline_for(limits);
        self.install(lua)
    }

    pub(super) fn is_exhausted(&self) -> bool {
        self.exhausted.load(Ordering::Relaxed)
    }

    fn message(&self) -> String {
        let deadline = *self.deadline.lock().unwrap_or_else(PoisonError::into_inner);
        match deadline {
            Some((_, time)) if self.overtime.load(Ordering::Relaxed) => format!(
                "stopped after running for {} s (an endless loop, or work too slow for Lua?)",
                time.as_secs_f64()
            ),
            _ => format!(
                "stopped after {} Lua instructions (an endless loop?)",
                self.limit.load(Ordering::Relaxed)
            ),
        }
    }

    pub(super) fn problem(&self, file: &str) -> Problem {
        let line = self.stopped_on_line.load(Ordering::Relaxed);
        Problem::new(file, Pos::line(line), self.message())
            .with_fix("make the file finish: configuration runs once at load")
    }
}
