//! Guest paths seen from the host: resolution under the guest's root (symlinks included, so an
//! absolute link inside the image cannot escape to the host's files), program lookup along PATH,
//! and the filesystem requests the crate sends (`Stat` for the workdir before `create()`
//! returns).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{self, Read as _};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Component, Path, PathBuf};

use microsandbox_protocol::fs::{FsEntryInfo, FsOp, FsResponse, FsResponseData};

/// Symlinks followed while resolving one path, like the kernel's limit.
const MAX_SYMLINKS: usize = 40;

/// The host path of `guest_path` (absolute, or relative to the guest's `/`) under `root`, with
/// every symlink resolved inside `root`; the final component stays a link unless
/// `follow_final`.
pub(super) fn resolve_in_root(
    root: &Path,
    guest_path: &str,
    follow_final: bool,
) -> io::Result<PathBuf> {
    let mut resolved = PathBuf::from("/");
    let mut pending: VecDeque<OsString> = VecDeque::new();
    push_components(&mut pending, Path::new(guest_path), &mut resolved);
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            resolved.pop();
            continue;
        }
        let candidate = resolved.join(&name);
        let on_host = host_path(root, &candidate);
        let metadata = std::fs::symlink_metadata(&on_host)?;
        let is_final = pending.is_empty();
        if metadata.file_type().is_symlink() && (follow_final || !is_final) {
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(io::Error::from_raw_os_error(
                    nix::errno::Errno::ELOOP as i32,
                ));
            }
            let target = std::fs::read_link(&on_host)?;
            let mut expanded = VecDeque::new();
            push_components(&mut expanded, &target, &mut resolved);
            expanded.extend(pending.drain(..));
            pending = expanded;
        } else {
            resolved = candidate;
        }
    }
    Ok(host_path(root, &resolved))
}

/// Queues the components of `path`; an absolute `path` restarts `resolved` at `/`.
fn push_components(queue: &mut VecDeque<OsString>, path: &Path, resolved: &mut PathBuf) {
    for component in path.components() {
        match component {
            Component::RootDir | Component::Prefix(_) => {
                *resolved = PathBuf::from("/");
                queue.clear();
            }
            Component::CurDir => {}
            Component::ParentDir => queue.push_back("..".into()),
            Component::Normal(name) => queue.push_back(name.to_owned()),
        }
    }
}

fn host_path(root: &Path, guest_absolute: &Path) -> PathBuf {
    root.join(guest_absolute.strip_prefix("/").unwrap_or(guest_absolute))
}

/// Whether `guest_path` is a directory in the guest.
pub(super) fn is_directory(root: &Path, guest_path: &str) -> bool {
    resolve_in_root(root, guest_path, true)
        .and_then(std::fs::metadata)
        .is_ok_and(|metadata| metadata.is_dir())
}

/// Why a program cannot be started, in the classes agentd reports (`core.exec.failed` kinds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ProgramError {
    /// No such file on the path given or along PATH.
    NotFound,
    /// A directory, a special file, or no execute bit.
    PermissionDenied,
    /// An executable file the kernel cannot run (the reason says why).
    NotExecutable(String),
}

/// Finds `program` the way `execvp` does: a name containing `/` is taken as a path (relative
/// to `cwd`), any other name is looked up along `path_var`, where a candidate without execute
/// permission is skipped but reported when nothing else is found. Returns the program to spawn:
/// the guest path found along PATH, or `program` itself when it contains `/`.
///
/// The failure classes are guessed from the protocol's `ExecFailureKind` documentation and
/// perch's mapping of them (src/sandbox/microvm.rs: NotFound → 127, PermissionDenied and
/// NotExecutable → 126), not taken from agentd.
pub(super) fn resolve_program(
    root: &Path,
    program: &str,
    path_var: &str,
    cwd: &str,
) -> Result<String, ProgramError> {
    if program.is_empty() {
        return Err(ProgramError::NotFound);
    }
    if program.contains('/') {
        let guest_path = if program.starts_with('/') {
            program.to_owned()
        } else {
            format!("{}/{program}", cwd.trim_end_matches('/'))
        };
        return check_executable(root, &guest_path).map(|()| program.to_owned());
    }
    let mut denied = false;
    for directory in path_var
        .split(':')
        .filter(|directory| !directory.is_empty())
    {
        let guest_path = format!("{}/{program}", directory.trim_end_matches('/'));
        match check_executable(root, &guest_path) {
            Ok(()) => return Ok(guest_path),
            Err(ProgramError::NotFound) => {}
            Err(ProgramError::PermissionDenied) => denied = true,
            Err(not_executable) => return Err(not_executable),
        }
    }
    Err(if denied {
        ProgramError::PermissionDenied
    } else {
        ProgramError::NotFound
    })
}

