//! `workspace/HEARTBEAT.yml`: the agent's heartbeat tasks, checked.
//!
//! ```yaml
//! tasks:
//!   - name: standup
//!     prompt: "Summarise yesterday's merged pull requests."
//!     cron: "0 9 * * Mon-Fri"      # or every: 30m; seconds: true reads six fields
//!     tz: Europe/Berlin
//!     active_hours: "08:00-18:00"
//!     delivery: ops:standup
//! ```

use super::schedule::{self, ActiveHours, Schedule};
use crate::Timestamp;
use crate::name::{ChannelName, LaneName, ModelRef, RoomAlias, TaskName};
use crate::problem::{Pos, Problem};
use crate::tree::{Checker, Fields, Node, Path, Value};
use crate::yaml;
use chrono_tz::Tz;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::Arc;

/// The file's path relative to the agent directory, as problems name it.
pub const FILE: &str = "workspace/HEARTBEAT.yml";

const TASK_KEYS: &[&str] = &[
    "name",
    "prompt",
    "cron",
    "seconds",
    "every",
    "tz",
    "active_hours",
    "delivery",
    "lane",
    "model",
    "check",
    "continue",
    "missed",
    "enabled",
];

/// The most tasks the file may hold.
pub const MAX_TASKS: usize = 100;

/// How many slots the check that a schedule meets its active hours looks at.
const ACTIVE_HOURS_SAMPLE: usize = 2000;

/// What the rest of the agent's configuration says, for checking the file against it.
#[derive(Debug, Clone)]
pub struct HeartbeatEnv {
    /// The zone of tasks that name none.
    pub host_tz: Tz,
    /// The `channel:room` pairs the agent's channels declare; a delivery must name one.
    pub targets: Vec<TargetSpec>,
    /// The models `models.yml` declares; a task's model must be one.
    pub models: Vec<ModelRef>,
    /// When a running perch checks the file again: the rooms the channel files declare now.
    /// Channel files are read at start, so these may differ from `targets`, and a delivery to
    /// a room only they declare needs a restart. `None` when the channels were just read.
    pub channels_on_disk: Option<Vec<TargetSpec>>,
}

/// A room alias a channel declares, which a delivery may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSpec {
    pub channel: ChannelName,
    pub room: RoomAlias,
}

/// The checked file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeartbeatFile {
    pub tasks: Vec<HeartbeatTask>,
}

impl HeartbeatFile {
    /// The task called `name`.
    pub fn task(&self, name: &TaskName) -> Option<&HeartbeatTask> {
        self.tasks.iter().find(|task| task.name == *name)
    }
}

/// One task of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatTask {
    pub name: TaskName,
    /// Where the task's entry starts in the file.
    pub pos: Pos,
    pub prompt: String,
    pub schedule: Schedule,
    /// The zone of the task's cron pattern and active hours: its `tz:`, or the host's.
    pub tz: Tz,
    pub active_hours: Option<ActiveHours>,
    /// Where a `Message:` verdict goes.
    pub delivery: Option<Target>,
    /// Where a `Steer:` verdict goes; without one, the task's own lane.
    pub lane: Option<LaneName>,
    pub model: Option<ModelRef>,
    /// A shell command run first; a non-zero exit skips the slot.
    pub check: Option<String>,
    /// `continue:`: runs continue the lane's history instead of starting fresh.
    pub continue_history: bool,
    pub missed: Missed,
    pub enabled: bool,
}

/// What happens to slots that came due while they could not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Missed {
    /// `run_once`: every due slot folds into one run of the latest.
    #[default]
    RunOnce,
    /// `skip`: slots that cannot run on time are skipped.
    Skip,
}

impl Missed {
    /// The word the file uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Missed::RunOnce => "run_once",
            Missed::Skip => "skip",
        }
    }
}

/// A delivery target: `<channel>:<room alias>[/<thread>]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub channel: ChannelName,
    pub room: RoomAlias,
    pub thread: Option<String>,
}

