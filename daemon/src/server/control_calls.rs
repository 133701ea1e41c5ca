//! Control socket requests, answered on the main thread.

use std::sync::atomic::Ordering;

use super::error::error_chain;
use super::signals::Signals;
use super::Server;
use crate::control::proto::{ApplyView, Request, Response, Saved, StatusView};
use crate::control::{ControlCall, ControlSocket};

/// The control socket while serving: its accept thread and the queue of calls to answer.
pub(super) struct ControlEndpoint {
    _socket: ControlSocket,
    pub(super) calls: std::sync::mpsc::Receiver<ControlCall>,
}

impl Server {
    /// The control socket (`global.control_socket`). Not fatal when unavailable: the target
    /// serves without it (logged), so that e.g. a second daemon for tests never steals the
    /// socket of a running one.
    pub(super) fn open_control(&self, signals: &Signals) -> Option<ControlEndpoint> {
        let path = &self.config.global.control_socket;
        let (tx, calls) = std::sync::mpsc::channel();
        let opened = signals
            .waker()
            .map_err(|e| e.to_string())
            .and_then(|wake| ControlSocket::open(path, tx, wake).map_err(|e| error_chain(&e)));
        match opened {
            Ok(socket) => Some(ControlEndpoint {
                _socket: socket,
                calls,
            }),
            Err(e) => {
                tracing::warn!("running without a control socket: {e}");
                None
            }
        }
    }

    /// One control socket request, on the main thread. An applied edit is written through to
    /// the configuration file unless `transient`.
    pub(super) fn control_call(&mut self, request: Request, transient: bool) -> Response {
        use crate::control::commands as cmd;
        if request.is_change() {
            tracing::info!(?request, "control request");
        } else {
            tracing::debug!(?request, "control request");
        }
        fn answer(r: Result<impl serde::Serialize, String>) -> Response {
            match r {
                Ok(view) => Response::success(view),
                Err(e) => Response::failure(e),
            }
        }
        match request {
            Request::Status => Response::success(self.status_view()),
            Request::Subsystems => Response::success(cmd::subsystems(&self.target)),
            Request::Subsystem { nqn } => answer(cmd::subsystem_detail(&self.target, &nqn)),
            Request::Namespaces { nqn } => answer(cmd::namespaces(&self.target, nqn.as_deref())),
            Request::Ports => Response::success(cmd::ports(&self.target)),
            Request::Controllers { nqn } => answer(cmd::controllers(&self.target, nqn.as_deref())),
            Request::Qos { nqn } => answer(cmd::qos(&self.target, nqn.as_deref())),
            Request::Top => answer(
                self.metrics
                    .as_ref()
                    .map(|m| cmd::top(&m.registry))
                    .ok_or_else(|| {
                        "metrics are off: add [metrics] enabled = true (or listen = \"…\") to the \
                         configuration and restart"
                            .to_owned()
                    }),
            ),
            Request::Gateways => answer(
                self.gateway
                    .as_ref()
                    .map(|g| g.view())
                    .ok_or_else(|| "no [gateway_group] in the configuration".to_owned()),
            ),
            Request::SetAnaState { group, .. }
                if self.gateway.as_ref().is_some_and(|g| g.manages(group)) =>
            {
                Response::failure(format!(
                    "ANA group {group} is managed by the gateway group (its lease decides its \
                     state); see nvmfd ctl gateways"
                ))
            }
            Request::Reload => answer(self.reload().map(|summary| ApplyView {
                summary,
                saved: None,
            })),
            Request::WriteConfig { path } => answer(
                path.map_or_else(|| cmd::default_write_path(self.config_path.as_deref()), Ok)
                    .and_then(|path| cmd::write_config(&self.config, &path, cmd::RUNNING_HEADER)),
            ),
            edit => {
                let outcome = cmd::edit(&self.config, &edit).and_then(|new| self.apply_config(new));
                match &outcome {
                    Ok(summary) => tracing::info!(%summary, "control change applied"),
                    Err(e) => tracing::warn!("control change refused: {e}"),
                }
                answer(outcome.map(|summary| {
                    let saved = if transient {
                        Saved::Transient
                    } else {
                        self.save_edit(&edit)
                    };
                    match &saved {
                        Saved::Written { path } => {
                            tracing::info!(path = %path.display(), "control change saved")
                        }
                        Saved::Transient => {}
                        Saved::Failed { reason } => tracing::warn!(
                            "control change applied but not saved (the next reload or \
                             restart undoes it): {reason}"
                        ),
                    }
                    ApplyView {
                        summary,
                        saved: Some(saved),
                    }
                }))
            }
        }
    }

    /// Writes an applied edit through to the configuration file: the same edit applied to the
    /// file as it is now (without the `NVMFD_*` environment overrides, which stay where they
    /// are), written atomically. The file is re-read rather than the running configuration
    /// written, so that overrides are not baked in.
    fn save_edit(&self, edit: &Request) -> Saved {
        use crate::control::commands as cmd;
        let Some(path) = &self.config_path else {
            return Saved::Failed {
                reason: "running on the built-in configuration: there is no file to update \
                         (write-config PATH saves the running configuration)"
                    .to_owned(),
            };
        };
        let origin = path.display().to_string();
        let outcome = std::fs::read_to_string(path)
            .map_err(|e| format!("{origin}: {e}"))
            .and_then(|text| {
                conf::Config::parse(&origin, &text, conf::EnvSource::None)
                    .map_err(|e| e.to_string())
            })
            .and_then(|file| cmd::edit(&file, edit).map_err(|e| format!("{origin}: {e}")))
            .and_then(|edited| {
                edited.validate().map_err(|errors| {
                    let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
                    format!("{origin} would not validate: {}", list.join("; "))
                })?;
                cmd::write_config(&edited, path, cmd::EDITED_HEADER)
            });
        match outcome {
            Ok(view) => Saved::Written { path: view.path },
            Err(reason) => Saved::Failed { reason },
        }
    }

    fn status_view(&self) -> StatusView {
        let nqns = self.target.subsystem_nqns();
        let namespaces = nqns
            .iter()
            .filter_map(|nqn| self.target.subsystem(nqn))
            .map(|s| s.namespaces().len())
            .sum();
        let controllers =
            crate::control::commands::controllers(&self.target, None).map_or(0, |c| c.len());
        StatusView {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
            uptime_secs: self.target.started().elapsed().as_secs(),
            config_path: self.config_path.clone(),
            subsystems: nqns.len(),
            namespaces,
            ports: self.target.ports().len(),
            controllers,
            connections: self
                .handles
                .iter()
                .map(|h| h.connections.load(Ordering::Relaxed))
                .sum(),
            discovery_genctr: self.target.discovery_genctr(),
            auth_failures: self.target.auth_failures().total(),
        }
    }
}
