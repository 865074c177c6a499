//! A problem found in an agent's files: where it is, what is wrong, and what to do.

use std::fmt;

/// A position in a source file. Lines and columns count from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord)]
pub struct Pos {
    pub line: u32,
    pub column: Option<u32>,
}

impl Pos {
    pub fn line(line: u32) -> Self {
        Pos { line, column: None }
    }

    pub fn at(line: u32, column: u32) -> Self {
        Pos {
            line,
            column: Some(column),
        }
    }
}

/// One problem in one file. `Display` renders it the way a compiler would:
/// `sandbox.lua:3: secrets[1]: missing hosts`, then the fix on its own line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file, relative to the agent directory.
    pub file: String,
    /// Where in the file; line 0 means the file as a whole.
    pub pos: Pos,
    /// The key path inside the declaration (`secrets[1].hosts`), empty for the whole file.
    pub path: String,
    pub message: String,
    /// What to do about it.
    pub fix: Option<String>,
}

impl Problem {
    pub fn new(file: impl Into<String>, pos: Pos, message: impl Into<String>) -> Self {
        Problem {
            file: file.into(),
            pos,
            path: String::new(),
            message: message.into(),
            fix: None,
        }
    }

    pub fn with_path(mut self, path: impl Into<String>) -> Self {
        self.path = path.into();
        self
    }

    pub fn with_fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if self.pos.line > 0 {
            write!(f, ":{}", self.pos.line)?;
            if let Some(column) = self.pos.column {
                write!(f, ":{column}")?;
            }
        }
        f.write_str(": ")?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n  fix: {fix}")?;
        }
        Ok(())
    }
}

/// Every problem found in one pass, in file and line order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    pub fn sorted(mut self) -> Self {
        self.0
            .sort_by(|a, b| (&a.file, a.pos, &a.path).cmp(&(&b.file, b.pos, &b.path)));
        self
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Problem> {
        self.0.iter()
    }
}

impl From<Vec<Problem>> for Problems {
    fn from(problems: Vec<Problem>) -> Self {
        Problems(problems)
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, problem) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}
