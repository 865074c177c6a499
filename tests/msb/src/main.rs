//! `msb`, stood in for: the microsandbox 0.7.11 runtime's process boundary (argv, inherited
//! descriptors, the catalog, the agent and control sockets) with commands run in Linux
//! namespaces instead of a microVM. A test fixture only; never installed.

/// The version stamp the crate reads from the runtime's ELF (`.msbver`) to choose the launch
/// contract; it must equal the crate's own version.
#[allow(unsafe_code)]
#[unsafe(link_section = ".msbver")]
#[used]
static MSB_VERSION_STAMP: [u8; 6] = *b"0.7.11";

/// The file whose presence beside this binary makes `--version` answer exactly like the real
/// runtime (`msb 0.7.11`), which perch checks before every boot: the suite's stand-in home has
/// it. Without it the answer names the stand-in, and `perch doctor` and
/// `deploy/install-runtime.sh` refuse it.
const POSE_AS_REAL: &str = "msb.pose-as-real";

mod catalog;
mod control;
mod guest;
mod launch;
mod relay;

/// `--version`'s answer: the real runtime's words when [`POSE_AS_REAL`] is beside this binary.
fn version_answer() -> &'static str {
    let posing = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(POSE_AS_REAL)))
        .is_some_and(|marker| marker.exists());
    if posing {
        "msb 0.7.11"
    } else {
        "msb 0.7.11 (perch test stand-in)"
    }
}

fn main() -> std::process::ExitCode {
    use std::io::Write;
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--version") => {
            let _ = writeln!(std::io::stdout(), "{}", version_answer());
            std::process::ExitCode::SUCCESS
        }
        Some("__launch-protocol") => match serde_json::to_string(&launch::capabilities()) {
            Ok(json) => {
                let _ = writeln!(std::io::stdout(), "{json}");
                std::process::ExitCode::SUCCESS
            }
            Err(error) => {
                let _ = writeln!(std::io::stderr(), "msb: {error}");
                std::process::ExitCode::FAILURE
            }
        },
        Some("machine") => launch::machine(&args),
        _ => {
            let _ = writeln!(
                std::io::stderr(),
                "msb stand-in: unsupported arguments {args:?}"
            );
            std::process::ExitCode::from(2)
        }
    }
}
