//! Loading: TOML text (file or embedded default) + `NVMFD_*` environment overrides, through the
//! `config` crate, then validation.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use config::{ConfigError, Environment, File, FileFormat};

use crate::file::{Config, EMBEDDED_DEFAULT};
use crate::report::{Problem, ProblemKind, ValidationError};
use crate::source::{check_override, without_keys, Source, LIST_KEY};

/// How the embedded default is named in messages.
pub const EMBEDDED_ORIGIN: &str = "<embedded default>";

/// Where the daemon looks when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/nvmfd/nvmfd.toml";

/// Environment variables `NVMFD_<SECTION>__<KEY>` override file values, e.g.
/// `NVMFD_GLOBAL__LOG_LEVEL=debug` or `NVMFD_GLOBAL__CPUS=2,3`.
pub const ENV_PREFIX: &str = "NVMFD";

#[derive(Debug, thiserror::Error)]
pub enum ConfError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Every problem found, one a line: a syntax error alone, else every unknown key, wrong
    /// type and missing key, else every validation problem.
    #[error("{}", join_lines(.0))]
    Problems(Vec<Problem>),
    #[error("nvmetcli JSON: {0}")]
    Nvmetcli(#[from] serde_json::Error),
    #[error("cannot render TOML: {0}")]
    Render(#[from] toml::ser::Error),
}

impl ConfError {
    /// The problems of a configuration that could be read (empty for other errors).
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfError::Problems(problems) => problems,
            _ => &[],
        }
    }
}

