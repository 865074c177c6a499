//! One user per agent on the host: `perch chown` moving an agent's files to its own user
//! without touching what the old user planted, and the control socket answering root, the
//! agent's user and its operators' group only, as the kernel names each peer.
//!
//! These run as root (they change owners and act as other users with `setpriv`); elsewhere
//! they print `skipped: <reason>`.

use super::support::scenario::Scenario;
use super::support::{perch, stderr, stdout};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

/// The old service user, the agent's new user, and the operators' group: ids no account has.
const OLD: u32 = 47_001;
const NEW: u32 = 47_002;
const OPERATORS: u32 = 47_003;
/// Someone else on the host.
const STRANGER: u32 = 47_004;

#[allow(clippy::print_stdout)] // The skip reason, printed like a test's own output.
fn as_root() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        println!("skipped: changing owners needs root");
    }
    root
}

fn owner(path: &Path) -> (u32, u32) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    (meta.uid(), meta.gid())
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
}

#[test]
fn chown_gives_the_old_users_files_and_skips_links_hard_links_and_other_owners() {
    if !as_root() {
        return;
    }
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("root-only");
    std::fs::write(&secret, "root's").unwrap();
    let neighbour = outside.path().join("another-agents-file");
    std::fs::write(&neighbour, "b's").unwrap();
    chown(&neighbour, OLD);

    let agent = tempfile::tempdir().unwrap();
    let root = agent.path();
    std::fs::create_dir_all(root.join(".perch/lanes/tg")).unwrap();
    std::fs::create_dir_all(root.join("workspace/notes")).unwrap();
    std::fs::write(root.join("agent.lua"), "agent {}\n").unwrap();
    std::fs::write(root.join(".perch/lanes/tg/log.jsonl"), "{}\n").unwrap();
    std::fs::write(root.join("workspace/notes/today.md"), "notes\n").unwrap();
    std::os::unix::fs::symlink(&secret, root.join("workspace/link")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("workspace/dir-link")).unwrap();
    std::fs::hard_link(&neighbour, root.join("workspace/hard")).unwrap();
    std::fs::write(root.join("workspace/planted-by-root"), "root's too").unwrap();
    for path in [
        ".",
        ".perch",
        ".perch/lanes",
        ".perch/lanes/tg",
        ".perch/lanes/tg/log.jsonl",
        "agent.lua",
        "workspace",
        "workspace/notes",
        "workspace/notes/today.md",
        "workspace/link",
        "workspace/dir-link",
    ] {
        chown(&root.join(path), OLD);
    }

    let output = perch(
        &[
            "chown",
            "--from",
            &OLD.to_string(),
            "--to",
            &format!("{NEW}:{OPERATORS}"),
            root.to_str().unwrap(),
        ],
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let shown = stdout(&output);
    assert!(shown.starts_with("gave 9 entries under "), "{shown}");
    for line in [
        "  skipped  workspace/link: a symbolic link, not followed",
        "  skipped  workspace/dir-link: a symbolic link, not followed",
        "  skipped  workspace/hard: a file with 2 hard links, which may name a file outside the agent",
        "  skipped  workspace/planted-by-root: owned by uid 0, not the old service user",
    ] {
        assert!(shown.contains(line), "{line:?} in {shown}");
    }
    for given in [
        ".",
        ".perch/lanes/tg/log.jsonl",
        "agent.lua",
        "workspace/notes/today.md",
    ] {
        assert_eq!(owner(&root.join(given)), (NEW, OPERATORS), "{given}");
    }
    assert_eq!(owner(&root.join("workspace/link")), (OLD, OLD));
    assert_eq!(owner(&neighbour), (OLD, OLD), "the hard link's other name");
    assert_eq!(owner(&secret), (0, 0), "the symlink's target");
    assert_eq!(owner(outside.path()), (0, 0), "the directory link's target");
    assert_eq!(owner(&root.join("workspace/planted-by-root")), (0, 0));

    // A second run finds nothing of the old user's but what it skipped.
    let again = perch(
        &[
            "chown",
            "--from",
            &OLD.to_string(),
            "--to",
            &NEW.to_string(),
            "-C",
            root.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        stdout(&again).starts_with("gave 0 entries"),
        "{}",
        stdout(&again)
    );
}

#[test]
fn chown_refuses_a_top_that_is_a_symbolic_link() {
    if !as_root() {
        return;
    }
    let outside = tempfile::tempdir().unwrap();
    chown(outside.path(), OLD);
    let parent = tempfile::tempdir().unwrap();
    let link = parent.path().join("agent");
    std::os::unix::fs::symlink(outside.path(), &link).unwrap();
    let output = perch(
        &[
            "chown",
            "--from",
            &OLD.to_string(),
            "--to",
            &NEW.to_string(),
            link.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("is not a directory (a symbolic link is not followed)"),
        "{}",
        stderr(&output)
    );
    assert_eq!(owner(outside.path()), (OLD, OLD));
}

/// `perch status DIR` as `uid` with the supplementary `groups`, through `setpriv`.
fn status_as(agent: &Path, uid: u32, groups: &[u32]) -> std::process::Output {
    let groups = if groups.is_empty() {
        "--clear-groups".to_owned()
    } else {
        format!(
            "--groups={}",
            groups
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            &groups,
            "--",
            env!("CARGO_BIN_EXE_perch"),
            "status",
            "--json",
            agent.to_str().unwrap(),
        ])
        .env_clear()
        .output()
        .unwrap()
}

/// Whether `perch status --json` saw the service answer.
fn running(status: &std::process::Output) -> bool {
    serde_json::from_slice::<serde_json::Value>(&status.stdout)
        .is_ok_and(|report| report["running"] == true)
}

#[test]
fn the_control_socket_answers_its_operators_group_and_refuses_other_users() {
    if !as_root() {
        return;
    }
    let agent = Scenario::telegram_dm().build();
    let root = agent.path();
    // The agent directory as deploy/install.sh --agent leaves it: set-group-id, in the
    // operators' group, searchable by that group alone; `.perch/` inherits the group.
    std::os::unix::fs::chown(root, None, Some(OPERATORS)).unwrap();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o2750)).unwrap();
    let service = agent.start();
    agent.wait_for_service();

    let state = std::fs::metadata(root.join(".perch")).unwrap();
    assert_eq!(state.gid(), OPERATORS);
    assert_eq!(
        state.mode() & 0o777,
        0o710,
        "the operators may search .perch/"
    );
    let socket = std::fs::metadata(root.join(".perch/control.sock")).unwrap();
    assert_eq!(socket.mode() & 0o777, 0o666);

    let operator = status_as(root, STRANGER, &[OPERATORS]);
    assert!(operator.status.success(), "{}", stderr(&operator));
    assert!(running(&operator), "{}", stdout(&operator));

    // Without the group, the file system keeps them out before perch is asked.
    let stranger = status_as(root, STRANGER, &[]);
    assert!(!running(&stranger), "{}", stdout(&stranger));

    // Were the directory and .perch/ opened to everyone, perch itself still refuses them, by
    // what the kernel says about the peer.
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o2755)).unwrap();
    std::fs::set_permissions(root.join(".perch"), std::fs::Permissions::from_mode(0o711)).unwrap();
    let refused = status_as(root, STRANGER, &[]);
    let said = format!("{}{}", stdout(&refused), stderr(&refused));
    assert!(
        said.contains(&format!(
            "refused: uid {STRANGER} is not root, the agent's user (uid 0) or in its operators' group (gid {OPERATORS})"
        )),
        "{said}"
    );
    let log = service.stop();
    assert!(
        log.contains("control socket: refused a connection: uid 47004"),
        "{log}"
    );
}

#[test]
fn without_an_operators_group_the_control_socket_is_its_users_alone() {
    if !as_root() {
        return;
    }
    let agent = Scenario::telegram_dm().build();
    std::fs::set_permissions(agent.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let service = agent.start();
    agent.wait_for_service();
    let socket = std::fs::metadata(agent.path().join(".perch/control.sock")).unwrap();
    assert_eq!(socket.mode() & 0o777, 0o600);
    std::fs::set_permissions(
        agent.path().join(".perch"),
        std::fs::Permissions::from_mode(0o711),
    )
    .unwrap();
    std::fs::set_permissions(
        agent.path().join(".perch/control.sock"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let refused = status_as(agent.path(), STRANGER, &[OPERATORS]);
    let said = format!("{}{}", stdout(&refused), stderr(&refused));
    assert!(
        said.contains(&format!(
            "refused: uid {STRANGER} is not root or the agent's user (uid 0)"
        )),
        "{said}"
    );
    service.stop();
}
