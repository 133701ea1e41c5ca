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
