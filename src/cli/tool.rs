//! `perch exec` and `perch tool`: a command, or one of the agent's tools, run in its sandbox
//! from the terminal.

use super::{cancel_on_interrupt, dir_or_current, emit, load_agent, machine, runtime};
use crate::model::ToolSpec;
use crate::sandbox::{self, End};
use crate::tools::builtin::builtin_specs;
use crate::tools::toolbox::Toolbox;
use perch_core::terminal::shown;
use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Run a command in the agent's sandbox and exit with its status
///
/// The command runs through `sh -lc` in /workspace. The words after `--` are joined with spaces into one shell line, as ssh does.
/// Standard input is passed on when it is not a terminal. Ctrl-C cancels (exit 130).
#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// The agent directory [default: the current directory]
    pub dir: Option<PathBuf>,
    /// The command line
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// List the agent's tools, or run one with JSON arguments and print its result.
///
/// With one argument, it is the agent directory when it is a directory, and the tool's name
/// otherwise; with -C DIR, the one argument is the tool's name.
#[derive(Debug, clap::Args)]
pub struct ToolArgs {
    /// The agent directory [default: the current directory]
    #[arg(value_name = "DIR")]
    pub first: Option<String>,
    /// The tool to run; without it, the tools are listed
    #[arg(value_name = "NAME")]
    pub second: Option<String>,
    /// The arguments, as one JSON object
    #[arg(long, value_name = "JSON")]
    pub args: Option<String>,
}

pub fn exec(args: ExecArgs) -> Result<ExitCode, String> {
    let dir = dir_or_current(args.dir);
    let words = &args.command;
    let agent = match load_agent(&dir)? {
        Ok(agent) => agent,
        Err(code) => return Ok(code),
    };
    let mut stdin = None;
    if !io::stdin().is_terminal() {
        let mut bytes = Vec::new();
        io::stdin()
            .read_to_end(&mut bytes)
            .map_err(|error| format!("cannot read standard input: {error}"))?;
        stdin = Some(bytes);
    }
    runtime()?.block_on(async {
        let machine = machine(&agent)?;
        let mut command = sandbox::Command::argv(["/bin/sh", "-lc", &words.join(" ")]);
        command.stdin = stdin;
        let result = machine.run(command, cancel_on_interrupt()).await;
        let stopped = machine.stop().await;
        let output = result.map_err(|error| error.to_string())?;
        write_captured(&mut io::stdout(), &output.stdout, "stdout");
        write_captured(&mut io::stderr(), &output.stderr, "stderr");
        if !matches!(output.end, End::Exited(_)) {
            eprintln!("perch: the command was {}", output.end);
        }
        stopped.map_err(|error| error.to_string())?;
        Ok(ExitCode::from(u8::try_from(output.end.code()).unwrap_or(1)))
    })
}

/// Writes what perch kept of a stream; a line on stderr says how much of it was left out.
fn write_captured(out: &mut impl Write, stream: &sandbox::Captured, name: &str) {
    out.write_all(stream.head()).and_then(|()| out.flush()).ok();
    if !stream.is_complete() {
        eprintln!(
            "\nperch: {} of {} bytes of {name} left out (perch keeps the first and last {} KiB of each stream)",
            stream.omitted(),
            stream.total(),
            sandbox::StreamCap::HOST_DEFAULT.head >> 10
        );
        out.write_all(stream.tail()).and_then(|()| out.flush()).ok();
    }
}

/// The agent directory and the tool's name `perch tool` was given: `-C DIR` (`flag`), then
/// `[DIR] [NAME]`, where a lone argument that is not a directory is the tool's name.
fn tool_target(
    flag: Option<PathBuf>,
    first: Option<String>,
    second: Option<String>,
) -> Result<(PathBuf, Option<String>), String> {
    match (flag, first, second) {
        (Some(flag), Some(first), Some(second)) => {
            let dir = super::given_dir(Some(flag), Some(PathBuf::from(first)))?;
            Ok((dir_or_current(dir), Some(second)))
        }
        (Some(flag), name, None) => Ok((flag, name)),
        (None, Some(first), None) if !Path::new(&first).is_dir() => {
            if crate::agent::AgentDir::open(Path::new(".")).is_err() {
                return Err(format!(
                    "{} is not a directory, and the current directory is not an agent \
                     directory\n  fix: name the agent: perch tool -C DIR {}",
                    shown(&first),
                    shown(&first)
                ));
            }
            Ok((PathBuf::from("."), Some(first)))
        }
        (_, first, second) => Ok((dir_or_current(first.map(PathBuf::from)), second)),
    }
}

/// Runs `perch tool`; `flag` is the directory `-C` names.
pub fn tool(args: ToolArgs, flag: Option<PathBuf>) -> Result<ExitCode, String> {
    let (dir, name) = tool_target(flag, args.first, args.second)?;
    let name = name.as_deref();
    let args = args.args.as_deref();
    let agent = match load_agent(&dir)? {
        Ok(agent) => agent,
        Err(code) => return Ok(code),
    };
    let Some(name) = name else {
        let mut out = String::new();
        let lua_tools = agent.definition.tools.iter().map(|tool| ToolSpec {
            name: tool.name.to_string(),
            description: tool.description.clone(),
            parameters: tool.json_schema(),
        });
        for tool in builtin_specs().into_iter().chain(lua_tools) {
            out.push_str(&format!(
                "{}  {}\n",
                tool.name,
                first_line(&tool.description)
            ));
            out.push_str(&format!(
                "    arguments: {}\n",
                tool.parameters["properties"]
            ));
        }
        emit(&out)?;
        return Ok(ExitCode::SUCCESS);
    };
    let arguments: serde_json::Value = match args {
        Some(text) => {
            serde_json::from_str(text).map_err(|error| format!("--args is not JSON: {error}"))?
        }
        None => serde_json::Value::Object(serde_json::Map::new()),
    };
    runtime()?.block_on(async {
        let machine = machine(&agent)?;
        let toolbox = Toolbox::new(std::sync::Arc::new(agent), machine.clone());
        let outcome = toolbox.call(name, &arguments, cancel_on_interrupt()).await;
        let stopped = machine.stop().await;
        let mut text = outcome.output;
        if !text.ends_with('\n') {
            text.push('\n');
        }
        stopped.map_err(|error| error.to_string())?;
        if outcome.is_error {
            eprint!("error: {}", perch_core::terminal::escaped_lines(&text));
            return Ok(ExitCode::FAILURE);
        }
        super::emit_escaped(&text)?;
        Ok(ExitCode::SUCCESS)
    })
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}
