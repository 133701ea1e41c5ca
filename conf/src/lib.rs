//! nvmfd configuration: schema, loading (TOML + environment), validation, nvmetcli import.