impl Target {
    /// Reads `<channel>:<room alias>[/<thread>]`.
    pub fn parse(text: &str) -> Result<Target, String> {
        let Some((channel, rest)) = text.split_once(':') else {
            return Err(format!(
                "{text:?} names no room; write it as <channel>:<room alias>, such as ops:standup"
            ));
        };
        let (room, thread) = match rest.split_once('/') {
            Some((room, thread)) => (room, Some(thread)),
            None => (rest, None),
        };
        let channel = ChannelName::try_from(channel)?;
        let room = RoomAlias::try_from(room)?;
        let thread = match thread {
            None => None,
            Some(thread) if thread.is_empty() || thread.chars().any(char::is_whitespace) => {
                return Err(format!(
                    "{text:?} has an empty or spaced thread after '/'; write <channel>:<room>/<thread>"
                ));
            }
            Some(thread) => Some(thread.to_owned()),
        };
        Ok(Target {
            channel,
            room,
            thread,
        })
    }

    /// Whether the target names a room the agent declares.
    pub fn is_declared(&self, targets: &[TargetSpec]) -> bool {
        targets
            .iter()
            .any(|spec| spec.channel == self.channel && spec.room == self.room)
    }
}

impl serde::Serialize for Target {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.channel, self.room)?;
        if let Some(thread) = &self.thread {
            write!(f, "/{thread}")?;
        }
        Ok(())
    }
}

impl HeartbeatTask {
    /// A stable digest of the entry's content (not its position), which changes when the entry
    /// does.
    pub fn fingerprint(&self) -> String {
        let canonical = format!(
            "name={:?}\nprompt={:?}\nschedule={}\ntz={}\nactive_hours={:?}\ndelivery={:?}\n\
             lane={:?}\nmodel={:?}\ncheck={:?}\ncontinue={}\nmissed={}\nenabled={}\n",
            self.name.as_str(),
            self.prompt,
            self.schedule,
            self.tz.name(),
            self.active_hours.map(|hours| hours.to_string()),
            self.delivery.as_ref().map(Target::to_string),
            self.lane.as_ref().map(LaneName::as_str),
            self.model.as_ref().map(ModelRef::to_string),
            self.check,
            self.continue_history,
            self.missed.as_str(),
            self.enabled,
        );
        let digest = Sha256::digest(canonical.as_bytes());
        let mut hex = String::with_capacity(32);
        for byte in &digest[..16] {
            let _ = write!(hex, "{byte:02x}");
        }
        hex
    }

    /// The lane a `Steer:` verdict goes to: `lane:`, or the task's own lane.
    pub fn steer_lane(&self) -> LaneName {
        self.lane.clone().unwrap_or_else(|| self.name.own_lane())
    }
}

/// Parses and checks the file, reporting every problem with its line. An empty file, or
/// `tasks: []`, has no tasks.
pub fn parse_heartbeat_file(text: &str, env: &HeartbeatEnv) -> Result<HeartbeatFile, Vec<Problem>> {
    let tree = yaml::parse(FILE, text)?;
    let mut checker = Checker::new(FILE);
    let tasks = read_file(&mut checker, &tree, env);
    if checker.has_problems() {
        Err(checker.into_problems())
    } else {
        Ok(HeartbeatFile { tasks })
    }
}

fn read_file(checker: &mut Checker, tree: &Node, env: &HeartbeatEnv) -> Vec<HeartbeatTask> {
    if tree.value == Value::Nil {
        return Vec::new();
    }
    let root = Path::root();
    let Some(mut fields) = checker.fields(tree, &root) else {
        return Vec::new();
    };
    let tasks_node = fields.optional("tasks");
    fields.finish(checker, &["tasks"]);
    let Some(tasks_node) = tasks_node else {
        return Vec::new();
    };
    let path = root.key("tasks");
    let Some(items) = checker.list(tasks_node, &path) else {
        return Vec::new();
    };
    if items.len() > MAX_TASKS {
        checker.report_fix(
            tasks_node.pos,
            &path,
            format!(
                "holds {} tasks, more than the {MAX_TASKS} a heartbeat file may hold; none of them is checked",
                items.len()
            ),
            format!("keep at most {MAX_TASKS} tasks; fold similar ones into one prompt"),
        );
        return Vec::new();
    }
    let mut tasks: Vec<HeartbeatTask> = Vec::new();
    let mut samples = Samples::new();
    for (index, item) in items.iter().enumerate() {
        let Some(task) = read_task(checker, item, &path.index(index), env, &mut samples) else {
            continue;
        };
        if let Some(first) = tasks.iter().find(|other| other.name == task.name) {
            checker.report_fix(
                task.pos,
                &path.index(index).key("name"),
                format!(
                    "task {} is listed twice (first at line {})",
                    task.name, first.pos.line
                ),
                "give each task its own name",
            );
            continue;
        }
        tasks.push(task);
    }
    tasks
}

