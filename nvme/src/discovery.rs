//! Discovery controllers (NVMe Base 2.0 §3.1.3.3 and §5.16.1.23): Identify, the Discovery log
//! page (70h), features, Asynchronous Event Request and Keep Alive.

use std::net::IpAddr;

use crate::admin::{
    async_event_request, copy_out, identify_controller, set_async_event_config, AdminCommand,
    LogRequest,
};
use crate::command::Completion;
use crate::controller::{AsyncEvent, Controller, ADMIN_QUEUE_ENTRIES};
use crate::peer::TransportKind;
use crate::spec::{admin_opcode, cns, disc, fid, lid, CNTLID_DYNAMIC, DISCOVERY_NQN};
use crate::target::{PortConfig, ReferralConfig, SecureChannel, Target};
use crate::wire::log::{DiscoveryLogEntry, DiscoveryLogHeader};
use crate::wire::{Sqe, Status};

/// Admin commands of a discovery controller (NVMe Base 2.0 Figure 284: no Abort), by opcode.
pub(crate) static COMMANDS: [AdminCommand; 6] = {
    use admin_opcode as o;
    [
        AdminCommand::new(o::GET_LOG_PAGE, |cx, ctrl, sqe, data| {
            get_log_page(cx.target, ctrl, sqe, data).into()
        }),
        AdminCommand::new(o::IDENTIFY, |cx, ctrl, sqe, data| {
            if sqe.cdw10 as u8 != cns::CONTROLLER {
                return Completion::fail(Status::INVALID_FIELD).at(40).into();
            }
            copy_out(data, &identify_controller(cx, ctrl).encode()[..]).into()
        }),
        AdminCommand::new(o::SET_FEATURES, |_, ctrl, sqe, _| {
            set_features(ctrl, sqe).into()
        }),
        AdminCommand::new(o::GET_FEATURES, |_, ctrl, sqe, _| {
            get_features(ctrl, sqe).into()
        }),
        AdminCommand::new(o::ASYNC_EVENT_REQUEST, |cx, ctrl, sqe, _| {
            async_event_request(cx, ctrl, sqe)
        }),
        AdminCommand::new(o::KEEP_ALIVE, |_, _, _, _| Completion::ok().into()),
    ]
};

/// Get Log Page: the Discovery log page (70h) only.
fn get_log_page(target: &Target, ctrl: &Controller, sqe: &Sqe, data: &mut [u8]) -> Completion {
    let req = LogRequest::from_sqe(sqe);
    if req.lid != lid::DISCOVERY {
        return Completion::fail(Status::INVALID_LOG_PAGE).at(40);
    }
    let page = discovery_log_page(target, ctrl);
    if !req.rae {
        ctrl.clear_event_mask(AsyncEvent::DiscoveryLogChanged);
    }
    req.serve(&page, data)
}

/// Set Features: Keep Alive Timer and Asynchronous Event Configuration only.
fn set_features(ctrl: &Controller, sqe: &Sqe) -> Completion {
    match sqe.cdw10 as u8 {
        fid::KEEP_ALIVE_TIMER => {
            ctrl.set_kato(sqe.cdw11);
            Completion::ok()
        }
        fid::ASYNC_EVENT_CONFIG => set_async_event_config(ctrl, sqe.cdw11),
        _ => Completion::fail(Status::INVALID_FIELD).at(40),
    }
}

/// Get Features: Keep Alive Timer and Asynchronous Event Configuration only.
fn get_features(ctrl: &Controller, sqe: &Sqe) -> Completion {
    match sqe.cdw10 as u8 {
        fid::KEEP_ALIVE_TIMER => Completion::value(ctrl.lock().kato_ms),
        fid::ASYNC_EVENT_CONFIG => Completion::value(ctrl.lock().features.async_event_config),
        _ => Completion::fail(Status::INVALID_FIELD).at(40),
    }
}

/// The address to report for `port`: its configured address, or — for a wildcard listener —
/// the local address of the host's discovery connection (never 0.0.0.0 / ::).
fn reported_address(port_addr: IpAddr, ctrl: &Controller) -> IpAddr {
    if port_addr.is_unspecified() {
        ctrl.peer.local.ip().to_canonical()
    } else {
        port_addr
    }
}

