//! perch's built-in tools, `bash`, `read`, `write` and `edit`, carried out in the agent's
//! sandbox. Every effect is a command run by the [`Machine`]: perch never opens a workspace
//! file on the host for the model, so a symlink made in the guest leads only to guest files.
//! File contents travel on stdin, never in argv; paths are passed as arguments, never spliced
//! into a script.

use crate::model::ToolSpec;
use crate::sandbox::{Command, End, Machine, Output, StreamCap};
use crate::tools::Ran;
use perch_core::builtin::{
    BASH_DEFAULT_TIMEOUT_SECS, BASH_MAX_TIMEOUT_SECS, BuiltinTool, READ_LINE_BYTES,
    READ_PAGE_CHARS, builtin_tools, read_page,
};
use perch_core::edit::replace_once;
use perch_core::output::{KeptFiles, MODEL_OUTPUT_LIMIT, streams_for_model};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The longest a `read`, `write` or `edit` command may take in the guest.
const FILE_TIMEOUT: Duration = Duration::from_secs(120);
/// The largest file `edit` reads into perch; its read-back is capped at this size, not at the
/// host's usual 1 MiB per stream.
const EDIT_MAX_BYTES: usize = 8 * 1024 * 1024;

/// Runs the command from stdin with bash, or with sh in an image without bash.
const BASH_SCRIPT: &str =
    "if [ -x /bin/bash ]; then exec /bin/bash -c 'eval \"$(cat)\"'; fi; eval \"$(cat)\"";

/// `$1` path, `$2` first line, `$3` line limit, `$4` bytes per line, `$5` bytes per page. Lists
/// the lines the core's `read_page` expects: each cut line marked with \037 and its length,
/// then \036 and the file's line count.
const READ_SCRIPT: &str = r#"if [ -d "$1" ]; then echo "$1 is a directory; list it with bash (ls)" >&2; exit 2; fi
if [ ! -e "$1" ]; then echo "$1 does not exist in the sandbox" >&2; exit 2; fi
if [ ! -f "$1" ]; then echo "$1 is not a regular file" >&2; exit 2; fi
nul=$(head -c 8192 < "$1" | tr -dc '\000' | wc -c) || exit 2
if [ $nul -ne 0 ]; then echo "$1 is a binary file ($(wc -c < "$1") bytes); inspect it with bash, e.g. file or od -c" >&2; exit 2; fi
exec awk -v first="$2" -v limit="$3" -v width="$4" -v budget="$5" '
NR >= first && NR < first + limit && printed < budget {
  if (length($0) > width) line = substr($0, 1, width) "\037" length($0); else line = $0
  print line
  printed += length(line) + 1
}
END { print "\036" NR }' < "$1""#;

/// `$1` path, `$2` the most bytes. Prints the file.
const EDIT_READ_SCRIPT: &str = r#"if [ ! -e "$1" ]; then echo "$1 does not exist in the sandbox; create it with write" >&2; exit 2; fi
if [ ! -f "$1" ]; then echo "$1 is not a regular file" >&2; exit 2; fi
size=$(wc -c < "$1") || exit 2
if [ $size -gt "$2" ]; then echo "$1 is $size bytes, more than edit handles ($2); change it with bash" >&2; exit 2; fi
exec cat < "$1""#;

/// `$1` path. Writes stdin to it, creating missing parent directories.
const WRITE_SCRIPT: &str = r#"mkdir -p -- "$(dirname -- "$1")" && cat > "$1""#;

/// The built-in tools as the model sees them, in the order `bash`, `read`, `write`, `edit`.
pub fn builtin_specs() -> Vec<ToolSpec> {
    builtin_tools().iter().map(spec).collect()
}

fn spec(tool: &BuiltinTool) -> ToolSpec {
    ToolSpec {
        name: tool.name.to_owned(),
        description: tool.description.to_owned(),
        parameters: tool.json_schema(),
    }
}