/// An existing regular file with an execute bit, as its host path.
fn executable_file(root: &Path, guest_path: &str) -> Result<PathBuf, ProgramError> {
    let on_host = resolve_in_root(root, guest_path, true).map_err(|_| ProgramError::NotFound)?;
    let metadata = std::fs::metadata(&on_host).map_err(|_| ProgramError::NotFound)?;
    if !metadata.is_file() || metadata.permissions().mode() & 0o111 == 0 {
        return Err(ProgramError::PermissionDenied);
    }
    Ok(on_host)
}

/// An executable file the kernel can run: an ELF binary, or a script whose `#!` interpreter
/// is an executable file.
fn check_executable(root: &Path, guest_path: &str) -> Result<(), ProgramError> {
    let on_host = executable_file(root, guest_path)?;
    let mut head = [0_u8; 256];
    let read = std::fs::File::open(&on_host)
        .and_then(|mut file| file.read(&mut head))
        .unwrap_or(0);
    let head = &head[..read];
    if head.starts_with(b"\x7fELF") || read == 0 {
        return Ok(());
    }
    let Some(line) = head.strip_prefix(b"#!") else {
        return Err(ProgramError::NotExecutable("Exec format error".into()));
    };
    let line = line.split(|byte| *byte == b'\n').next().unwrap_or_default();
    let interpreter = String::from_utf8_lossy(line);
    let interpreter = interpreter.split_whitespace().next().unwrap_or_default();
    if interpreter.starts_with('/') && executable_file(root, interpreter).is_ok() {
        return Ok(());
    }
    Err(ProgramError::NotExecutable(format!(
        "bad interpreter {interpreter}: No such file or directory"
    )))
}

/// Answers one filesystem request. Only what the crate sends on its own is served (`Stat`,
/// plus `RealPath`); anything else is refused.
pub(super) fn respond(root: &Path, op: FsOp) -> FsResponse {
    match op {
        FsOp::Stat {
            path,
            follow_symlink,
        } => match stat(root, &path, follow_symlink) {
            Ok(info) => FsResponse {
                ok: true,
                error: None,
                data: Some(FsResponseData::Stat(info)),
            },
            Err(error) => failure(&format!("{path}: {error}")),
        },
        FsOp::RealPath { path } => match resolve_in_root(root, &path, true) {
            Ok(on_host) => {
                let guest = on_host
                    .strip_prefix(root)
                    .map_or_else(|_| PathBuf::from("/"), |inner| Path::new("/").join(inner));
                FsResponse {
                    ok: true,
                    error: None,
                    data: Some(FsResponseData::Path(guest.to_string_lossy().into_owned())),
                }
            }
            Err(error) => failure(&format!("{path}: {error}")),
        },
        _ => failure("the stand-in runtime serves only stat and realpath"),
    }
}

/// A failed filesystem response carrying `message`.
pub(super) fn failure(message: &str) -> FsResponse {
    FsResponse {
        ok: false,
        error: Some(message.into()),
        data: None,
    }
}