/// Transport specific address subtype (NVMe/TCP 1.0 Figure 4, NVMe/RDMA 1.0 Figure 3).
fn tsas(t: TransportKind, secure: SecureChannel) -> [u8; 256] {
    let mut tsas = [0u8; 256];
    match t {
        TransportKind::Tcp if secure == SecureChannel::None => tsas[0] = disc::TCP_SECTYPE_NONE,
        TransportKind::Tcp => tsas[0] = disc::TCP_SECTYPE_TLS13,
        TransportKind::Rdma => {
            tsas[0] = disc::RDMA_QPTYPE_CONNECTED;
            tsas[1] = disc::RDMA_PRTYPE_NOT_SPECIFIED;
            tsas[2] = disc::RDMA_CMS_RDMA_CM;
        }
    }
    tsas
}

fn entry(
    transport: TransportKind,
    addr: IpAddr,
    service: u16,
    portid: u16,
    subtype: u8,
    subnqn: &str,
    secure: SecureChannel,
) -> DiscoveryLogEntry {
    // The discovery subsystem's own entries (TP 8013): connecting there returns this same
    // information, and it keeps explicit persistent connections (KATO, change notices).
    let eflags = if subtype == disc::SUBTYPE_CURRENT_DISCOVERY {
        disc::EFLAGS_DUPRETINFO | disc::EFLAGS_EPCSD
    } else {
        0
    };
    let secure_channel = match secure {
        SecureChannel::None => disc::TREQ_NOT_SPECIFIED,
        SecureChannel::TlsOptional => disc::TREQ_NOT_REQUIRED,
        SecureChannel::TlsRequired => disc::TREQ_REQUIRED,
    };
    DiscoveryLogEntry {
        trtype: transport.trtype(),
        adrfam: if addr.is_ipv4() {
            disc::ADRFAM_IPV4
        } else {
            disc::ADRFAM_IPV6
        },
        subtype,
        // The port's secure channel requirement; SQ flow control may be disabled.
        treq: secure_channel | disc::TREQ_DISABLE_SQFLOW,
        portid,
        cntlid: CNTLID_DYNAMIC,
        asqsz: ADMIN_QUEUE_ENTRIES,
        eflags,
        trsvcid: service.to_string(),
        subnqn: subnqn.to_string(),
        traddr: addr.to_string(),
        tsas: tsas(transport, secure),
    }
}

/// The entries `ctrl`'s host may see (`Topology::discovery_view`): the current discovery
/// subsystem on each port (TP 8013, first, as nvmet lists it), one per (allowed subsystem, port
/// exporting it), then the referrals.
pub fn discovery_entries(target: &Target, ctrl: &Controller) -> (u64, Vec<DiscoveryLogEntry>) {
    let topo = target.topology();
    let view = topo.discovery_view(&ctrl.hostnqn);
    let own_nqn = &target.discovery_subsystem().nqn;
    let port_entry = |port: &PortConfig, subtype: u8, subnqn: &str| {
        let PortConfig {
            id,
            transport,
            address,
            service,
            secure_channel,
        } = *port;
        entry(
            transport,
            reported_address(address, ctrl),
            service,
            id,
            subtype,
            subnqn,
            secure_channel,
        )
    };
    let mut out: Vec<DiscoveryLogEntry> = view
        .ports
        .iter()
        .map(|port| port_entry(port, disc::SUBTYPE_CURRENT_DISCOVERY, own_nqn))
        .collect();
    for (nqn, ports) in &view.subsystems {
        out.extend(
            ports
                .iter()
                .map(|port| port_entry(port, disc::SUBTYPE_NVM, nqn)),
        );
    }
    for &ReferralConfig {
        transport,
        address,
        service,
    } in &view.referrals
    {
        out.push(entry(
            transport,
            address,
            service,
            0,
            disc::SUBTYPE_REFERRAL,
            DISCOVERY_NQN,
            SecureChannel::None,
        ));
    }
    (topo.genctr, out)
}

/// The whole Discovery log page (Figure 262): header then 1024-byte entries. Its size is
/// bounded by the configuration, not by anything the host sends.
pub fn discovery_log_page(target: &Target, ctrl: &Controller) -> Vec<u8> {
    let (genctr, entries) = discovery_entries(target, ctrl);
    let header = DiscoveryLogHeader {
        genctr,
        numrec: entries.len() as u64,
        recfmt: 0,
    };
    let mut page =
        Vec::with_capacity(DiscoveryLogHeader::SIZE + entries.len() * DiscoveryLogEntry::SIZE);
    page.extend_from_slice(&header.encode());
    for e in &entries {
        page.extend_from_slice(&e.encode());
    }
    page
}
