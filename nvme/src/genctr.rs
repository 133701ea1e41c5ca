//! Where the Discovery log page's generation counter starts, so that it never goes back across
//! restarts (NVMe Base 2.0 Figure 262, GENCTR: a host that sees the same value assumes the page
//! did not change and keeps what it read before).
//!
//! With a state directory the last value is kept in [`GENCTR_FILE`] (decimal text, replaced
//! atomically on every change) and a start continues one above it: the configuration may have
//! changed while the daemon was down. Without one the counter starts at the wall clock in
//! microseconds: the counter advances by one per reload, and no two reloads happen within a
//! microsecond, so a later start begins above anything the previous run reported (unless the
//! clock is set back).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The counter's file in the state directory (next to the reservation states).
pub const GENCTR_FILE: &str = "discovery.genctr";

#[derive(Debug, thiserror::Error)]
pub enum GenctrError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a generation counter: {text:?}", path.display())]
    Corrupt { path: PathBuf, text: String },
}

pub fn file(state_dir: &Path) -> PathBuf {
    state_dir.join(GENCTR_FILE)
}

/// The counter of a target starting now; with a state directory, that value is stored before
/// it is returned (a failure to store it stops the start: the directory is unusable).
pub(crate) fn initial(state_dir: Option<&Path>, now: SystemTime) -> Result<u64, GenctrError> {
    let Some(dir) = state_dir else {
        let micros = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros());
        return Ok(u64::try_from(micros).unwrap_or(u64::MAX).max(1));
    };
    let path = file(dir);
    let stored = match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .map_err(|_| GenctrError::Corrupt {
                path: path.clone(),
                text: text.chars().take(40).collect(),
            })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(source) => return Err(GenctrError::Io { path, source }),
    };
    let start = stored.saturating_add(1);
    store(dir, start)?;
    Ok(start)
}

/// Records `genctr` as the last value reported.
pub(crate) fn store(state_dir: &Path, genctr: u64) -> Result<(), GenctrError> {
    let path = file(state_dir);
    crate::reservation::save(&path, format!("{genctr}\n").as_bytes())
        .map_err(|source| GenctrError::Io { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn without_a_state_dir_the_clock_seeds_it() {
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let a = initial(None, t).unwrap();
        assert_eq!(a, 1_700_000_000_000_000);
        // A start one millisecond later begins above a run that reloaded 999 times.
        let b = initial(None, t + Duration::from_millis(1)).unwrap();
        assert!(b > a + 999);
        assert_eq!(initial(None, UNIX_EPOCH).unwrap(), 1);
    }

    #[test]
    fn a_state_dir_continues_above_the_stored_value() {
        let dir = std::env::temp_dir().join(format!("nvmfd-genctr-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let now = SystemTime::now();
        assert_eq!(initial(Some(&dir), now).unwrap(), 1, "first start");
        assert_eq!(
            initial(Some(&dir), now).unwrap(),
            2,
            "restart without changes"
        );
        store(&dir, 41).unwrap();
        assert_eq!(std::fs::read_to_string(file(&dir)).unwrap(), "41\n");
        assert_eq!(initial(Some(&dir), now).unwrap(), 42);
        std::fs::write(file(&dir), "garbage").unwrap();
        assert!(matches!(
            initial(Some(&dir), now),
            Err(GenctrError::Corrupt { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
