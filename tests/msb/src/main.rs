//! `msb`, stood in for: the microsandbox 0.7.11 runtime's process boundary (argv, inherited
//! descriptors, the catalog, the agent and control sockets) with commands run in Linux
//! namespaces instead of a microVM. A test fixture only; never installed.

/// The version stamp the crate reads from the runtime's ELF (`.msbver`) to choose the launch
/// contract; it must equal the crate's own version.
#[allow(unsafe_code)]
#[unsafe(link_section = ".msbver")]
#[used]
static MSB_VERSION_STAMP: [u8; 6] = *b"0.7.11";

mod catalog;
mod control;
mod guest;
mod launch;
mod relay;

fn main() -> std::process::ExitCode {
    use std::io::Write;
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--version") => {
            let _ = writeln!(std::io::stdout(), "msb 0.7.11");
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