fn join_lines(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A loaded configuration with what deserves a word about it (placed like errors).
#[derive(Debug, Clone)]
pub struct Checked {
    pub config: Config,
    pub warnings: Vec<Problem>,
}

/// The variables that are configuration overrides: `NVMFD_<SECTION>__<KEY>`. Other `NVMFD_*`
/// variables (`NVMFD_BIN`, `NVMFD_SKIP_E2E` of the test scripts) are not ours to interpret and
/// must not fail the load as unknown keys.
fn overrides(vars: impl IntoIterator<Item = (String, String)>) -> config::Map<String, String> {
    let prefix = format!("{ENV_PREFIX}_");
    vars.into_iter()
        .filter(|(name, _)| {
            name.strip_prefix(&prefix)
                .is_some_and(|rest| rest.contains("__") && !rest.starts_with('_'))
        })
        .collect()
}

/// Which environment the overrides come from.
#[derive(Debug, Clone)]
pub enum EnvSource {
    Process,
    /// Exactly these variables (tests; a process environment is shared by all threads).
    Vars(HashMap<String, String>),
    None,
}

/// The file `nvmfd` reads when no `--config` is given: the default path if it exists,
/// otherwise `None` (the embedded default).
pub fn resolve_path(cli: Option<&Path>) -> Option<PathBuf> {
    match cli {
        Some(path) => Some(path.to_owned()),
        None => {
            let default = Path::new(DEFAULT_PATH);
            default.exists().then(|| default.to_owned())
        }
    }
}

/// The text as parsed, and the key path each override variable set.
struct Parsed {
    config: Config,
    source: Source,
    overrides: Vec<(String, String)>,
}

impl Parsed {
    /// A validation problem placed where its value came from: the variable that set the key
    /// (or a part of it), else its position in the file.
    fn place(&self, kind: ProblemKind, error: ValidationError) -> Problem {
        let set_by = self.overrides.iter().find(|(_, path)| {
            error.key == *path
                || error.key.starts_with(&format!("{path}."))
                || error.key.starts_with(&format!("{path}["))
        });
        let problem = Problem::from_validation(kind, error);
        match set_by {
            Some((var, _)) => Problem {
                env: Some(var.clone()),
                ..problem
            },
            None => self.source.place(problem),
        }
    }
}

impl Config {
    /// Configuration contract: file at `path` (None = the embedded default) with `NVMFD_*`
    /// overrides from the process environment, validated.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfError> {
        Self::load_with_env(path, EnvSource::Process)
    }

    pub fn load_with_env(path: Option<&Path>, env: EnvSource) -> Result<Config, ConfError> {
        Self::check(path, env).map(|checked| checked.config)
    }

    /// As `load_with_env`, with the warnings, every problem placed at its `file:line:column`
    /// or named by its variable.
    pub fn check(path: Option<&Path>, env: EnvSource) -> Result<Checked, ConfError> {
        let (origin, text) = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                (path.display().to_string(), text)
            }
            None => (EMBEDDED_ORIGIN.to_owned(), EMBEDDED_DEFAULT.to_owned()),
        };
        let positions = path.is_some();
        let parsed = match Self::parse_source(&origin, &text, positions, env.clone()) {
            Ok(parsed) => parsed,
            Err(ConfError::Problems(problems)) => {
                return Err(ConfError::Problems(Self::and_the_rest(
                    &origin, &text, positions, env, problems,
                )))
            }
            Err(other) => return Err(other),
        };
        if let Err(errors) = parsed.config.validate() {
            return Err(ConfError::Problems(
                errors
                    .into_iter()
                    .map(|e| parsed.place(ProblemKind::Invalid, e))
                    .collect(),
            ));
        }
        let warnings = parsed
            .config
            .warnings()
            .into_iter()
            .map(|w| parsed.place(ProblemKind::Warning, w))
            .collect();
        Ok(Checked {
            config: parsed.config,
            warnings,
        })
    }

    /// `problems` (unknown keys and wrong types in the file) and the validation problems of
    /// the rest: the file is validated as if those keys were deleted, and what validation
    /// then says about them, below them or about the entry holding them is left out, the
    /// key's own problem being the one to fix. With any other kind of problem (syntax, a missing key, a variable) the rest
    /// cannot be trusted and `problems` is all there is. In file order.
    fn and_the_rest(
        origin: &str,
        text: &str,
        positions: bool,
        env: EnvSource,
        mut problems: Vec<Problem>,
    ) -> Vec<Problem> {
        let deletable = problems.iter().all(|p| {
            p.env.is_none() && matches!(p.kind, ProblemKind::UnknownKey | ProblemKind::WrongType)
        });
        let keys: Vec<String> = problems.iter().map(|p| p.key.clone()).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let rest = deletable
            .then(|| without_keys(text, &keys))
            .flatten()
            .and_then(|pruned| Self::parse_source(origin, &pruned, positions, env).ok())
            .and_then(|parsed| Some((parsed.config.validate().err()?, parsed)));
        if let Some((errors, _)) = rest {
            let source = Source::parse(origin, text, positions).ok();
            let covered = |key: &str| {
                keys.iter().any(|k| {
                    let list = k.strip_suffix(']').and_then(|k| k.rsplit_once('['));
                    let k = list.map_or(*k, |(list, _)| list);
                    // The key, what is below it, and the entry or section that holds it
                    // (which changed when the key was deleted: "needs one of …").
                    key == k
                        || key.starts_with(&format!("{k}."))
                        || key.starts_with(&format!("{k}["))
                        || k.starts_with(&format!("{key}."))
                })
            };
            for error in errors.into_iter().filter(|e| !covered(&e.key)) {
                let problem = Problem::from_validation(ProblemKind::Invalid, error);
                problems.push(match &source {
                    Some(source) => source.place(problem),
                    None => problem,
                });
            }
        }
        problems.sort_by_key(|p| (p.line.is_none(), p.line, p.column));
        problems
    }

    /// Parses TOML text (no environment, no validation).
    pub fn parse_toml(text: &str) -> Result<Config, ConfError> {
        Self::parse("<string>", text, EnvSource::None)
    }

    /// Parses and merges (no validation); `origin` names the text in error messages.
    pub fn parse(origin: &str, text: &str, env: EnvSource) -> Result<Config, ConfError> {
        Self::parse_source(origin, text, true, env).map(|parsed| parsed.config)
    }

    fn parse_source(
        origin: &str,
        text: &str,
        positions: bool,
        env: EnvSource,
    ) -> Result<Parsed, ConfError> {
        let source = Source::parse(origin, text, positions)
            .map_err(|problem| ConfError::Problems(vec![*problem]))?;
        let mut problems = source.check();
        let vars = match env {
            EnvSource::Process => overrides(std::env::vars()),
            EnvSource::Vars(vars) => overrides(vars),
            EnvSource::None => config::Map::new(),
        };
        let mut sorted: Vec<(&String, &String)> = vars.iter().collect();
        sorted.sort();
        let prefix = format!("{ENV_PREFIX}_");
        let mut set = Vec::new();
        for (var, value) in sorted {
            match check_override(var, value, &prefix) {
                Ok(path) => set.push((var.clone(), path)),
                Err(problem) => problems.push(*problem),
            }
        }
        if !problems.is_empty() {
            return Err(ConfError::Problems(problems));
        }
        let mut builder =
            config::Config::builder().add_source(File::from_str(text, FileFormat::Toml));
        if !vars.is_empty() {
            builder = builder.add_source(
                Environment::with_prefix(ENV_PREFIX)
                    .prefix_separator("_")
                    .separator("__")
                    .try_parsing(true)
                    .list_separator(",")
                    .with_list_parse_key(LIST_KEY)
                    .source(Some(vars)),
            );
        }
        // The schema checks above let through only what deserializes; should the two ever
        // disagree, the message still names the key.
        let unexpected = |key: String, message: String| {
            let mut problem = Problem::new(ProblemKind::WrongType, &key, "", message);
            problem.file = Some(origin.to_owned());
            ConfError::Problems(vec![problem])
        };
        let merged = builder
            .build()
            .map_err(|e| unexpected(String::new(), e.to_string()))?;
        let config = serde_path_to_error::deserialize::<_, Config>(merged).map_err(|e| {
            let key = e.path().to_string();
            let message = match e.into_inner() {
                // The config crate appends "for key `…`" itself; the path is already in front.
                ConfigError::Type {
                    unexpected,
                    expected,
                    ..
                } => format!("invalid type: {unexpected}, expected {expected}"),
                other => other.to_string(),
            };
            unexpected(key, message)
        })?;
        Ok(Parsed {
            config,
            source,
            overrides: set,
        })
    }

    /// The configuration as TOML in the contract-3 schema.
    pub fn to_toml(&self) -> Result<String, ConfError> {
        Ok(toml::to_string(self)?)
    }
}

/// The `file:line:column` of `key` (e.g. `ports[1].service`) in the file at `path`, for
/// errors found after loading (a port that cannot be bound).
pub fn position_of(path: &Path, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let origin = path.display().to_string();
    let source = Source::parse(&origin, &text, true).ok()?;
    let placed = source.place(Problem::new(ProblemKind::Invalid, key, "", String::new()));
    Some(format!("{origin}:{}:{}", placed.line?, placed.column?))
}
