//! The `string` and `table` functions that loop in C, replaced by versions whose work is counted
//! against the instruction budget before or while it is done.

use super::budget::InstructionBudget;
use super::limits::{Limits, mebibytes};
use super::record::{CallError, calling_line};
use mlua::{Function, Lua, MultiValue, Table, Value as LuaValue};
use perch_core::lua_pattern::{Capture, Match, MatchError, Pattern, Steps, find_plain, is_plain};
use std::sync::{Arc, Mutex, PoisonError};

/// The longest string `string.find`, `match`, `gmatch` and `gsub` search. Their work is counted
/// against the instruction limit, so this is not what bounds their time; it is the size of one
/// command's output stream, so a tool can search everything a command printed.
const MAX_PATTERN_SUBJECT_BYTES: usize = 1 << 20;

/// `string.find`, `match`, `gmatch` and `gsub` by [`perch_core::lua_pattern`], whose every step
/// is counted, and `string.rep`, whose repetitions are counted before it runs. Lua's own
/// versions loop in C, where the instruction hook cannot stop them. `("x"):find` is the same
/// function: strings index the `string` table.
pub(super) fn counted_string_functions(
    lua: &Lua,
    file: &str,
    limits: Limits,
    budget: &Arc<InstructionBudget>,
) -> mlua::Result<()> {
    let string: Table = lua.globals().get("string")?;
    let matching = Arc::new(Matching {
        file: file.to_owned(),
        budget: Arc::clone(budget),
        max_result_bytes: limits.memory_bytes,
    });

    let find = Arc::clone(&matching);
    string.raw_set(
        "find",
        lua.create_function(
            move |lua, (subject, pattern, init, plain): (LuaValue, LuaValue, Option<i64>, LuaValue)| {
                let plain = !matches!(plain, LuaValue::Nil | LuaValue::Boolean(false));
                find.find(lua, &subject, &pattern, init, plain, true)
            },
        )?,
    )?;
    let matcher = Arc::clone(&matching);
    string.raw_set(
        "match",
        lua.create_function(
            move |lua, (subject, pattern, init): (LuaValue, LuaValue, Option<i64>)| {
                matcher.find(lua, &subject, &pattern, init, false, false)
            },
        )?,
    )?;
    let gmatch = Arc::clone(&matching);
    string.raw_set(
        "gmatch",
        lua.create_function(
            move |lua, (subject, pattern, init): (LuaValue, LuaValue, Option<i64>)| {
                gmatch.gmatch(lua, &subject, &pattern, init)
            },
        )?,
    )?;
    let gsub = Arc::clone(&matching);
    string.raw_set(
        "gsub",
        lua.create_function(
            move |lua,
                  (subject, pattern, replacement, most): (
                LuaValue,
                LuaValue,
                LuaValue,
                Option<i64>,
            )| { gsub.gsub(lua, &subject, &pattern, &replacement, most) },
        )?,
    )?;

    let original_rep: Function = string.get("rep")?;
    let rep_budget = Arc::clone(budget);
    string.raw_set(
        "rep",
        lua.create_function(move |lua, args: MultiValue| {
            let times = integer_arg(args.get(1)).unwrap_or(0).max(0);
            let piece = args.iter().take(3).step_by(2).map(|value| match value {
                LuaValue::String(text) => text.as_bytes().len() as u64,
                _ => 0,
            });
            let bytes: u64 = piece.sum();
            let times = times.unsigned_abs();
            let work = 1 + times / 8 + times.saturating_mul(bytes) / 256;
            rep_budget.charge(lua, work)?;
            original_rep.call::<MultiValue>(args)
        })?,
    )?;
    Ok(())
}

