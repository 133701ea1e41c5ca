//! `[[subsystems.hosts]]` (DH-HMAC-CHAP keys per host) and the secure default for subsystems
//! without hosts.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::{assert_has, errors_of, with_port};
use conf::Config;
use nvmfd_auth::{DhGroup, HashId, Secret};

const SUB: &str = "nqn.2026-12.dev.nvmfd:a";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:8d1e34a2-9c1b-4f7a-bb5e-2f6d0c9a7e11";
const HOST2: &str = "nqn.2014-08.org.nvmexpress:uuid:4c4c4544-0035-4810-8057-b7c04f4e4d32";

fn key() -> String {
    Secret::generate(Some(HashId::Sha256), 32)
        .unwrap()
        .to_interchange()
        .to_string()
}

fn sub_with_host(host_keys: &str) -> String {
    with_port(&format!(
        "[[subsystems]]\nnqn = \"{SUB}\"\n[[subsystems.hosts]]\nnqn = \"{HOST}\"\n{host_keys}\n"
    ))
}

#[test]
fn a_subsystem_without_hosts_must_say_allow_any_host() {
    let errors = errors_of(&with_port(&format!("[[subsystems]]\nnqn = \"{SUB}\"\n")));
    assert_eq!(
        errors,
        [format!(
            "subsystems[0].allow_any_host: subsystem {SUB} lists no hosts: say allow_any_host = \
             true to let any host connect, or list allowed_hosts / [[subsystems.hosts]]"
        )]
    );
    // Explicitly open, or explicitly closed, or with hosts: accepted.
    for keys in [
        "allow_any_host = true",
        "allow_any_host = false",
        &format!("allowed_hosts = [\"{HOST}\"]"),
    ] {
        let text = with_port(&format!("[[subsystems]]\nnqn = \"{SUB}\"\n{keys}\n"));
        assert_eq!(errors_of(&text), Vec::<String>::new(), "{keys}");
        let c = Config::parse_toml(&text).unwrap();
        assert_eq!(c.subsystems[0].allows_any_host(), keys.ends_with("true"));
    }
}

#[test]
fn inline_keys_parse_with_defaults_and_round_trip() {
    let (hk, ck) = (key(), key());
    let text = sub_with_host(&format!(
        "dhchap_key = \"{hk}\"\ndhchap_ctrl_key = \"{ck}\"\n\
         dhchap_hashes = [\"sha512\", \"hmac(sha256)\"]\ndhchap_dhgroups = [\"ffdhe8192\", \"null\"]"
    ));
    assert_eq!(errors_of(&text), Vec::<String>::new());
    let c = Config::parse_toml(&text).unwrap();
    let s = &c.subsystems[0];
    assert!(!s.allows_any_host());
    assert_eq!(s.host_nqns().collect::<Vec<_>>(), [HOST]);
    let keys = s.hosts[0].keys().unwrap().unwrap();
    assert_eq!(keys.host_key, Secret::parse(&hk).unwrap());
    assert_eq!(keys.ctrl_key, Some(Secret::parse(&ck).unwrap()));
    assert_eq!(keys.hashes, [HashId::Sha512, HashId::Sha256]);
    assert_eq!(keys.dh_groups, [DhGroup::Ffdhe8192, DhGroup::Null]);
    assert_eq!(Config::parse_toml(&c.to_toml().unwrap()).unwrap(), c);

    // Defaults: every hash; every FFDHE group before NULL.
    let c = Config::parse_toml(&sub_with_host(&format!("dhchap_key = \"{hk}\""))).unwrap();
    let keys = c.subsystems[0].hosts[0].keys().unwrap().unwrap();
    assert_eq!(keys.hashes, HashId::ALL);
    assert_eq!(keys.dh_groups[0], DhGroup::Ffdhe2048);
    assert_eq!(keys.dh_groups.last(), Some(&DhGroup::Null));
    // A host entry without a key is allowed without authentication.
    let c = Config::parse_toml(&sub_with_host("")).unwrap();
    assert_eq!(c.subsystems[0].hosts[0].keys().unwrap(), None);
}

#[test]
fn bad_keys_and_settings_name_the_key_but_never_echo_a_secret() {
    let hk = key();
    // One corrupted character: the CRC no longer matches.
    let mut bad = hk.clone().into_bytes();
    bad[12] = if bad[12] == b'A' { b'B' } else { b'A' };
    let bad = String::from_utf8(bad).unwrap();
    let errors = errors_of(&sub_with_host(&format!("dhchap_key = \"{bad}\"")));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("subsystems[0].hosts[0].dhchap_key: "),
        "{errors:?}"
    );
    assert!(!errors[0].contains(&bad[10..]), "secret echoed: {errors:?}");

    let cases = [
        (
            "dhchap_key = \"DHHC-1:07:abcd:\"".to_owned(),
            "subsystems[0].hosts[0].dhchap_key: unknown secret transformation \"07\" (00, 01, 02 or 03)",
        ),
        (
            format!("dhchap_ctrl_key = \"{hk}\""),
            "subsystems[0].hosts[0].dhchap_ctrl_key: a controller key needs a host key (dhchap_key or dhchap_key_file)",
        ),
        (
            "dhchap_hashes = [\"sha256\"]".to_owned(),
            "subsystems[0].hosts[0].dhchap_hashes: hashes and DH groups need a host key (dhchap_key or dhchap_key_file)",
        ),
        (
            format!("dhchap_key = \"{hk}\"\ndhchap_hashes = [\"md5\"]"),
            "subsystems[0].hosts[0].dhchap_hashes: md5: not one of hmac(sha256), hmac(sha384), hmac(sha512)",
        ),
        (
            format!("dhchap_key = \"{hk}\"\ndhchap_dhgroups = [\"modp2048\"]"),
            "subsystems[0].hosts[0].dhchap_dhgroups: modp2048: not one of null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144, ffdhe8192",
        ),
        (
            format!("dhchap_key = \"{hk}\"\ndhchap_key_file = \"/nonexistent/key\""),
            "subsystems[0].hosts[0].dhchap_key_file: /nonexistent/key: exclusive with dhchap_key",
        ),
    ];
    for (keys, expected) in cases {
        assert_eq!(errors_of(&sub_with_host(&keys)), [expected], "{keys}");
    }
}

