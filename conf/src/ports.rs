//! `[[ports]]` (the listening addresses) and `[[referrals]]` (other discovery controllers),
//! both transport addresses, and their checks.

use std::collections::HashMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::report::Errors;
use crate::tls::TlsPolicy;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Tcp,
    Rdma,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        }
    }
}

/// `[[ports]]`: one listening address (the NVMe-oF "port" of the discovery log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Port {
    /// PORTID of the discovery log entry; referenced by `subsystems[].ports`.
    pub id: u16,
    pub transport: Transport,
    /// An IPv4 or IPv6 literal (no host names: the discovery log must carry what we bind).
    pub address: String,
    /// TCP port / RDMA CM port. Kept wider than u16 so that 70000 is reported by validation
    /// with its key path instead of as a type error.
    pub service: u32,
    /// NVMe/TCP secure channel: TLS 1.3 with PSKs (see `tls`).
    #[serde(default, skip_serializing_if = "TlsPolicy::is_none")]
    pub tls: TlsPolicy,
}

/// Ports with TLS (see `tls`) must be TCP ports and need at least one `[[tls_keys]]` entry.
pub(crate) fn check_tls(ports: &[Port], has_keys: bool, errors: &mut Errors) {
    for (i, port) in ports.iter().enumerate() {
        if port.tls.is_none() {
            continue;
        }
        if port.transport != Transport::Tcp {
            errors.push(
                format!("ports[{i}].tls"),
                port.tls.as_str(),
                "TLS applies to NVMe/TCP ports only",
            );
        } else if !has_keys {
            errors.push(
                format!("ports[{i}].tls"),
                port.tls.as_str(),
                "no [[tls_keys]]: no host could complete a TLS handshake",
            );
        }
    }
}

/// `[[referrals]]`: other discovery controllers listed in our discovery log (subtype 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Referral {
    pub transport: Transport,
    pub address: String,
    pub service: u32,
}

/// Every problem with `[[ports]]`: ids, addresses, services, and listeners that would collide.
pub(crate) fn check(ports: &[Port], errors: &mut Errors) {
    if ports.is_empty() {
        errors.push("ports", "", "at least one port is required");
    }
    let mut ids = HashMap::new();
    let mut endpoints: Vec<(usize, &Port, IpAddr)> = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let key = format!("ports[{i}]");
        if let Some(first) = ids.insert(port.id, i) {
            errors.push(
                format!("{key}.id"),
                port.id,
                format!("duplicate port id (also ports[{first}])"),
            );
        }
        check_service(&format!("{key}.service"), port.service, errors);
        let Some(ip) = check_address(&format!("{key}.address"), &port.address, errors) else {
            continue;
        };
        // Two listeners on the same service collide when the addresses are equal or one of
        // them is the wildcard of the same family (bind() fails with EADDRINUSE).
        for (j, other, other_ip) in &endpoints {
            let overlap = ip == *other_ip
                || (ip.is_ipv4() == other_ip.is_ipv4()
                    && (ip.is_unspecified() || other_ip.is_unspecified()));
            if other.transport == port.transport && other.service == port.service && overlap {
                errors.push(
                    format!("{key}.address"),
                    format!("{}:{}", port.address, port.service),
                    format!("overlaps ports[{j}] ({}:{})", other.address, other.service),
                );
            }
        }
        endpoints.push((i, port, ip));
    }
}

pub(crate) fn check_referrals(referrals: &[Referral], errors: &mut Errors) {
    for (i, referral) in referrals.iter().enumerate() {
        let key = format!("referrals[{i}]");
        check_address(&format!("{key}.address"), &referral.address, errors);
        check_service(&format!("{key}.service"), referral.service, errors);
    }
}

fn check_address(key: &str, address: &str, errors: &mut Errors) -> Option<IpAddr> {
    match address.parse::<IpAddr>() {
        Ok(ip) => Some(ip),
        Err(_) => {
            errors.push(key, address, "not an IPv4 or IPv6 address");
            None
        }
    }
}

fn check_service(key: &str, service: u32, errors: &mut Errors) {
    if !(1..=65535).contains(&service) {
        errors.push(key, service, "must be 1..=65535");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(transport: Transport, tls: TlsPolicy) -> Port {
        Port {
            id: 1,
            transport,
            address: "127.0.0.1".into(),
            service: 4420,
            tls,
        }
    }

    fn tls_errors(ports: &[Port], has_keys: bool) -> Vec<String> {
        let mut errors = Errors::default();
        check_tls(ports, has_keys, &mut errors);
        match errors.into_result() {
            Ok(()) => Vec::new(),
            Err(list) => list.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn tls_ports_are_tcp_ports_with_keys() {
        assert!(tls_errors(&[port(Transport::Tcp, TlsPolicy::Required)], true).is_empty());
        assert!(tls_errors(&[port(Transport::Rdma, TlsPolicy::None)], false).is_empty());
        assert_eq!(
            tls_errors(&[port(Transport::Tcp, TlsPolicy::Required)], false),
            ["ports[0].tls: required: no [[tls_keys]]: no host could complete a TLS handshake"]
        );
        assert_eq!(
            tls_errors(&[port(Transport::Rdma, TlsPolicy::Optional)], true),
            ["ports[0].tls: optional: TLS applies to NVMe/TCP ports only"]
        );
    }
}