/// Runs the built-in tool `tool` with `arguments` already checked against its declaration
/// (defaults filled in), and the exit status of `bash`'s command. `Ok` is the result for the
/// model; `Err` is an error result: a refused
/// argument, a guest command that failed, a command killed on timeout or cancel (with its
/// output), or a sandbox that cannot run commands.
pub async fn run_builtin(
    machine: &Machine,
    tool: &BuiltinTool,
    arguments: &serde_json::Value,
    cancel: CancellationToken,
) -> Ran {
    let arguments = Arguments(arguments);
    let result = match tool.name {
        "bash" => return bash(machine, &arguments, cancel).await,
        "read" => read(machine, &arguments, cancel).await,
        "write" => write(machine, &arguments, cancel).await,
        "edit" => edit(machine, &arguments, cancel).await,
        other => Err(format!("{other} is not a built-in tool")),
    };
    Ran::without_command(result)
}

/// `bash`: the command's result, and its exit status when it exited.
async fn bash(machine: &Machine, arguments: &Arguments<'_>, cancel: CancellationToken) -> Ran {
    match bash_output(machine, arguments, cancel).await {
        Ok((result, end)) => Ran {
            result,
            exit_code: match end {
                End::Exited(code) => Some(code),
                End::Signalled(_) | End::Cancelled | End::TimedOut(_) => None,
            },
        },
        Err(refused) => Ran::without_command(Err(refused)),
    }
}

/// `Err` when the command did not run; otherwise its result and how it ended.
async fn bash_output(
    machine: &Machine,
    arguments: &Arguments<'_>,
    cancel: CancellationToken,
) -> Result<(Result<String, String>, End), String> {
    let command = arguments.string("command")?;
    let seconds =
        arguments
            .integer("timeout")
            .map_or(Ok(BASH_DEFAULT_TIMEOUT_SECS), |seconds| {
                u64::try_from(seconds)
                .ok()
                .filter(|seconds| (1..=BASH_MAX_TIMEOUT_SECS).contains(seconds))
                .ok_or_else(|| {
                    format!(
                        "`timeout` must be from 1 to {BASH_MAX_TIMEOUT_SECS} seconds, not {seconds}"
                    )
                })
            })?;
    if command.trim().is_empty() {
        return Err("`command` is empty".to_owned());
    }
    let kept = KeptFiles::for_id(&uuid::Uuid::now_v7().to_string());
    let run = Command::argv(["/bin/sh", "-c", BASH_SCRIPT, "perch-bash"])
        .stdin(command.as_bytes())
        .timeout(Duration::from_secs(seconds))
        .keep_in_guest(kept.clone(), MODEL_OUTPUT_LIMIT);
    let output = run_in(machine, run, cancel).await?;
    let mut text = streams_for_model(&output.stdout, &output.stderr, MODEL_OUTPUT_LIMIT, &kept);
    let end = output.end;
    let killed = match end {
        End::Exited(0) if text.is_empty() => return Ok((Ok("(no output)".to_owned()), end)),
        End::Exited(0) => return Ok((Ok(text), end)),
        End::Exited(_) | End::Signalled(_) => false,
        End::Cancelled | End::TimedOut(_) => true,
    };
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!("[{end}]"));
    Ok((if killed { Err(text) } else { Ok(text) }, end))
}

async fn read(
    machine: &Machine,
    arguments: &Arguments<'_>,
    cancel: CancellationToken,
) -> Result<String, String> {
    let path = arguments.path()?;
    let offset = arguments.positive("offset")?;
    let limit = arguments.positive("limit")?;
    let page_bytes = READ_PAGE_CHARS * 4;
    let run = Command::argv([
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        READ_SCRIPT.to_owned(),
        "perch-read".to_owned(),
        path.to_owned(),
        offset.to_string(),
        limit.to_string(),
        READ_LINE_BYTES.to_string(),
        page_bytes.to_string(),
    ])
    .env("LC_ALL", "C")
    .timeout(FILE_TIMEOUT);
    let output = succeeded(run_in(machine, run, cancel).await?, "read", path)?;
    let page = output
        .stdout
        .whole()
        .ok_or_else(|| format!("could not read {path}: the page was longer than perch reads"))?;
    read_page(path, offset, limit, page)
}

