//! Another process holding a lock for a moment: `flock(1)` keeps a file's exclusive lock until
//! it is told to let go, as a child perch forked keeps a copy of a lock until it execs.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

pub struct Holder {
    child: Child,
}

impl Holder {
    /// Takes `path`'s exclusive lock in a `flock` process, returning once it holds it.
    pub fn hold(path: &Path) -> Holder {
        let mut child = Command::new("flock")
            .arg("--exclusive")
            .arg(path)
            .args(["sh", "-c", "echo held; read _"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut held = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut held)
            .unwrap();
        assert_eq!(held, "held\n");
        Holder { child }
    }

    /// Lets go of the lock and waits for the process to end.
    pub fn let_go(mut self) {
        self.child.stdin.take().unwrap().write_all(b"\n").unwrap();
        assert!(self.child.wait().unwrap().success());
    }
}