fn read_task(
    checker: &mut Checker,
    item: &Node,
    path: &Path,
    env: &HeartbeatEnv,
    samples: &mut Samples,
) -> Option<HeartbeatTask> {
    let mut fields = checker.fields(item, path)?;
    let name = fields
        .required(checker, "name", "name: standup")
        .and_then(|node| {
            let text = checker.str(node, &path.key("name"))?;
            match TaskName::try_from(text) {
                Ok(name) if name.is_dry_run_shaped() => {
                    checker.report_fix(
                        node.pos,
                        &path.key("name"),
                        format!(
                            "{text:?} ends in -dry-run, so its lane would be the dry-run lane of \
                             the task {:?}",
                            text.strip_suffix("-dry-run").unwrap_or(text)
                        ),
                        "choose a name that does not end in -dry-run".to_owned(),
                    );
                    None
                }
                Ok(name) => Some(name),
                Err(_) => {
                    checker.report_fix(
                        node.pos,
                        &path.key("name"),
                        format!("{text:?} is not a task name"),
                        format!("use {}", TaskName::RULE),
                    );
                    None
                }
            }
        });
    let prompt = fields
        .required(
            checker,
            "prompt",
            "prompt: what the agent should look at on every run",
        )
        .and_then(|node| checker.non_empty_str(node, &path.key("prompt")))
        .map(str::to_owned);
    let tz = match fields.optional("tz") {
        None => Some(env.host_tz),
        Some(node) => read_tz(checker, node, &path.key("tz")),
    };
    let schedule = read_schedule(checker, &mut fields, item.pos, path, tz, samples);
    let active_hours = optional(
        checker,
        &mut fields,
        "active_hours",
        |checker, node, path| {
            let text = checker.str(node, path)?;
            ActiveHours::parse(text)
                .map_err(|error| {
                    checker.report_fix(
                        node.pos,
                        path,
                        error,
                        "write the hours in the task's zone as HH:MM-HH:MM, such as 08:00-18:00 or \
                     22:00-06:00",
                    );
                })
                .ok()
        },
    );
    let delivery = optional(checker, &mut fields, "delivery", |checker, node, path| {
        read_delivery(checker, node, path, env)
    });
    let lane = optional(checker, &mut fields, "lane", |checker, node, path| {
        let text = checker.str(node, path)?;
        LaneName::try_from(text)
            .map_err(|_| {
                checker.report_fix(
                    node.pos,
                    path,
                    format!("{text:?} is not a lane name"),
                    format!("use {}", LaneName::RULE),
                );
            })
            .ok()
    });
    let model = optional(checker, &mut fields, "model", |checker, node, path| {
        read_model(checker, node, path, env)
    });
    let check = optional(checker, &mut fields, "check", |checker, node, path| {
        checker.non_empty_str(node, path).map(str::to_owned)
    });
    let continue_history = optional(checker, &mut fields, "continue", |checker, node, path| {
        checker.bool(node, path)
    });
    let missed = optional(checker, &mut fields, "missed", |checker, node, path| {
        let text = checker.str(node, path)?;
        match text {
            "run_once" => Some(Missed::RunOnce),
            "skip" => Some(Missed::Skip),
            _ => {
                checker.report_fix(
                    node.pos,
                    path,
                    format!("unknown missed policy {text:?}"),
                    "use run_once (missed slots fold into one run) or skip",
                );
                None
            }
        }
    });
    let enabled = optional(checker, &mut fields, "enabled", |checker, node, path| {
        checker.bool(node, path)
    });
    fields.finish(checker, TASK_KEYS);
    let ((schedule, sample), tz, active_hours) = (schedule?, tz?, active_hours?);
    if let Some(hours) = &active_hours {
        check_meets_active_hours(checker, item.pos, path, (&schedule, &sample), tz, hours);
    }
    Some(HeartbeatTask {
        name: name?,
        pos: Pos::line(item.pos.line),
        prompt: prompt?,
        schedule,
        tz,
        active_hours,
        delivery: delivery?,
        lane: lane?,
        model: model?,
        check: check?,
        continue_history: continue_history?.unwrap_or(false),
        missed: missed?.unwrap_or_default(),
        enabled: enabled?.unwrap_or(true),
    })
}

