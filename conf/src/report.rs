//! One validation problem, and the list every section's check appends to.

use std::fmt;

/// One problem: `key: value: reason` (the value is omitted when it says nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    /// Key path in the file, e.g. `subsystems[0].namespaces[1].path`.
    pub key: String,
    pub value: String,
    pub reason: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}: {}", self.key, self.reason)
        } else {
            write!(f, "{}: {}: {}", self.key, self.value, self.reason)
        }
    }
}

/// The problems found so far, in file order (every check keeps going after a problem so that
/// one `nvmfd check-config` run shows everything to fix).
#[derive(Default)]
pub(crate) struct Errors(Vec<ValidationError>);

impl Errors {
    pub(crate) fn push(
        &mut self,
        key: impl Into<String>,
        value: impl fmt::Display,
        reason: impl Into<String>,
    ) {
        self.0.push(ValidationError {
            key: key.into(),
            value: value.to_string(),
            reason: reason.into(),
        });
    }

    pub(crate) fn into_result(self) -> Result<(), Vec<ValidationError>> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self.0)
        }
    }
}

/// What kind of problem a configuration has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProblemKind {
    /// The text is not TOML.
    Syntax,
    /// A key or section the schema does not have.
    UnknownKey,
    /// A value of the wrong type, out of its type's range, or not one of its names.
    WrongType,
    /// A required key of an entry is absent.
    MissingKey,
    /// A value that has the right type but is refused (ranges, references, files).
    Invalid,
    /// Accepted, but probably not what was meant.
    Warning,
}

/// One problem of a configuration, with where it comes from: `file:line:column` when the file
/// holds the key, or the `NVMFD_*` variable that set it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    pub kind: ProblemKind,
    /// The file (or `<embedded default>`) the key belongs to; absent for a variable's value.
    pub file: Option<String>,
    /// 1-based line and column of the key, value or entry concerned.
    pub line: Option<usize>,
    pub column: Option<usize>,
    /// The environment variable that set the value.
    pub env: Option<String>,
    /// Key path, e.g. `subsystems[2].namespaces[0].nsid` (empty for a syntax error).
    pub key: String,
    pub value: String,
    pub message: String,
}

impl Problem {
    pub(crate) fn new(kind: ProblemKind, key: &str, value: &str, message: String) -> Problem {
        Problem {
            kind,
            file: None,
            line: None,
            column: None,
            env: None,
            key: key.to_owned(),
            value: value.to_owned(),
            message,
        }
    }

    pub(crate) fn from_validation(kind: ProblemKind, error: ValidationError) -> Problem {
        Problem::new(kind, &error.key, &error.value, error.reason)
    }
}

impl fmt::Display for Problem {
    /// `file:line:column: key: value: message`, or `NVMFD_X__Y: key: value: message`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.env, &self.file, self.line, self.column) {
            (Some(var), ..) => write!(f, "{var}: ")?,
            (None, Some(file), Some(line), Some(column)) => write!(f, "{file}:{line}:{column}: ")?,
            (None, Some(file), ..) => write!(f, "{file}: ")?,
            (None, None, ..) => {}
        }
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        if !self.value.is_empty() {
            write!(f, "{}: ", self.value)?;
        }
        f.write_str(&self.message)
    }
}
