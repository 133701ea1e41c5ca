use super::*;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-6400-4e32-8565-326500000001";
const SUB: &str = "nqn.2026-12.dev.nvmfd:tls";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 32 bytes 00 01 … 1f as a `01` key.
fn key01() -> ConfiguredPsk {
    ConfiguredPsk {
        transform: Some(PskHash::Sha256),
        bytes: Zeroizing::new((0u8..32).collect()),
    }
}

#[test]
fn interchange_round_trip_and_crc() {
    let key = key01();
    let text = key.to_interchange();
    assert_eq!(text.len(), 65, "libnvme's length check for 32-byte keys");
    // Expected text from Python's base64 and zlib.crc32 (the CRC libnvme appends, little-endian).
    assert_eq!(
        &*text,
        "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:"
    );
    assert_eq!(
        ConfiguredPsk::parse(&format!(" {}\n", &*text)).unwrap(),
        key
    );
    let key48 = ConfiguredPsk {
        transform: None,
        bytes: Zeroizing::new(vec![7; 48]),
    };
    assert_eq!(key48.to_interchange().len(), 89);
    assert_eq!(key48.hash(), PskHash::Sha384);
    assert_eq!(
        ConfiguredPsk::parse(&key48.to_interchange()).unwrap(),
        key48
    );
}

#[test]
fn malformed_keys_are_refused() {
    let good = key01().to_interchange().to_string();
    let mut flipped = good.clone().into_bytes();
    flipped[20] = if flipped[20] == b'A' { b'B' } else { b'A' };
    let cases: Vec<(String, PskError)> = vec![
        (String::new(), PskError::Format),
        ("NVMeTLSkey-2:01:AAAA:".into(), PskError::Format),
        (good.trim_end_matches(':').into(), PskError::Format),
        (good.replace(":01:", ":03:"), PskError::Hash("03".into())),
        (
            good.replace(":01:", ":02:"),
            PskError::Length {
                len: 32,
                hash: "02".into(),
            },
        ),
        ("NVMeTLSkey-1:01:!!!!:".into(), PskError::Base64),
        (
            "NVMeTLSkey-1:00:AAAA:".into(),
            PskError::Length {
                len: 0,
                hash: "00".into(),
            },
        ),
        (String::from_utf8(flipped).unwrap(), PskError::Crc),
    ];
    for (text, error) in cases {
        assert_eq!(ConfiguredPsk::parse(&text), Err(error), "{text:?}");
    }
}

#[test]
fn hkdf_label_encodings() {
    let rfc = hkdf_label(b"HostNQN", b"nqn.x", 32, Derivation::Rfc8446);
    assert_eq!(
        hex(&rfc),
        format!(
            "0020{:02x}{}{:02x}{}",
            13,
            hex(b"tls13 HostNQN"),
            5,
            hex(b"nqn.x")
        )
    );
    let compat = hkdf_label(b"HostNQN", b"nqn.x", 32, Derivation::LibnvmeCompat);
    assert_eq!(
        hex(&compat),
        format!("2000{}{}", hex(b"tls13 HostNQN"), hex(b"nqn.x"))
    );
}

/// Vectors computed independently with OpenSSL's HKDF (`openssl kdf -keylen 32 -kdfopt
/// digest:SHA256 -kdfopt hexkey:<ikm> -kdfopt hexinfo:<hkdf_label> HKDF`), salt absent
/// (= zeros, RFC 5869 §2.2), which is what libnvme's EVP_PKEY_HKDF calls do.
#[test]
fn derivations_match_openssl_hkdf() {
    let key = key01();
    let retained = key.retained(HOST, Derivation::Rfc8446);
    assert_eq!(hex(&retained), RETAINED_RFC);
    let id = Identity::v0(PskHash::Sha256, HOST, SUB);
    assert_eq!(id.to_string(), format!("NVMe0R01 {HOST} {SUB}"));
    let tls = key.tls_psk(&id, Derivation::Rfc8446).unwrap();
    assert_eq!(hex(&tls), TLS_V0_RFC);
    let retained_compat = key.retained(HOST, Derivation::LibnvmeCompat);
    assert_eq!(hex(&retained_compat), RETAINED_COMPAT);
    assert_ne!(retained_compat, retained);
}

const RETAINED_RFC: &str = "f91468ca2c193e7ae1dd833e7dcd09c66853a7092cb0afe5406fb62cb60a7985";
const TLS_V0_RFC: &str = "2eaf4aed2741b1bc054fa547c0e2c5b07069d6c54291507469ae0f2ba8637327";
const RETAINED_COMPAT: &str = "1c623e7c15918b09ed895f7a0884855c80b5153a2d73f6b1f14cbf737c41d6a8";

#[test]
fn identities_parse_and_print() {
    let v0 = format!("NVMe0R01 {HOST} {SUB}");
    let id = Identity::parse(v0.as_bytes()).unwrap();
    assert_eq!(id, Identity::v0(PskHash::Sha256, HOST, SUB));
    assert_eq!(id.to_string(), v0);
    let v1 = Identity::v1(&key01(), HOST, SUB, Derivation::Rfc8446);
    let text = v1.to_string();
    assert!(text.starts_with(&format!("NVMe1R01 {HOST} {SUB} ")));
    // The digest is base64 of an HMAC-SHA-256: 44 characters.
    assert_eq!(v1.digest.as_ref().unwrap().len(), 44);
    assert_eq!(Identity::parse(text.as_bytes()).unwrap(), v1);
    for bad in [
        "".to_string(),
        format!("NVMe0G01 {HOST} {SUB}"),
        format!("NVMe2R01 {HOST} {SUB}"),
        format!("NVMe0R03 {HOST} {SUB}"),
        format!("NVMe0R01 {HOST}"),
        format!("NVMe0R01 {HOST} {SUB} extra"),
        format!("NVMe1R01 {HOST} {SUB}"),
        format!("NVMe0R01  {HOST} {SUB}"),
    ] {
        assert!(Identity::parse(bad.as_bytes()).is_err(), "{bad:?}");
    }
    assert!(Identity::parse(b"NVMe0R01 \xff \xfe").is_err());
}

#[test]
fn tls_psk_per_identity() {
    let key = key01();
    let v0 = Identity::v0(PskHash::Sha256, HOST, SUB);
    let v1 = Identity::v1(&key, HOST, SUB, Derivation::Rfc8446);
    let a = key.tls_psk(&v0, Derivation::Rfc8446).unwrap();
    let b = key.tls_psk(&v1, Derivation::Rfc8446).unwrap();
    assert_eq!((a.len(), b.len()), (32, 32));
    assert_ne!(a, b, "the identity is the derivation's context");
    let other_sub = Identity::v0(PskHash::Sha256, HOST, "nqn.2026-12.dev.nvmfd:other");
    assert_ne!(key.tls_psk(&other_sub, Derivation::Rfc8446).unwrap(), a);
    // A SHA-384 identity cannot come from a SHA-256 key, nor a digest from another key.
    assert!(key
        .tls_psk(
            &Identity::v0(PskHash::Sha384, HOST, SUB),
            Derivation::Rfc8446
        )
        .is_none());
    let mut forged = v1.clone();
    forged.digest = Some("A".repeat(44));
    assert!(key.tls_psk(&forged, Derivation::Rfc8446).is_none());
}