/// `table.insert`, `remove`, `move`, `concat` and `sort`, with the elements they go through in
/// C counted before they run: one call could otherwise shift or visit billions of elements
/// (`table.move({}, 1, 1e12, 2)`) on a single instruction.
pub(super) fn counted_table_functions(
    lua: &Lua,
    budget: &Arc<InstructionBudget>,
) -> mlua::Result<()> {
    let table: Table = lua.globals().get("table")?;
    type Work = fn(&MultiValue) -> mlua::Result<u64>;
    let counted: [(&str, Work); 5] = [
        ("insert", |args| {
            if args.len() < 3 {
                return Ok(1);
            }
            let length = table_length(args)?;
            let position = integer_arg(args.get(1)).unwrap_or(length);
            Ok(distance(position, length))
        }),
        ("remove", |args| {
            if args.len() < 2 {
                return Ok(1);
            }
            let length = table_length(args)?;
            let position = integer_arg(args.get(1)).unwrap_or(length);
            Ok(distance(position, length))
        }),
        ("move", |args| {
            let first = integer_arg(args.get(1)).unwrap_or(1);
            let last = integer_arg(args.get(2)).unwrap_or(0);
            Ok(distance(first, last))
        }),
        ("concat", |args| {
            let first = integer_arg(args.get(2)).unwrap_or(1);
            let last = match integer_arg(args.get(3)) {
                Some(last) => last,
                None => table_length(args)?,
            };
            Ok(distance(first, last))
        }),
        ("sort", |args| {
            let length = table_length(args)?.max(1).unsigned_abs();
            Ok(length.saturating_mul(u64::from(64 - length.leading_zeros())))
        }),
    ];
    for (name, work) in counted {
        let original: Function = table.get(name)?;
        let budget = Arc::clone(budget);
        table.raw_set(
            name,
            lua.create_function(move |lua, args: MultiValue| {
                budget.charge(lua, work(&args)?)?;
                original.call::<MultiValue>(args)
            })?,
        )?;
    }
    Ok(())
}

/// `#t` for the table a table function was given (its `__len` included, as the C code uses it).
fn table_length(args: &MultiValue) -> mlua::Result<i64> {
    match args.front() {
        Some(LuaValue::Table(table)) => table.len(),
        _ => Ok(0),
    }
}

/// The elements from `first` to `last`, at least one.
fn distance(first: i64, last: i64) -> u64 {
    last.saturating_sub(first)
        .saturating_add(1)
        .max(1)
        .unsigned_abs()
}

/// An integer argument as Lua would read it, when it is one.
fn integer_arg(value: Option<&LuaValue>) -> Option<i64> {
    match value? {
        LuaValue::Integer(number) => Some(*number),
        LuaValue::Number(number) if number.is_finite() => Some(*number as i64),
        _ => None,
    }
}

/// What the counted pattern functions share: the file for errors and the budget they spend.
struct Matching {
    file: String,
    budget: Arc<InstructionBudget>,
    /// The longest string `gsub` builds, as the state's memory limit would allow.
    max_result_bytes: usize,
}

impl Matching {
    fn error(&self, lua: &Lua, function: &str, message: String) -> mlua::Error {
        CallError::raise(
            lua,
            &self.file,
            format!("string.{function}: {message}"),
            "correct the call on that line",
        )
    }

    /// A string argument (numbers become their text, as in Lua), at most
    /// [`MAX_PATTERN_SUBJECT_BYTES`] long.
    fn text(
        &self,
        lua: &Lua,
        function: &str,
        position: usize,
        value: &LuaValue,
    ) -> mlua::Result<Vec<u8>> {
        let text = match value {
            LuaValue::String(text) => text.as_bytes().to_vec(),
            LuaValue::Integer(_) | LuaValue::Number(_) => match lua.coerce_string(value.clone())? {
                Some(text) => text.as_bytes().to_vec(),
                None => Vec::new(),
            },
            other => {
                let message = format!(
                    "bad argument #{position} (string expected, got {})",
                    other.type_name()
                );
                return Err(self.error(lua, function, message));
            }
        };
        if text.len() > MAX_PATTERN_SUBJECT_BYTES {
            let message = format!(
                "argument #{position} is {} bytes; patterns work on strings of at most {}",
                text.len(),
                mebibytes(MAX_PATTERN_SUBJECT_BYTES)
            );
            return Err(self.error(lua, function, message));
        }
        Ok(text)
    }

    /// Runs `work` with what is left of the budget, and counts what it used.
    fn counted<T>(
        &self,
        lua: &Lua,
        function: &str,
        work: impl FnOnce(&mut Steps) -> Result<T, MatchError>,
    ) -> mlua::Result<T> {
        let mut steps = Steps {
            left: self.budget.remaining(),
        };
        let before = steps.left;
        let result = work(&mut steps);
        match result {
            Ok(value) => {
                self.budget.charge(lua, before - steps.left)?;
                Ok(value)
            }
            Err(MatchError::OutOfSteps) => Err(self.budget.stop(lua, calling_line(lua))),
            Err(MatchError::Pattern(message)) => Err(self.error(lua, function, message)),
        }
    }

