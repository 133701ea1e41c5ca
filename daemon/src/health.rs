//! SMART / Health across restarts: the target's health store (`nvme::health`) saved in
//! `[global] state_dir/health.json` and restored at start.
//!
//! At start the previous run's file is read and the store seeded with one more power cycle
//! and, when that run did not end with a clean shutdown, one more unsafe shutdown (NVMe Base
//! 2.0 Figure 207); the file is then rewritten at once saying "not shut down cleanly", so a
//! crash (`kill -9`, power loss) from here on is counted at the next start. A thread of its
//! own (never a reactor: every save fsyncs) saves the counters every [`SAVE_CHECK`] when they
//! changed, and at least every [`SAVE_IDLE`] for the power-on time; the clean shutdown saves
//! them a last time with `clean_shutdown = true`. A crash loses at most the counts of the last
//! [`SAVE_CHECK`]. A file that cannot be read or parsed is kept aside (`health.json.bad`) and the
//! counters start at zero with a warning: the health log is statistics, never a reason not
//! to serve.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::health::HealthState;
use nvme::namespace::NamespaceStatsSnapshot;
use nvme::target::Target;
use serde::{Deserialize, Serialize};

/// The file in `state_dir`.
pub const FILE: &str = "health.json";
/// How often the saver looks for changed counters.
pub const SAVE_CHECK: Duration = Duration::from_secs(10);
/// Saved at least this often while nothing else changes (power-on time).
pub const SAVE_IDLE: Duration = Duration::from_secs(15 * 60);
const VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct HealthFile {
    version: u32,
    /// Written `true` only by a clean shutdown, `false` by every other save.
    clean_shutdown: bool,
    power_on_secs: u64,
    power_cycles: u64,
    unsafe_shutdowns: u64,
    namespaces: Vec<NamespaceEntry>,
    subsystems: Vec<SubsystemEntry>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct NamespaceEntry {
    subsystem: String,
    nsid: u32,
    read_commands: u64,
    write_commands: u64,
    bytes_read: u64,
    bytes_written: u64,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct SubsystemEntry {
    nqn: String,
    media_errors: u64,
}

fn encode(state: &HealthState, clean_shutdown: bool) -> Vec<u8> {
    let file = HealthFile {
        version: VERSION,
        clean_shutdown,
        power_on_secs: state.power_on_secs,
        power_cycles: state.power_cycles,
        unsafe_shutdowns: state.unsafe_shutdowns,
        namespaces: state
            .namespaces
            .iter()
            .map(|((subsystem, nsid), s)| NamespaceEntry {
                subsystem: subsystem.clone(),
                nsid: *nsid,
                read_commands: s.read_commands,
                write_commands: s.write_commands,
                bytes_read: s.bytes_read,
                bytes_written: s.bytes_written,
            })
            .collect(),
        subsystems: state
            .media_errors
            .iter()
            .map(|(nqn, &media_errors)| SubsystemEntry {
                nqn: nqn.clone(),
                media_errors,
            })
            .collect(),
    };
    let mut bytes = serde_json::to_vec_pretty(&file).expect("plain data serializes");
    bytes.push(b'\n');
    bytes
}

/// The saved state and whether its run shut down cleanly.
fn decode(bytes: &[u8]) -> Result<(HealthState, bool), String> {
    let file: HealthFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if file.version != VERSION {
        return Err(format!("unknown version {}", file.version));
    }
    let mut namespaces = BTreeMap::new();
    for n in file.namespaces {
        let counts = NamespaceStatsSnapshot {
            read_commands: n.read_commands,
            write_commands: n.write_commands,
            bytes_read: n.bytes_read,
            bytes_written: n.bytes_written,
        };
        if namespaces.insert((n.subsystem, n.nsid), counts).is_some() {
            return Err(format!("namespace {} listed twice", n.nsid));
        }
    }
    let media_errors = file
        .subsystems
        .into_iter()
        .map(|s| (s.nqn, s.media_errors))
        .collect();
    let state = HealthState {
        power_on_secs: file.power_on_secs,
        power_cycles: file.power_cycles,
        unsafe_shutdowns: file.unsafe_shutdowns,
        namespaces,
        media_errors,
    };
    Ok((state, file.clean_shutdown))
}

/// Reads the previous run's state from `dir`: `None` when there is none, or when it cannot be
/// used (then it is moved aside and a warning says why).
fn load(dir: &Path) -> Option<(HealthState, bool)> {
    let path = dir.join(FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e,
                "cannot read the saved SMART/Health counters; starting them at zero");
            return None;
        }
    };
    match decode(&bytes) {
        Ok(saved) => Some(saved),
        Err(reason) => {
            let aside = dir.join(format!("{FILE}.bad"));
            let kept = std::fs::rename(&path, &aside)
                .map(|()| aside.display().to_string())
                .unwrap_or_else(|e| format!("not kept: {e}"));
            tracing::warn!(file = %path.display(), %reason, kept,
                "saved SMART/Health counters are damaged; starting them at zero");
            None
        }
    }
}