async fn write(
    machine: &Machine,
    arguments: &Arguments<'_>,
    cancel: CancellationToken,
) -> Result<String, String> {
    let path = arguments.path()?;
    let content = arguments.string("content")?;
    put(machine, path, content, cancel).await?;
    Ok(format!("wrote {} bytes to {path}", content.len()))
}

async fn edit(
    machine: &Machine,
    arguments: &Arguments<'_>,
    cancel: CancellationToken,
) -> Result<String, String> {
    let path = arguments.path()?;
    let old_text = arguments.string("old_text")?;
    let new_text = arguments.string("new_text")?;
    let fetch = Command::argv([
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        EDIT_READ_SCRIPT.to_owned(),
        "perch-edit".to_owned(),
        path.to_owned(),
        EDIT_MAX_BYTES.to_string(),
    ])
    .timeout(FILE_TIMEOUT)
    .output_cap(StreamCap::whole(EDIT_MAX_BYTES));
    let output = succeeded(run_in(machine, fetch, cancel.clone()).await?, "edit", path)?;
    let bytes = output.stdout.into_whole().map_err(|_| {
        format!("{path} grew past {EDIT_MAX_BYTES} bytes while edit read it; change it with bash")
    })?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{path} is not UTF-8 text, so edit cannot change it; use bash"))?;
    let replaced = replace_once(&text, old_text, new_text)
        .map_err(|error| format!("{path} was not changed: {error}"))?;
    put(machine, path, &replaced.text, cancel).await?;
    Ok(format!(
        "edited {path}: replaced the text at line {}",
        replaced.line
    ))
}

async fn put(
    machine: &Machine,
    path: &str,
    content: &str,
    cancel: CancellationToken,
) -> Result<(), String> {
    let run = Command::argv(["/bin/sh", "-c", WRITE_SCRIPT, "perch-write", path])
        .stdin(content.as_bytes())
        .timeout(FILE_TIMEOUT);
    succeeded(run_in(machine, run, cancel).await?, "write", path).map(|_| ())
}

async fn run_in(
    machine: &Machine,
    command: Command,
    cancel: CancellationToken,
) -> Result<Output, String> {
    machine
        .run(command, cancel)
        .await
        .map_err(|error| error.to_string())
}

/// The output of a file command that exited 0; otherwise an error with its stderr (exit 2 is
/// one of the scripts' own refusals, which name the path already).
fn succeeded(output: Output, verb: &str, path: &str) -> Result<Output, String> {
    if output.end == End::Exited(0) {
        return Ok(output);
    }
    let stderr = output.stderr.marked_text("stderr");
    let stderr = stderr.trim();
    Err(match output.end {
        End::Exited(2) if !stderr.is_empty() => stderr.to_owned(),
        _ if stderr.is_empty() => format!("could not {verb} {path}: {}", output.end),
        _ => format!("could not {verb} {path} ({}): {stderr}", output.end),
    })
}

struct Arguments<'a>(&'a serde_json::Value);

impl Arguments<'_> {
    fn string(&self, key: &str) -> Result<&str, String> {
        self.0[key]
            .as_str()
            .ok_or_else(|| format!("`{key}` is required"))
    }

    fn integer(&self, key: &str) -> Option<i64> {
        self.0[key].as_i64()
    }

    fn path(&self) -> Result<&str, String> {
        let path = self.string("path")?;
        if path.is_empty() {
            return Err("`path` is empty".to_owned());
        }
        if path.contains('\0') {
            return Err("`path` contains a NUL character".to_owned());
        }
        Ok(path)
    }

    fn positive(&self, key: &str) -> Result<u64, String> {
        let value = &self.0[key];
        value
            .as_u64()
            .filter(|number| *number >= 1)
            .ok_or_else(|| format!("`{key}` counts from 1, so {value} is not allowed"))
    }
}
