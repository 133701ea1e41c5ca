use super::*;

#[test]
fn paths_are_generic_and_looked_up() {
    assert_eq!(
        generic_path("subsystems[12].namespaces[0].nsid"),
        "subsystems[].namespaces[].nsid"
    );
    assert_eq!(lookup("subsystems[3].nqn").unwrap().ty, Type::Str);
    assert!(lookup("subsystems[3].nqm").is_none());
    assert_eq!(suggest("global", "reactor"), Some("reactors"));
    assert_eq!(
        suggest("subsystems[].namespaces[]", "read_ony"),
        Some("read_only")
    );
    assert_eq!(suggest("global", "zzzzzzzz"), None);
}

#[test]
fn every_path_is_unique_and_has_its_parent() {
    for (i, key) in KEYS.iter().enumerate() {
        assert!(
            KEYS[..i].iter().all(|k| k.path != key.path),
            "{} twice",
            key.path
        );
        if let Some((parent, _)) = key.path.rsplit_once('.') {
            let parent = parent.strip_suffix("[]").unwrap_or(parent);
            assert!(
                KEYS.iter()
                    .any(|k| k.path == parent && matches!(k.ty, Type::Section | Type::Entries)),
                "{}: no section {parent}",
                key.path
            );
        }
    }
}

#[test]
fn scalars_are_checked_against_their_type() {
    assert!(check_scalar(U16, Scalar::Int(70000)).is_err());
    assert!(check_scalar(U16, Scalar::Int(4420)).is_ok());
    assert!(check_scalar(Type::Size, Scalar::Str("1MB")).is_err());
    assert!(check_scalar(Type::Size, Scalar::Str("1MiB")).is_ok());
    assert!(check_scalar(Type::Bool, Scalar::Str("yes")).is_err());
    assert!(check_scalar(Type::Enum(TRANSPORTS), Scalar::Str("udp")).is_err());
}