    fn capture_value(lua: &Lua, subject: &[u8], capture: Capture) -> mlua::Result<LuaValue> {
        Ok(match capture {
            Capture::Text { start, end } => {
                LuaValue::String(lua.create_string(&subject[start..end])?)
            }
            Capture::Position(at) => LuaValue::Integer(i64::try_from(at + 1).unwrap_or(i64::MAX)),
        })
    }

    fn values(
        lua: &Lua,
        subject: &[u8],
        captures: impl IntoIterator<Item = Capture>,
    ) -> mlua::Result<MultiValue> {
        captures
            .into_iter()
            .map(|capture| Self::capture_value(lua, subject, capture))
            .collect()
    }

    /// `string.find` (`find` true) and `string.match`.
    fn find(
        &self,
        lua: &Lua,
        subject: &LuaValue,
        pattern: &LuaValue,
        init: Option<i64>,
        plain: bool,
        find: bool,
    ) -> mlua::Result<MultiValue> {
        let function = if find { "find" } else { "match" };
        let subject = self.text(lua, function, 1, subject)?;
        let pattern = self.text(lua, function, 2, pattern)?;
        let Some(init) = start_index(init, subject.len()) else {
            return Ok(MultiValue::from_iter([LuaValue::Nil]));
        };
        let one_based = |at: usize| LuaValue::Integer(i64::try_from(at).unwrap_or(i64::MAX));
        if find && (plain || is_plain(&pattern)) {
            let found = self.counted(lua, function, |steps| {
                find_plain(&subject, &pattern, init, steps)
            })?;
            return Ok(match found {
                Some(at) => {
                    MultiValue::from_iter([one_based(at + 1), one_based(at + pattern.len())])
                }
                None => MultiValue::from_iter([LuaValue::Nil]),
            });
        }
        let found = self.counted(lua, function, |steps| {
            Pattern::new(&pattern).find(&subject, init, steps)
        })?;
        let Some(found) = found else {
            return Ok(MultiValue::from_iter([LuaValue::Nil]));
        };
        if find {
            let mut values =
                MultiValue::from_iter([one_based(found.start + 1), one_based(found.end)]);
            values.extend(Self::values(lua, &subject, found.captures.iter().copied())?);
            Ok(values)
        } else {
            Self::values(lua, &subject, found.values())
        }
    }

    fn gmatch(
        self: &Arc<Self>,
        lua: &Lua,
        subject: &LuaValue,
        pattern: &LuaValue,
        init: Option<i64>,
    ) -> mlua::Result<Function> {
        let subject = self.text(lua, "gmatch", 1, subject)?;
        let pattern = self.text(lua, "gmatch", 2, pattern)?;
        let start = start_index(init, subject.len()).unwrap_or(subject.len() + 1);
        let position = Mutex::new((start, None::<usize>));
        let matching = Arc::clone(self);
        lua.create_function(move |lua, ()| {
            let mut position = position.lock().unwrap_or_else(PoisonError::into_inner);
            let (mut at, last_match) = *position;
            while at <= subject.len() {
                let found = matching.counted(lua, "gmatch", |steps| {
                    Pattern::without_anchor(&pattern).match_at(&subject, at, steps)
                })?;
                if let Some(found) = found
                    && Some(found.end) != last_match
                {
                    *position = (found.end, Some(found.end));
                    return Self::values(lua, &subject, found.values());
                }
                at += 1;
            }
            *position = (at, last_match);
            Ok(MultiValue::new())
        })
    }

    fn gsub(
        &self,
        lua: &Lua,
        subject_value: &LuaValue,
        pattern: &LuaValue,
        replacement: &LuaValue,
        most: Option<i64>,
    ) -> mlua::Result<(LuaValue, i64)> {
        let subject = self.text(lua, "gsub", 1, subject_value)?;
        let pattern = self.text(lua, "gsub", 2, pattern)?;
        let replacement = match replacement {
            LuaValue::String(_) | LuaValue::Integer(_) | LuaValue::Number(_) => {
                Replacement::Text(self.text(lua, "gsub", 3, replacement)?)
            }
            LuaValue::Table(table) => Replacement::Table(table.clone()),
            LuaValue::Function(function) => Replacement::Function(function.clone()),
            other => {
                let message = format!(
                    "bad argument #3 (string/function/table expected, got {})",
                    other.type_name()
                );
                return Err(self.error(lua, "gsub", message));
            }
        };
        let most = most.unwrap_or(i64::MAX);
        let pattern = Pattern::new(&pattern);
        let mut built: Vec<u8> = Vec::new();
        let (mut at, mut last_match, mut count, mut changed) = (0, None, 0_i64, false);
        while count < most {
            let found = self.counted(lua, "gsub", |steps| pattern.match_at(&subject, at, steps))?;
            match found {
                Some(found) if Some(found.end) != last_match => {
                    count += 1;
                    changed |= self.replace(lua, &subject, &found, &replacement, &mut built)?;
                    at = found.end;
                    last_match = Some(found.end);
                }
                _ if at < subject.len() => {
                    built.push(subject[at]);
                    at += 1;
                }
                _ => break,
            }
            if built.len() > self.max_result_bytes {
                let message = format!(
                    "the result would be larger than {}",
                    mebibytes(self.max_result_bytes)
                );
                return Err(self.error(lua, "gsub", message));
            }
            if pattern.is_anchored() {
                break;
            }
        }
        if !changed {
            return Ok((LuaValue::String(lua.create_string(&subject)?), count));
        }
        built.extend_from_slice(&subject[at..]);
        Ok((LuaValue::String(lua.create_string(&built)?), count))
    }