fn stat(root: &Path, path: &str, follow_symlink: bool) -> io::Result<FsEntryInfo> {
    let on_host = resolve_in_root(root, path, follow_symlink)?;
    let metadata = std::fs::symlink_metadata(on_host)?;
    let file_type = metadata.file_type();
    let kind = if file_type.is_symlink() {
        "symlink"
    } else if file_type.is_dir() {
        "dir"
    } else if file_type.is_file() {
        "file"
    } else {
        "other"
    };
    Ok(FsEntryInfo {
        path: path.to_owned(),
        kind: kind.into(),
        size: metadata.size(),
        mode: metadata.mode() & 0o7777,
        modified: Some(metadata.mtime()),
        uid: metadata.uid(),
        gid: metadata.gid(),
        atime: Some(metadata.atime()),
        mtime: Some(metadata.mtime()),
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn executable(path: &Path, content: &[u8]) {
        std::fs::write(path, content).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn absolute_symlinks_resolve_inside_the_root() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("bin")).unwrap();
        std::fs::create_dir_all(root.path().join("etc")).unwrap();
        std::fs::write(root.path().join("etc/hostname"), "guest").unwrap();
        symlink("/etc/hostname", root.path().join("bin/link")).unwrap();
        symlink("../etc", root.path().join("bin/up")).unwrap();

        let resolved = resolve_in_root(root.path(), "/bin/link", true).unwrap();
        assert_eq!(resolved, root.path().join("etc/hostname"));
        let through = resolve_in_root(root.path(), "/bin/up/hostname", true).unwrap();
        assert_eq!(through, root.path().join("etc/hostname"));
        let escaping = resolve_in_root(root.path(), "/../../etc/hostname", true).unwrap();
        assert_eq!(escaping, root.path().join("etc/hostname"));
        let unfollowed = resolve_in_root(root.path(), "/bin/link", false).unwrap();
        assert_eq!(unfollowed, root.path().join("bin/link"));
    }

    #[test]
    fn symlink_loops_end_with_eloop() {
        let root = tempfile::tempdir().unwrap();
        symlink("/b", root.path().join("a")).unwrap();
        symlink("/a", root.path().join("b")).unwrap();
        let error = resolve_in_root(root.path(), "/a", true).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(nix::errno::Errno::ELOOP as i32));
    }

    #[test]
    fn programs_resolve_along_path_and_fail_in_agentds_classes() {
        let root = tempfile::tempdir().unwrap();
        let bin = root.path().join("bin");
        let usr_bin = root.path().join("usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&usr_bin).unwrap();
        executable(&usr_bin.join("tool"), b"\x7fELF....");
        std::fs::write(bin.join("tool"), b"\x7fELF").unwrap();
        executable(&bin.join("script"), b"#!/bin/missing\necho\n");
        executable(&bin.join("text"), b"plain words\n");
        symlink("/usr/bin/tool", bin.join("alias")).unwrap();

        let path = "/bin:/usr/bin";
        assert_eq!(
            resolve_program(root.path(), "tool", path, "/"),
            Ok("/usr/bin/tool".into())
        );
        assert_eq!(
            resolve_program(root.path(), "alias", path, "/"),
            Ok("/bin/alias".into())
        );
        assert_eq!(
            resolve_program(root.path(), "absent", path, "/"),
            Err(ProgramError::NotFound)
        );
        assert_eq!(
            resolve_program(root.path(), "tool", "/bin", "/"),
            Err(ProgramError::PermissionDenied),
            "a file without an execute bit is permission denied"
        );
        assert_eq!(
            resolve_program(root.path(), "/bin", path, "/"),
            Err(ProgramError::PermissionDenied)
        );
        assert!(matches!(
            resolve_program(root.path(), "script", path, "/"),
            Err(ProgramError::NotExecutable(reason)) if reason.contains("/bin/missing")
        ));
        assert!(matches!(
            resolve_program(root.path(), "text", path, "/"),
            Err(ProgramError::NotExecutable(_))
        ));
        assert_eq!(
            resolve_program(root.path(), "./tool", path, "/usr/bin"),
            Ok("./tool".into())
        );
        assert_eq!(
            resolve_program(root.path(), "./tool", path, "/"),
            Err(ProgramError::NotFound)
        );
    }

    #[test]
    fn stat_reports_kind_and_mode_under_the_root() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("workspace")).unwrap();
        std::fs::set_permissions(
            root.path().join("workspace"),
            std::fs::Permissions::from_mode(0o750),
        )
        .unwrap();
        symlink("/workspace", root.path().join("ws")).unwrap();

        let response = respond(
            root.path(),
            FsOp::Stat {
                path: "/ws".into(),
                follow_symlink: true,
            },
        );
        let Some(FsResponseData::Stat(info)) = response.data else {
            panic!("expected stat data, got {response:?}");
        };
        assert_eq!(
            (info.kind.as_str(), info.mode, info.path.as_str()),
            ("dir", 0o750, "/ws")
        );

        let link = respond(
            root.path(),
            FsOp::Stat {
                path: "/ws".into(),
                follow_symlink: false,
            },
        );
        assert!(matches!(link.data, Some(FsResponseData::Stat(info)) if info.kind == "symlink"));

        let missing = respond(
            root.path(),
            FsOp::Stat {
                path: "/nope".into(),
                follow_symlink: true,
            },
        );
        assert!(!missing.ok && missing.error.is_some_and(|error| error.contains("/nope")));
    }
}
