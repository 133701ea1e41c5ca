use super::*;

#[test]
fn sockaddr_round_trip() {
    for addr in [
        "192.0.2.7:4420".parse::<SocketAddr>().unwrap(),
        "[2001:db8::1]:4421".parse().unwrap(),
    ] {
        let (storage, len) = to_sockaddr(addr);
        assert!(len as usize <= std::mem::size_of::<libc::sockaddr_storage>());
        assert_eq!(from_sockaddr(&storage), Some(addr));
    }
    // SAFETY: all-zero sockaddr_storage is valid (family AF_UNSPEC).
    let unspec: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    assert_eq!(from_sockaddr(&unspec), None);
}

#[test]
fn errno_is_kept_for_positive_and_negative_returns() {
    assert_eq!(
        VerbsError::from_ret("x", libc::ENOMEM).errno(),
        Some(libc::ENOMEM)
    );
}