/// Reads an optional key: `Some(None)` when absent, `None` when present and wrong.
fn optional<T>(
    checker: &mut Checker,
    fields: &mut Fields<'_>,
    key: &str,
    read: impl FnOnce(&mut Checker, &Node, &Path) -> Option<T>,
) -> Option<Option<T>> {
    let path = fields.path_of(key);
    match fields.optional(key) {
        None => Some(None),
        Some(node) => read(checker, node, &path).map(Some),
    }
}

fn read_tz(checker: &mut Checker, node: &Node, path: &Path) -> Option<Tz> {
    let text = checker.str(node, path)?;
    match text.parse::<Tz>() {
        Ok(tz) => Some(tz),
        Err(_) => {
            let near = chrono_tz::TZ_VARIANTS
                .iter()
                .find(|tz| tz.name().eq_ignore_ascii_case(text));
            let fix = match near {
                Some(tz) => format!("did you mean {}?", tz.name()),
                None => "use an IANA time zone name, such as Europe/Berlin, America/New_York or \
                         UTC"
                .to_owned(),
            };
            checker.report_fix(node.pos, path, format!("unknown time zone {text:?}"), fix);
            None
        }
    }
}

fn read_schedule(
    checker: &mut Checker,
    fields: &mut Fields<'_>,
    pos: Pos,
    path: &Path,
    tz: Option<Tz>,
    samples: &mut Samples,
) -> Option<(Schedule, Sample)> {
    let cron = fields.optional("cron");
    let every = fields.optional("every");
    let seconds = match fields.optional("seconds") {
        None => false,
        Some(node) => {
            let seconds_path = path.key("seconds");
            let seconds = checker.bool(node, &seconds_path)?;
            if seconds && cron.is_none() {
                checker.report_fix(
                    node.pos,
                    &seconds_path,
                    "seconds: true goes with cron only",
                    "remove seconds, or give the task a cron pattern with six fields",
                );
                return None;
            }
            seconds
        }
    };
    let schedule = match (cron, every) {
        (Some(_), Some(_)) => {
            checker.report_fix(
                pos,
                path,
                "a task has both cron and every",
                "keep one of them",
            );
            return None;
        }
        (None, None) => {
            checker.report_fix(
                pos,
                path,
                "missing cron or every",
                "add cron: \"0 9 * * Mon-Fri\" or every: 30m",
            );
            return None;
        }
        (Some(node), None) => {
            let path = path.key("cron");
            let text = checker.str(node, &path)?;
            let schedule = Schedule::cron(text, tz?, seconds)
                .map_err(|error| checker.report_fix(node.pos, &path, error.message, error.fix))
                .ok()?;
            (node, path, schedule)
        }
        (None, Some(node)) => {
            let path = path.key("every");
            let Value::Str(text) = &node.value else {
                checker.report_fix(
                    node.pos,
                    &path,
                    format!("expected an interval, found {}", node.value.kind()),
                    "write a number and a unit (s, m, h, d), such as 30m or 1h30m",
                );
                return None;
            };
            let interval = schedule::parse_every(text)
                .map_err(|error| {
                    checker.report_fix(
                        node.pos,
                        &path,
                        error,
                        "write a number and a unit (s, m, h, d), such as 30m or 1h30m",
                    );
                })
                .ok()?;
            (node, path, Schedule::Every(interval))
        }
    };
    let (node, path, schedule) = schedule;
    match samples.floor_sample(&schedule) {
        Ok(sample) => Some((schedule, sample)),
        Err(error) => {
            checker.report_fix(
                node.pos,
                &path,
                error,
                "let at least 5 minutes pass between runs, such as every: 5m or cron: \"*/5 * * * *\"",
            );
            None
        }
    }
}

/// A cron pattern's first firings in its zone, computed once for the floor and the active hours.
type Sample = Arc<Vec<Timestamp>>;