/// Replaces `dir/health.json` atomically and durably: a temporary file, fsync, rename, fsync
/// of the directory (a crash leaves the old or the new file, never a mix).
fn save(dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(FILE);
    let temp = dir.join(format!("{FILE}.tmp"));
    let written = std::fs::File::create(&temp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&temp, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written?;
    std::fs::File::open(dir)?.sync_all()
}

/// The counters without the power-on time, which changes every second.
fn counts(s: &HealthState) -> HealthState {
    HealthState {
        power_on_secs: 0,
        ..s.clone()
    }
}

/// Restores the store and keeps saving it until [`Keeper::shut_down`].
#[derive(Debug)]
pub struct Keeper {
    dir: PathBuf,
    target: Arc<Target>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Keeper {
    /// Seeds `target`'s health store from `dir` (before any queue exists) and starts saving.
    pub fn start(target: &Arc<Target>, dir: PathBuf) -> std::io::Result<Keeper> {
        let previous = load(&dir);
        let (cycles, unsafe_before) = previous
            .as_ref()
            .map_or((0, 0), |(s, _)| (s.power_cycles, s.unsafe_shutdowns));
        let state = HealthState::next_start(previous);
        target.health().restore(&state);
        if state.unsafe_shutdowns > unsafe_before {
            tracing::warn!(
                unsafe_shutdowns = state.unsafe_shutdowns,
                "the previous run did not shut down cleanly (SMART unsafe shutdowns)"
            );
        }
        tracing::info!(file = %dir.join(FILE).display(), power_cycles = cycles + 1,
            "SMART/Health counters restored");
        if let Err(e) = save(&dir, &encode(&target.health().state(), false)) {
            tracing::warn!(file = %dir.join(FILE).display(), error = %e,
                "cannot save SMART/Health counters");
        }
        let (stop, stopped) = mpsc::channel::<()>();
        let saver_target = Arc::clone(target);
        let saver_dir = dir.clone();
        let thread = std::thread::Builder::new()
            .name("health".into())
            .spawn(move || saver(&saver_target, &saver_dir, &stopped))?;
        Ok(Keeper {
            dir,
            target: Arc::clone(target),
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The clean shutdown's last save (after the reactors drained: the final counts).
    pub fn shut_down(mut self) {
        self.stop_saver();
        match save(&self.dir, &encode(&self.target.health().state(), true)) {
            Ok(()) => tracing::info!("SMART/Health counters saved"),
            Err(e) => tracing::error!(file = %self.dir.join(FILE).display(), error = %e,
                "cannot save SMART/Health counters at shutdown"),
        }
    }

    fn stop_saver(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Keeper {
    /// Not a clean shutdown (an error stopped the daemon): the file keeps saying so.
    fn drop(&mut self) {
        self.stop_saver();
    }
}

fn saver(target: &Target, dir: &Path, stopped: &mpsc::Receiver<()>) {
    let mut last = counts(&target.health().state());
    let mut saved_at = Instant::now();
    let mut failing = false;
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(SAVE_CHECK) {
        let state = target.health().state();
        let now = counts(&state);
        if now == last && saved_at.elapsed() < SAVE_IDLE {
            continue;
        }
        match save(dir, &encode(&state, false)) {
            Ok(()) => {
                (last, saved_at) = (now, Instant::now());
                if std::mem::take(&mut failing) {
                    tracing::info!("SMART/Health counters saved again");
                }
            }
            // Once per failure streak, not every 10 s.
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(file = %dir.join(FILE).display(), error = %e,
                    "cannot save SMART/Health counters");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nvmfd-health-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn sample() -> HealthState {
        let mut s = HealthState {
            power_on_secs: 3 * 3600 + 5,
            power_cycles: 4,
            unsafe_shutdowns: 1,
            ..HealthState::default()
        };
        s.namespaces.insert(
            ("nqn.a".into(), 1),
            NamespaceStatsSnapshot {
                read_commands: 10,
                write_commands: 20,
                bytes_read: 40960,
                bytes_written: 81920,
            },
        );
        s.media_errors.insert("nqn.a".into(), 2);
        s
    }

    #[test]
    fn state_round_trips_through_the_file() {
        let dir = temp_dir("round");
        save(&dir, &encode(&sample(), true)).unwrap();
        assert_eq!(load(&dir), Some((sample(), true)));
        save(&dir, &encode(&sample(), false)).unwrap();
        assert_eq!(load(&dir), Some((sample(), false)));
        assert!(!dir.join(format!("{FILE}.tmp")).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_start_after_a_crash_counts_an_unsafe_shutdown() {
        let dir = temp_dir("crash");
        save(&dir, &encode(&sample(), false)).unwrap();
        let next = HealthState::next_start(load(&dir));
        assert_eq!((next.power_cycles, next.unsafe_shutdowns), (5, 2));
        save(&dir, &encode(&sample(), true)).unwrap();
        let next = HealthState::next_start(load(&dir));
        assert_eq!((next.power_cycles, next.unsafe_shutdowns), (5, 1));
        assert_eq!(next.namespaces, sample().namespaces);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn damaged_files_start_at_zero_and_are_kept_aside() {
        let good = encode(&sample(), true);
        let cases: [&[u8]; 5] = [
            b"",
            &good[..good.len() / 2],
            b"\x00\xff garbage",
            br#"{"version": 2, "clean_shutdown": true}"#,
            br#"{"version":1,"clean_shutdown":true,"power_on_secs":1,"power_cycles":1,
               "unsafe_shutdowns":0,"subsystems":[],"namespaces":[
               {"subsystem":"a","nsid":1,"read_commands":1,"write_commands":1,"bytes_read":1,"bytes_written":1},
               {"subsystem":"a","nsid":1,"read_commands":1,"write_commands":1,"bytes_read":1,"bytes_written":1}]}"#,
        ];
        for (i, bytes) in cases.into_iter().enumerate() {
            let dir = temp_dir(&format!("bad{i}"));
            std::fs::write(dir.join(FILE), bytes).unwrap();
            assert_eq!(load(&dir), None, "case {i}");
            assert!(!dir.join(FILE).exists(), "case {i}");
            assert_eq!(
                std::fs::read(dir.join(format!("{FILE}.bad"))).unwrap(),
                bytes
            );
            let next = HealthState::next_start(None);
            assert_eq!((next.power_cycles, next.unsafe_shutdowns), (1, 0));
            let _ = std::fs::remove_dir_all(&dir);
        }
        // No file at all: a first start, no warning needed.
        let dir = temp_dir("none");
        assert_eq!(load(&dir), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn keeper_restores_saves_and_marks_the_clean_shutdown() {
        let dir = temp_dir("keeper");
        save(&dir, &encode(&sample(), true)).unwrap();
        let target =
            Target::with_opener(nvme::target::TargetConfig::default(), &storage::open).unwrap();
        let keeper = Keeper::start(&target, dir.clone()).unwrap();
        let c = target.health().controller();
        assert_eq!(
            (c.power_on_hours, c.power_cycles, c.unsafe_shutdowns),
            (3, 5, 1)
        );
        // Saved at once as not shut down cleanly: a crash now is counted next time.
        let (running, clean) = load(&dir).unwrap();
        assert!(!clean);
        assert_eq!(running.power_cycles, 5);
        assert_eq!(running.namespaces, sample().namespaces);
        target.health().namespace("nqn.a", 1).read_started();
        keeper.shut_down();
        let (after, clean) = load(&dir).unwrap();
        assert!(clean);
        assert_eq!(after.namespaces[&("nqn.a".into(), 1)].read_commands, 11);
        // Dropped without a clean shutdown (an error stopped the daemon): next start counts it.
        let target =
            Target::with_opener(nvme::target::TargetConfig::default(), &storage::open).unwrap();
        drop(Keeper::start(&target, dir.clone()).unwrap());
        let next = HealthState::next_start(load(&dir));
        assert_eq!((next.power_cycles, next.unsafe_shutdowns), (7, 2));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
