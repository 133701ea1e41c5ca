use super::*;

#[test]
fn tables_align_columns_and_leave_the_last_unpadded() {
    let t = table(
        &["A", "LONGER", "C"],
        &[
            vec!["xyz".into(), "1".into(), "end".into()],
            vec!["q".into(), "22".into(), "".into()],
        ],
    );
    assert_eq!(t, "A    LONGER  C\nxyz  1       end\nq    22\n");
}

#[test]
fn sizes_and_durations_read_naturally() {
    assert_eq!(human(512), "512");
    assert_eq!(human(1536), "1.5K");
    assert_eq!(human(1 << 30), "1G");
    assert_eq!(duration(59), "59s");
    assert_eq!(duration(3725), "1h02m");
}

#[test]
fn add_namespace_arguments_become_a_schema_namespace() {
    let r = request(CtlCommand::AddNamespace {
        nqn: "n".into(),
        nsid: 4,
        ram_size: None,
        path: Some(PathBuf::from("disk.img")),
        size: Some("16M".into()),
        block_size: 4096,
        read_only: true,
        buffered: true,
        uuid: None,
        nguid: None,
        hosts: vec!["nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a".into()],
    })
    .unwrap();
    let Request::AddNamespace { namespace, .. } = r else {
        panic!("{r:?}")
    };
    assert_eq!(namespace.ram_size, None);
    assert!(namespace.path.as_ref().unwrap().is_absolute());
    assert_eq!(namespace.size, Some(conf::ByteSize(16 << 20)));
    assert!(namespace.read_only && !namespace.direct_io);
    assert_eq!(namespace.hosts.as_ref().map(Vec::len), Some(1));
    let all = request(CtlCommand::SetNamespaceHosts {
        nqn: "n".into(),
        nsid: 4,
        hosts: vec![],
        all: true,
    })
    .unwrap();
    assert!(matches!(
        all,
        Request::SetNamespaceHosts { hosts: None, .. }
    ));
    let bad = request(CtlCommand::AddPort {
        id: 1,
        transport: "fc".into(),
        address: "127.0.0.1".into(),
        service: 4420,
    });
    assert!(matches!(bad, Err(CtlError::Usage(_))));
    let ana = request(CtlCommand::SetAnaState {
        group: 2,
        state: "persistent-loss".into(),
        port: Some(1),
    })
    .unwrap();
    assert_eq!(
        ana,
        Request::SetAnaState {
            group: 2,
            state: conf::multipath::AnaState::PersistentLoss,
            port: Some(1)
        }
    );
    let bad = request(CtlCommand::SetAnaState {
        group: 2,
        state: "optimised".into(),
        port: None,
    });
    assert!(matches!(bad, Err(CtlError::Usage(_))));
}