#[test]
fn key_files_must_be_private() {
    let dir = std::env::temp_dir().join(format!("conf-hosts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("host.key");
    let hk = key();
    std::fs::write(&path, format!("{hk}\n")).unwrap();
    let text = sub_with_host(&format!("dhchap_key_file = \"{}\"", path.display()));

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let errors = errors_of(&text);
    assert_eq!(
        errors,
        [format!(
            "subsystems[0].hosts[0].dhchap_key_file: {p}: key file {p} is readable by group or \
             others (mode 644); chmod 600 it",
            p = path.display()
        )]
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(errors_of(&text).len(), 1);

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(errors_of(&text), Vec::<String>::new());
    let c = Config::parse_toml(&text).unwrap();
    let keys = c.subsystems[0].hosts[0].keys().unwrap().unwrap();
    assert_eq!(keys.host_key, Secret::parse(&hk).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_host_is_listed_once_across_allowed_hosts_and_hosts() {
    let text = with_port(&format!(
        "[[subsystems]]\nnqn = \"{SUB}\"\nallowed_hosts = [\"{HOST}\", \"{HOST2}\"]\n\
         [[subsystems.hosts]]\nnqn = \"{HOST}\"\n[[subsystems.hosts]]\nnqn = \"bad\"\n"
    ));
    let errors = errors_of(&text);
    assert_has(
        &errors,
        &format!(
            "subsystems[0].hosts[0].nqn: {HOST}: listed twice (also subsystems[0].allowed_hosts[0])"
        ),
    );
    assert_has(
        &errors,
        "subsystems[0].hosts[1].nqn: bad: must start with \"nqn.yyyy-mm.\" (NVMe Base 2.0 §4.5)",
    );
    let with_any = with_port(&format!(
        "[[subsystems]]\nnqn = \"{SUB}\"\nallow_any_host = true\n[[subsystems.hosts]]\nnqn = \"{HOST}\"\n"
    ));
    assert_has(
        &errors_of(&with_any),
        "subsystems[0].allow_any_host: true: contradicts the non-empty allowed_hosts / hosts lists",
    );
}

/// A namespace's `hosts`: host NQNs, each once (errors); a host the subsystem does not admit,
/// or an empty list, is legal but warned about.
#[test]
fn namespace_hosts_are_host_nqns_and_unadmitted_ones_are_warned_about() {
    let file = |hosts: &str| {
        with_port(&format!(
            "[[subsystems]]\nnqn = \"{SUB}\"\nallowed_hosts = [\"{HOST}\"]\n\
             [[subsystems.namespaces]]\nnsid = 1\nram_size = \"1M\"\n\
             [[subsystems.namespaces]]\nnsid = 2\nram_size = \"1M\"\nhosts = {hosts}\n"
        ))
    };
    let config = Config::parse_toml(&file(&format!("[\"{HOST}\"]"))).unwrap();
    assert_eq!(config.validate(), Ok(()));
    assert!(config.warnings().is_empty());
    assert_eq!(config.subsystems[0].namespaces[0].hosts, None);
    assert_eq!(
        config.subsystems[0].namespaces[1].hosts,
        Some(vec![HOST.to_owned()])
    );

    let errors = errors_of(&file(&format!("[\"{HOST}\", \"host-a\", \"{HOST}\"]")));
    assert_eq!(
        errors,
        [
            "subsystems[0].namespaces[1].hosts[1]: host-a: must start with \"nqn.yyyy-mm.\" (NVMe Base 2.0 §4.5)".to_owned(),
            format!("subsystems[0].namespaces[1].hosts[2]: {HOST}: listed twice (also subsystems[0].namespaces[1].hosts[0])"),
        ]
    );

    let config = Config::parse_toml(&file(&format!("[\"{HOST2}\"]"))).unwrap();
    assert_eq!(config.validate(), Ok(()));
    let warnings: Vec<String> = config.warnings().iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [format!(
            "subsystems[0].namespaces[1].hosts[0]: {HOST2}: not an allowed host of this \
             subsystem: it cannot connect to see the namespace"
        )]
    );
    let config = Config::parse_toml(&file("[]")).unwrap();
    let warnings: Vec<String> = config.warnings().iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        ["subsystems[0].namespaces[1].hosts: namespace 2 is hidden from every host"]
    );
}