/// The samples of the patterns a file has checked so far: a file that repeats one pattern in
/// many tasks costs one sample, so checking a file stays fast.
struct Samples(HashMap<(String, &'static str), Result<Sample, String>>);

impl Samples {
    fn new() -> Self {
        Samples(HashMap::new())
    }

    fn floor_sample(&mut self, schedule: &Schedule) -> Result<Sample, String> {
        let Schedule::Cron { expr, tz, .. } = schedule else {
            return schedule.floor_sample().map(Arc::new);
        };
        self.0
            .entry((expr.clone(), tz.name()))
            .or_insert_with(|| schedule.floor_sample().map(Arc::new))
            .clone()
    }
}

fn check_meets_active_hours(
    checker: &mut Checker,
    pos: Pos,
    path: &Path,
    (schedule, sample): (&Schedule, &Sample),
    tz: Tz,
    hours: &ActiveHours,
) {
    let meets = if sample.is_empty() {
        let mut cursor = schedule::SAMPLE_START;
        let mut meets = false;
        for _ in 0..ACTIVE_HOURS_SAMPLE {
            let Some(slot) = schedule::next_slot(schedule, cursor) else {
                break;
            };
            if schedule::in_active_hours(hours, tz, slot) {
                meets = true;
                break;
            }
            cursor = slot;
        }
        meets
    } else {
        sample
            .iter()
            .take(ACTIVE_HOURS_SAMPLE)
            .any(|slot| schedule::in_active_hours(hours, tz, *slot))
    };
    if !meets {
        checker.report_fix(
            pos,
            &path.key("active_hours"),
            format!("the schedule never fires inside the active hours {hours} ({tz})"),
            "widen active_hours, or move the schedule inside them",
        );
    }
}

fn read_delivery(
    checker: &mut Checker,
    node: &Node,
    path: &Path,
    env: &HeartbeatEnv,
) -> Option<Target> {
    let text = checker.str(node, path)?;
    let target = match Target::parse(text) {
        Ok(target) => target,
        Err(error) => {
            checker.report_fix(
                node.pos,
                path,
                error,
                "write <channel>:<room alias>[/<thread>], such as ops:standup",
            );
            return None;
        }
    };
    if !target.is_declared(&env.targets) {
        let declared_now = env
            .channels_on_disk
            .as_ref()
            .is_some_and(|on_disk| target.is_declared(on_disk));
        let mut fix = if declared_now {
            format!(
                "channels/{}.lua declares it now, but perch loaded that file before; restart \
                 perch to load it",
                target.channel
            )
        } else if env.targets.is_empty() {
            "no channel declares a room; give a channel file rooms = { alias = \"...\" } first"
                .to_owned()
        } else {
            let declared: Vec<String> = env
                .targets
                .iter()
                .map(|spec| format!("{}:{}", spec.channel, spec.room))
                .collect();
            format!("use a declared room: {}", declared.join(", "))
        };
        if env.channels_on_disk.is_some() && !declared_now {
            fix.push_str(
                " (channel files are read at start: restart perch after editing channels/*.lua)",
            );
        }
        checker.report_fix(
            node.pos,
            path,
            format!(
                "{}:{} is not a room the agent's channels declare",
                target.channel, target.room
            ),
            fix,
        );
        return None;
    }
    Some(target)
}

fn read_model(
    checker: &mut Checker,
    node: &Node,
    path: &Path,
    env: &HeartbeatEnv,
) -> Option<ModelRef> {
    let text = checker.str(node, path)?;
    let model = match ModelRef::parse(text) {
        Ok(model) => model,
        Err(error) => {
            checker.report_fix(
                node.pos,
                path,
                error,
                "write provider/model-id, as models.yml declares it",
            );
            return None;
        }
    };
    if !env.models.contains(&model) {
        let declared: Vec<String> = env.models.iter().map(ModelRef::to_string).collect();
        let fix = if declared.is_empty() {
            "models.yml declares no models; declare it there first".to_owned()
        } else {
            format!("use a model models.yml declares: {}", declared.join(", "))
        };
        checker.report_fix(
            node.pos,
            path,
            format!("model {model} is not declared in models.yml"),
            fix,
        );
        return None;
    }
    Some(model)
}

#[cfg(test)]
mod tests;