    /// Appends what replaces `found`; false when the original text was kept.
    fn replace(
        &self,
        lua: &Lua,
        subject: &[u8],
        found: &Match,
        replacement: &Replacement,
        built: &mut Vec<u8>,
    ) -> mlua::Result<bool> {
        let whole = &subject[found.start..found.end];
        let value = match replacement {
            Replacement::Text(text) => {
                let mut rest = text.as_slice();
                while let Some(percent) = rest.iter().position(|byte| *byte == b'%') {
                    built.extend_from_slice(&rest[..percent]);
                    let escaped = rest.get(percent + 1).copied();
                    match escaped {
                        Some(b'%') => built.push(b'%'),
                        Some(b'0') => built.extend_from_slice(whole),
                        Some(digit @ b'1'..=b'9') => {
                            let capture = found
                                .capture(usize::from(digit - b'1'))
                                .map_err(|error| self.pattern_error(lua, error))?;
                            match capture {
                                Capture::Text { start, end } => {
                                    built.extend_from_slice(&subject[start..end]);
                                }
                                Capture::Position(at) => {
                                    built.extend_from_slice((at + 1).to_string().as_bytes());
                                }
                            }
                        }
                        _ => {
                            let message = "invalid use of '%' in replacement string".to_owned();
                            return Err(self.error(lua, "gsub", message));
                        }
                    }
                    rest = &rest[(percent + 2).min(rest.len())..];
                }
                built.extend_from_slice(rest);
                self.budget.charge(lua, 1 + text.len() as u64 / 64)?;
                return Ok(true);
            }
            Replacement::Table(table) => {
                let first = found
                    .capture(0)
                    .map_err(|error| self.pattern_error(lua, error))?;
                table.get::<LuaValue>(Self::capture_value(lua, subject, first)?)?
            }
            Replacement::Function(function) => {
                function.call::<LuaValue>(Self::values(lua, subject, found.values())?)?
            }
        };
        match value {
            LuaValue::Nil | LuaValue::Boolean(false) => {
                built.extend_from_slice(whole);
                Ok(false)
            }
            LuaValue::String(_) | LuaValue::Integer(_) | LuaValue::Number(_) => {
                if let Some(text) = lua.coerce_string(value)? {
                    built.extend_from_slice(&text.as_bytes());
                    self.budget.charge(lua, 1 + built.len() as u64 / 4096)?;
                }
                Ok(true)
            }
            other => {
                let message = format!("invalid replacement value (a {})", other.type_name());
                Err(self.error(lua, "gsub", message))
            }
        }
    }

    fn pattern_error(&self, lua: &Lua, error: MatchError) -> mlua::Error {
        match error {
            MatchError::OutOfSteps => self.budget.stop(lua, calling_line(lua)),
            MatchError::Pattern(message) => self.error(lua, "gsub", message),
        }
    }
}

enum Replacement {
    Text(Vec<u8>),
    Table(Table),
    Function(Function),
}

/// Lua's `init` argument (1-based, negative from the end) as a 0-based offset; `None` when it
/// starts past the end.
fn start_index(init: Option<i64>, length: usize) -> Option<usize> {
    let length_i = i64::try_from(length).unwrap_or(i64::MAX);
    let one_based = match init.unwrap_or(1) {
        positive if positive > 0 => positive,
        0 => 1,
        negative if negative < -length_i => 1,
        negative => length_i + negative + 1,
    };
    let offset = usize::try_from(one_based - 1).ok()?;
    (offset <= length).then_some(offset)
}
