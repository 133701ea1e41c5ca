//! Loading: TOML text (file or embedded default) + `NVMFD_*` environment overrides, through the
//! `config` crate, then validation.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use config::{ConfigError, Environment, File, FileFormat};

use crate::file::{Config, EMBEDDED_DEFAULT};
use crate::report::ValidationError;

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
    /// TOML syntax or an environment value that cannot be merged.
    #[error("{origin}: {source}")]
    Syntax {
        origin: String,
        #[source]
        source: ConfigError,
    },
    /// Wrong type, unknown key or malformed value, with the key path.
    #[error("{origin}: {key}: {message}")]
    Schema {
        origin: String,
        key: String,
        message: String,
    },
    #[error("{}", join_lines(.0))]
    Invalid(Vec<ValidationError>),
    #[error("nvmetcli JSON: {0}")]
    Nvmetcli(#[from] serde_json::Error),
    #[error("cannot render TOML: {0}")]
    Render(#[from] toml::ser::Error),
}

fn join_lines(errors: &[ValidationError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
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

impl Config {
    /// Configuration contract: file at `path` (None = the embedded default) with `NVMFD_*`
    /// overrides from the process environment, validated.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfError> {
        Self::load_with_env(path, EnvSource::Process)
    }

    pub fn load_with_env(path: Option<&Path>, env: EnvSource) -> Result<Config, ConfError> {
        let (origin, text) = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                (path.display().to_string(), text)
            }
            None => ("<embedded default>".to_owned(), EMBEDDED_DEFAULT.to_owned()),
        };
        let config = Self::parse(&origin, &text, env)?;
        config.validate().map_err(ConfError::Invalid)?;
        Ok(config)
    }

    /// Parses TOML text (no environment, no validation).
    pub fn parse_toml(text: &str) -> Result<Config, ConfError> {
        Self::parse("<string>", text, EnvSource::None)
    }

    /// Parses and merges; `origin` names the text in error messages.
    pub fn parse(origin: &str, text: &str, env: EnvSource) -> Result<Config, ConfError> {
        let syntax = |source| ConfError::Syntax {
            origin: origin.to_owned(),
            source,
        };
        let mut builder =
            config::Config::builder().add_source(File::from_str(text, FileFormat::Toml));
        let environment = || {
            Environment::with_prefix(ENV_PREFIX)
                .prefix_separator("_")
                .separator("__")
                .try_parsing(true)
                .list_separator(",")
                .with_list_parse_key("global.cpus")
        };
        builder = match env {
            EnvSource::Process => {
                builder.add_source(environment().source(Some(overrides(std::env::vars()))))
            }
            EnvSource::Vars(vars) => {
                builder.add_source(environment().source(Some(overrides(vars))))
            }
            EnvSource::None => builder,
        };
        let merged = builder.build().map_err(syntax)?;
        serde_path_to_error::deserialize::<_, Config>(merged).map_err(|e| {
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
            ConfError::Schema {
                origin: origin.to_owned(),
                key,
                message,
            }
        })
    }

    /// The configuration as TOML in the contract-3 schema.
    pub fn to_toml(&self) -> Result<String, ConfError> {
        Ok(toml::to_string(self)?)
    }
}
