use super::*;

fn config() -> conf::Config {
    conf::Config::parse_toml(
        r#"
[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = 4420
[[ports]]
id = 2
transport = "tcp"
address = "127.0.0.1"
service = 4421
[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:a"
allowed_hosts = ["nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001"]
ports = [2]
[[subsystems.namespaces]]
nsid = 1
ram_size = "1M"
"#,
    )
    .unwrap()
}

const A: &str = "nqn.2026-12.dev.nvmfd:a";
const H1: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";

#[test]
fn namespace_edits_check_existence_and_keep_nsid_order() {
    let c = config();
    let add = |nsid| Request::AddNamespace {
        nqn: A.into(),
        namespace: Box::new(conf::Namespace::new_ram(nsid, conf::ByteSize(1 << 20))),
    };
    let c3 = edit(&c, &add(3)).unwrap();
    let c2 = edit(&c3, &add(2)).unwrap();
    let nsids: Vec<u32> = c2.subsystems[0].namespaces.iter().map(|n| n.nsid).collect();
    assert_eq!(nsids, [1, 2, 3]);
    assert!(edit(&c2, &add(2)).unwrap_err().contains("already has"));
    let removed = edit(
        &c2,
        &Request::RemoveNamespace {
            nqn: A.into(),
            nsid: 1,
        },
    )
    .unwrap();
    assert_eq!(removed.subsystems[0].namespaces.len(), 2);
    let missing = Request::RemoveNamespace {
        nqn: A.into(),
        nsid: 9,
    };
    assert!(edit(&c, &missing).unwrap_err().contains("no namespace 9"));
    let unknown = Request::RemoveNamespace {
        nqn: "nqn.2026-12.dev.nvmfd:zz".into(),
        nsid: 1,
    };
    assert!(edit(&c, &unknown).unwrap_err().starts_with("no subsystem"));
    assert!(edit(&c, &Request::Ports).is_err());
}

#[test]
fn namespace_hosts_edit_sets_and_clears_the_list() {
    let c = config();
    let set = |nsid, hosts: Option<Vec<String>>| Request::SetNamespaceHosts {
        nqn: A.into(),
        nsid,
        hosts,
    };
    let shown = edit(&c, &set(1, Some(vec![H1.into()]))).unwrap();
    assert_eq!(
        shown.subsystems[0].namespaces[0].hosts,
        Some(vec![H1.into()])
    );
    let all = edit(&shown, &set(1, None)).unwrap();
    assert_eq!(all.subsystems[0].namespaces[0].hosts, None);
    assert!(edit(&c, &set(9, None))
        .unwrap_err()
        .contains("no namespace 9"));
}

#[test]
fn removing_the_last_host_keeps_the_subsystem_closed() {
    let c = config();
    assert!(!c.subsystems[0].allows_any_host());
    let r = edit(
        &c,
        &Request::RemoveHost {
            nqn: A.into(),
            host: H1.into(),
        },
    )
    .unwrap();
    assert!(r.subsystems[0].allowed_hosts.is_empty());
    assert!(!r.subsystems[0].allows_any_host(), "not opened to everyone");
    let again = Request::AddHost {
        nqn: A.into(),
        host: H1.into(),
    };
    assert!(edit(&c, &again).unwrap_err().contains("already allowed"));
    assert_eq!(edit(&r, &again).unwrap().subsystems[0].allowed_hosts, [H1]);
}

#[test]
fn port_edits_keep_subsystem_port_lists_meaningful() {
    let c = config();
    let port = conf::Port {
        id: 3,
        transport: conf::Transport::Tcp,
        address: "127.0.0.1".into(),
        service: 4422,
        tls: conf::TlsPolicy::None,
    };
    let added = edit(&c, &Request::AddPort { port: port.clone() }).unwrap();
    assert_eq!(added.ports.len(), 3);
    assert!(edit(&added, &Request::AddPort { port }).is_err());
    // Port 2 is the only port of subsystem a: removing it would export a everywhere.
    let err = edit(&c, &Request::RemovePort { id: 2 }).unwrap_err();
    assert!(err.contains("only port"), "{err}");
    let r = edit(&c, &Request::RemovePort { id: 1 }).unwrap();
    assert_eq!(r.ports.len(), 1);
    assert!(edit(&c, &Request::RemovePort { id: 7 }).is_err());
    let rdma = conf::Port {
        id: 4,
        transport: conf::Transport::Rdma,
        address: "192.0.2.1".into(),
        service: 4420,
        tls: conf::TlsPolicy::None,
    };
    let err = edit(&c, &Request::AddPort { port: rdma.clone() }).unwrap_err();
    assert!(err.contains("RDMA ports are fixed"), "{err}");
    let mut with_rdma = c.clone();
    with_rdma.ports.push(rdma);
    let err = edit(&with_rdma, &Request::RemovePort { id: 4 }).unwrap_err();
    assert!(err.contains("RDMA ports are fixed"), "{err}");
}

#[test]
fn ana_state_edits_set_a_group_or_one_port() {
    let c = config();
    let set = |group, state, port| Request::SetAnaState { group, state, port };
    // Group 1 is implicit: the first edit declares it.
    let one = edit(&c, &set(1, AnaState::NonOptimized, Some(2))).unwrap();
    assert_eq!(one.ana_groups.len(), 1);
    assert_eq!(one.ana_groups[0].state, AnaState::Optimized);
    assert_eq!(
        one.ana_groups[0].port_states,
        [PortAnaState {
            port: 2,
            state: AnaState::NonOptimized
        }]
    );
    // The same port again replaces its entry; a whole-group state drops per-port ones.
    let again = edit(&one, &set(1, AnaState::Inaccessible, Some(2))).unwrap();
    assert_eq!(again.ana_groups[0].port_states.len(), 1);
    assert_eq!(
        again.ana_groups[0].port_states[0].state,
        AnaState::Inaccessible
    );
    let whole = edit(&again, &set(1, AnaState::Change, None)).unwrap();
    assert_eq!(whole.ana_groups[0].state, AnaState::Change);
    assert!(whole.ana_groups[0].port_states.is_empty());
    assert!(whole.validate().is_ok());
    let err = edit(&c, &set(7, AnaState::Optimized, None)).unwrap_err();
    assert!(err.contains("no ANA group 7"), "{err}");
    let err = edit(&c, &set(1, AnaState::Optimized, Some(9))).unwrap_err();
    assert!(err.contains("no port 9"), "{err}");
}

#[test]
fn write_config_round_trips_and_keeps_permissions() {
    let dir = std::env::temp_dir().join(format!("nvmfd-writecfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("nvmfd.toml");
    let c = edit(
        &config(),
        &Request::AddNamespace {
            nqn: A.into(),
            namespace: Box::new(conf::Namespace::new_ram(5, conf::ByteSize(2 << 20))),
        },
    )
    .unwrap();
    let view = write_config(&c, &path, RUNNING_HEADER).unwrap();
    assert_eq!(view.path, path);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    let back = conf::Config::parse_toml(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(back, c);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    write_config(&config(), &path, RUNNING_HEADER).unwrap();
    assert_eq!(mode(&path), 0o644);
    assert_eq!(
        conf::Config::parse_toml(&std::fs::read_to_string(&path).unwrap()).unwrap(),
        config()
    );
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        1,
        "no temporary left"
    );
    assert!(write_config(&c, &dir.join("missing/x.toml"), RUNNING_HEADER).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tls_keys_are_added_replaced_and_removed() {
    let c = config();
    let key = |file: &str, subsystem: Option<&str>| conf::TlsKey {
        host: H1.into(),
        subsystem: subsystem.map(Into::into),
        key_file: file.into(),
        hkdf_label: conf::HkdfLabel::Compat,
    };
    let set = |k: conf::TlsKey| Request::SetTlsKey { key: k };
    let one = edit(&c, &set(key("/k/1.psk", None))).unwrap();
    assert_eq!(one.tls_keys, [key("/k/1.psk", None)]);
    // Same host and scope: replaced; another scope: added beside it.
    let replaced = edit(&one, &set(key("/k/2.psk", None))).unwrap();
    assert_eq!(replaced.tls_keys, [key("/k/2.psk", None)]);
    let two = edit(&replaced, &set(key("/k/3.psk", Some(A)))).unwrap();
    assert_eq!(two.tls_keys.len(), 2);
    let remove = |subsystem: Option<&str>| Request::RemoveTlsKey {
        host: H1.into(),
        subsystem: subsystem.map(Into::into),
    };
    let left = edit(&two, &remove(None)).unwrap();
    assert_eq!(left.tls_keys, [key("/k/3.psk", Some(A))]);
    assert!(edit(&left, &remove(None))
        .unwrap_err()
        .contains("no TLS key"));
}

#[test]
fn host_keys_are_set_rotated_and_removed_with_the_host() {
    let c = config();
    const KEY: &str = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
    let mut host = conf::Host::new(H1);
    host.dhchap_key = Some(KEY.into());
    host.dhchap_dhgroups = vec!["ffdhe8192".into()];
    let set = Request::SetHostKey {
        nqn: A.into(),
        host: host.clone(),
    };
    // The host moves from allowed_hosts to a host entry with its keys.
    let r = edit(&c, &set).unwrap();
    let s = &r.subsystems[0];
    assert!(s.allowed_hosts.is_empty());
    assert_eq!(s.hosts, [host.clone()]);
    // Rotation replaces the entry; a new host is added.
    host.dhchap_key_file = Some("/etc/nvmfd/h1.key".into());
    host.dhchap_key = None;
    let rotated = edit(
        &r,
        &Request::SetHostKey {
            nqn: A.into(),
            host: host.clone(),
        },
    )
    .unwrap();
    assert_eq!(rotated.subsystems[0].hosts, [host.clone()]);
    assert!(edit(
        &rotated,
        &Request::AddHost {
            nqn: A.into(),
            host: H1.into()
        }
    )
    .unwrap_err()
    .contains("already allowed"));
    // Removing the host removes its keys and keeps the subsystem closed.
    let removed = edit(
        &rotated,
        &Request::RemoveHost {
            nqn: A.into(),
            host: H1.into(),
        },
    )
    .unwrap();
    assert!(removed.subsystems[0].hosts.is_empty());
    assert!(!removed.subsystems[0].allows_any_host());
    // The request is logged: its Debug never shows an inline key.
    let shown = format!("{set:?}");
    assert!(
        !shown.contains(KEY) && shown.contains("<secret>"),
        "{shown}"
    );
}

#[test]
fn inline_keys_are_never_written_to_a_readable_file() {
    let dir = std::env::temp_dir().join(format!("nvmfd-wc-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("nvmfd.toml");
    std::fs::write(&path, "").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut c = config();
    let mut host = conf::Host::new("nqn.2014-08.org.nvmexpress:uuid:k");
    host.dhchap_key = Some("DHHC-1:00:x:".into());
    c.subsystems[0].hosts.push(host);
    let e = write_config(&c, &path, "# test").unwrap_err();
    assert!(e.contains("inline DH-HMAC-CHAP keys"), "{e}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    write_config(&c, &path, "# test").unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn uuids_are_printed_in_the_usual_form() {
    let u = [
        0x26, 0xff, 0xc8, 0xce, 0x73, 0xb4, 0x32, 0x1d, 0x96, 0x85, 0x7d, 0x7a, 0x98, 0x72, 0xc4,
        0x60,
    ];
    assert_eq!(uuid_text(&u), "26ffc8ce-73b4-321d-9685-7d7a9872c460");
}
