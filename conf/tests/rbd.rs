//! `rbd = "pool/image"` namespaces: parsing into `Storage::Rbd` and validation of the image
//! spec and of the Ceph keys, each error naming its key path and value.

mod common;

use common::{assert_has, errors_of, subsystem, with_port};
use conf::{Config, Storage};

/// One namespace (nsid 1) with `keys` besides its nsid.
fn with_namespace(keys: &str) -> String {
    with_port(&subsystem(
        "nqn.2026-12.dev.nvmfd:ceph",
        &[&format!("nsid = 1\n{keys}")],
    ))
}

fn config(keys: &str) -> Config {
    Config::parse_toml(&with_namespace(keys)).unwrap_or_else(|e| panic!("{e}"))
}

fn namespace_errors(keys: &str) -> Vec<String> {
    errors_of(&with_namespace(keys))
}

#[test]
fn rbd_namespace_parses_into_storage_rbd() {
    let c = config("rbd = \"rbd/disk0\"\nceph_conf = \"/etc/hosts\"\nceph_client_id = \"nvmfd\"\n");
    c.validate().unwrap();
    let ns = &c.subsystems[0].namespaces[0];
    assert_eq!(
        ns.storage(),
        Some(Storage::Rbd {
            image: "rbd/disk0",
            ceph_conf: Some(std::path::Path::new("/etc/hosts")),
            client_id: Some("nvmfd"),
        })
    );
    // A RADOS namespace in the middle, defaults for the Ceph keys.
    let c = config("rbd = \"volumes/tenant-a/disk1\"\n");
    c.validate().unwrap();
    assert_eq!(
        c.subsystems[0].namespaces[0].storage(),
        Some(Storage::Rbd {
            image: "volumes/tenant-a/disk1",
            ceph_conf: None,
            client_id: None,
        })
    );
}

#[test]
fn rbd_image_spec_errors() {
    let key = "subsystems[0].namespaces[0].rbd";
    for bad in ["disk0", "rbd/", "/disk0", "a/b/c/d", "rbd//disk0"] {
        let errors = namespace_errors(&format!("rbd = \"{bad}\"\n"));
        assert_has(
            &errors,
            &format!("{key}: {bad}: must be \"pool/image\" or \"pool/namespace/image\""),
        );
    }
    assert_has(
        &namespace_errors("rbd = \"rbd/disk0@snap1\"\n"),
        &format!("{key}: rbd/disk0@snap1: snapshots (@) cannot be exported"),
    );
    assert_has(
        &namespace_errors("rbd = \"rbd/disk 0\"\n"),
        &format!("{key}: rbd/disk 0: contains NUL or whitespace"),
    );
}

#[test]
fn rbd_is_exclusive_with_other_storage_and_owns_the_ceph_keys() {
    let key = "subsystems[0].namespaces[0]";
    assert_has(
        &namespace_errors("rbd = \"rbd/disk0\"\nram_size = \"1M\"\n"),
        &format!("{key}: needs exactly one of ram_size / path / rbd"),
    );
    let errors =
        namespace_errors("ram_size = \"1M\"\nceph_conf = \"/etc/hosts\"\nceph_client_id = \"x\"\n");
    assert_has(
        &errors,
        &format!("{key}.ceph_conf: /etc/hosts: only valid with rbd"),
    );
    assert_has(
        &errors,
        &format!("{key}.ceph_client_id: x: only valid with rbd"),
    );
    assert_has(
        &namespace_errors("rbd = \"rbd/disk0\"\nsize = \"1M\"\n"),
        &format!("{key}.size: 1M: only valid with path (RAM namespaces use ram_size)"),
    );
}

#[test]
fn ceph_conf_and_client_id_are_checked() {
    let key = "subsystems[0].namespaces[0]";
    assert_has(
        &namespace_errors("rbd = \"rbd/d\"\nceph_conf = \"ceph.conf\"\n"),
        &format!("{key}.ceph_conf: ceph.conf: must be an absolute path"),
    );
    assert_has(
        &namespace_errors("rbd = \"rbd/d\"\nceph_conf = \"/nonexistent/ceph.conf\"\n"),
        &format!("{key}.ceph_conf: /nonexistent/ceph.conf: no such file"),
    );
    for bad in ["client.", "", "a b"] {
        // An empty value is left out of the message.
        let shown = if bad.is_empty() {
            String::new()
        } else {
            format!(" {bad}:")
        };
        assert_has(
            &namespace_errors(&format!("rbd = \"rbd/d\"\nceph_client_id = \"{bad}\"\n")),
            &format!(
                "{key}.ceph_client_id:{shown} must be a client id such as \"admin\" or \"client.admin\""
            ),
        );
    }
}
