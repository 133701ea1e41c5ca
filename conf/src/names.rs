//! NVMe Qualified Names and namespace identifiers (UUID, NGUID) as written in configuration.

/// NVMe Base 2.0 §4.5: an NQN is at most 223 bytes of UTF-8.
pub const NQN_MAX_LEN: usize = 223;

/// The well-known discovery subsystem NQN (NVMe Base 2.0 §4.5); reserved, never a subsystem.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Why a string is not an NQN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NqnError {
    #[error("longer than {NQN_MAX_LEN} bytes ({0})")]
    TooLong(usize),
    #[error("contains control characters or whitespace")]
    BadCharacter,
    #[error("must start with \"nqn.yyyy-mm.\" (NVMe Base 2.0 §4.5)")]
    BadPrefix,
    #[error("month {0:?} is not 01..=12")]
    BadMonth(String),
    #[error("{0:?} is not a reverse domain name")]
    BadDomain(String),
    #[error("missing \":<identifier>\" after the domain")]
    MissingIdentifier,
    #[error("{0:?} is not a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")]
    BadUuid(String),
}

/// Why a string cannot be a subsystem name at all (as opposed to merely not being a
/// well-formed NQN, which nvmet accepts and nvmfd serves with a warning).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubsystemNameError {
    #[error("empty")]
    Empty,
    /// The Connect command's SUBNQN field holds 256 bytes, NUL-terminated, and NVMe Base 2.0
    /// §4.5 limits an NQN to 223 bytes; nvmet refuses longer names (NVMF_NQN_SIZE).
    #[error("longer than {NQN_MAX_LEN} bytes ({0})")]
    TooLong(usize),
    /// nvmet names subsystems by configfs directory, which cannot contain '/'.
    #[error("contains '/' (not a configfs directory name, so nvmet could not hold it either)")]
    Slash,
    /// A control character cannot be typed by a host (`nvme connect -n`) nor printed in a log.
    #[error("contains control characters")]
    ControlCharacter,
    #[error("reserved for the discovery subsystem")]
    Discovery,
}

/// The names nvmet accepts for a subsystem (a configfs directory under
/// `/sys/kernel/config/nvmet/subsystems`, at most 223 bytes, not the discovery NQN): anything
/// else is refused. Names that pass here but fail [`check_nqn`] (`testnqn`,
/// `blktests-subsystem-1`) are served; the caller warns about them.
pub fn check_subsystem_name(name: &str) -> Result<(), SubsystemNameError> {
    if name.is_empty() {
        return Err(SubsystemNameError::Empty);
    }
    if name.len() > NQN_MAX_LEN {
        return Err(SubsystemNameError::TooLong(name.len()));
    }
    if name.contains('/') {
        return Err(SubsystemNameError::Slash);
    }
    if name.chars().any(char::is_control) {
        return Err(SubsystemNameError::ControlCharacter);
    }
    if name == DISCOVERY_NQN {
        return Err(SubsystemNameError::Discovery);
    }
    Ok(())
}

/// Checks the two NQN forms of NVMe Base 2.0 §4.5:
/// `nqn.yyyy-mm.reverse.domain:identifier` and `nqn.2014-08.org.nvmexpress:uuid:<uuid>`.
pub fn check_nqn(nqn: &str) -> Result<(), NqnError> {
    if nqn.len() > NQN_MAX_LEN {
        return Err(NqnError::TooLong(nqn.len()));
    }
    if nqn.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(NqnError::BadCharacter);
    }
    let rest = nqn.strip_prefix("nqn.").ok_or(NqnError::BadPrefix)?;
    let date = rest.get(..7).ok_or(NqnError::BadPrefix)?;
    let date_ok = date.bytes().enumerate().all(|(i, b)| match i {
        4 => b == b'-',
        _ => b.is_ascii_digit(),
    });
    if !date_ok || rest.as_bytes().get(7) != Some(&b'.') {
        return Err(NqnError::BadPrefix);
    }
    let month = &date[5..7];
    if !matches!(month.parse::<u8>(), Ok(1..=12)) {
        return Err(NqnError::BadMonth(month.to_owned()));
    }
    let after_date = &rest[8..];
    let (domain, identifier) = after_date
        .split_once(':')
        .ok_or(NqnError::MissingIdentifier)?;
    let domain_ok = !domain.is_empty()
        && domain.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if !domain_ok {
        return Err(NqnError::BadDomain(domain.to_owned()));
    }
    if identifier.is_empty() {
        return Err(NqnError::MissingIdentifier);
    }
    if nqn.starts_with("nqn.2014-08.org.nvmexpress:uuid:") {
        let uuid = &identifier["uuid:".len()..];
        if parse_uuid(uuid).is_none() {
            return Err(NqnError::BadUuid(uuid.to_owned()));
        }
    }
    Ok(())
}

/// Parses a UUID in the canonical 8-4-4-4-12 hexadecimal form.
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = text.split('-').collect();
    let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    if lengths != [8, 4, 4, 4, 12] {
        return None;
    }
    parse_hex16(&groups.concat())
}

/// Parses an NGUID: 32 hexadecimal digits, or the UUID-like 8-4-4-4-12 form nvmetcli writes.
pub fn parse_nguid(text: &str) -> Option<[u8; 16]> {
    if text.contains('-') {
        parse_uuid(text)
    } else {
        parse_hex16(text)
    }
}

fn parse_hex16(hex: &str) -> Option<[u8; 16]> {
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_both_nqn_forms() {
        for ok in [
            "nqn.2026-12.dev.nvmfd:ram0",
            "nqn.2014-08.org.nvmexpress:uuid:2b8a5d3c-1f0e-4e8b-9c41-0d2f6a7b8c9d",
            "nqn.1988-11.com.dell:PowerSAN:01:20210225",
            "nqn.2016-06.io.spdk:cnode1",
        ] {
            assert_eq!(check_nqn(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn refuses_malformed_nqns_with_the_reason() {
        assert_eq!(check_nqn("testnqn"), Err(NqnError::BadPrefix));
        assert_eq!(check_nqn("nqn.26-12.dev.x:y"), Err(NqnError::BadPrefix));
        assert_eq!(
            check_nqn("nqn.2026-13.dev.x:y"),
            Err(NqnError::BadMonth("13".into()))
        );
        assert_eq!(
            check_nqn("nqn.2026-12.dev..x:y"),
            Err(NqnError::BadDomain("dev..x".into()))
        );
        assert_eq!(
            check_nqn("nqn.2026-12.dev.x"),
            Err(NqnError::MissingIdentifier)
        );
        assert_eq!(
            check_nqn("nqn.2026-12.dev.x:"),
            Err(NqnError::MissingIdentifier)
        );
        assert_eq!(
            check_nqn("nqn.2026-12.dev.x:a b"),
            Err(NqnError::BadCharacter)
        );
        assert_eq!(
            check_nqn("nqn.2014-08.org.nvmexpress:uuid:not-a-uuid"),
            Err(NqnError::BadUuid("not-a-uuid".into()))
        );
        let long = format!("nqn.2026-12.dev.nvmfd:{}", "x".repeat(NQN_MAX_LEN));
        assert_eq!(check_nqn(&long), Err(NqnError::TooLong(long.len())));
        let exactly_max = format!("nqn.2026-12.dev.nvmfd:{}", "x".repeat(NQN_MAX_LEN - 22));
        assert_eq!(exactly_max.len(), NQN_MAX_LEN);
        assert_eq!(check_nqn(&exactly_max), Ok(()));
    }

    #[test]
    fn subsystem_names_are_what_nvmet_accepts() {
        for ok in [
            "testnqn",
            "blktests-subsystem-1",
            "nqn.2026-12.dev.nvmfd:ram0",
            "name with spaces",
            "nqn.2026-13.dev.x:y",
        ] {
            assert_eq!(check_subsystem_name(ok), Ok(()), "{ok}");
        }
        let at_max = "x".repeat(NQN_MAX_LEN);
        assert_eq!(check_subsystem_name(&at_max), Ok(()));
        let too_long = "x".repeat(NQN_MAX_LEN + 1);
        assert_eq!(
            check_subsystem_name(&too_long),
            Err(SubsystemNameError::TooLong(NQN_MAX_LEN + 1))
        );
        assert_eq!(check_subsystem_name(""), Err(SubsystemNameError::Empty));
        assert_eq!(check_subsystem_name("a/b"), Err(SubsystemNameError::Slash));
        assert_eq!(
            check_subsystem_name("a\nb"),
            Err(SubsystemNameError::ControlCharacter)
        );
        assert_eq!(
            check_subsystem_name("a\u{7f}"),
            Err(SubsystemNameError::ControlCharacter)
        );
        assert_eq!(
            check_subsystem_name(DISCOVERY_NQN),
            Err(SubsystemNameError::Discovery)
        );
    }

    #[test]
    fn parses_uuids_and_nguids() {
        let uuid = parse_uuid("26ffc8ce-73b4-321d-9685-7d7a9872c460").unwrap();
        assert_eq!(uuid[0], 0x26);
        assert_eq!(uuid[15], 0x60);
        assert_eq!(parse_nguid("26ffc8ce73b4321d96857d7a9872c460"), Some(uuid));
        assert_eq!(
            parse_nguid("26ffc8ce-73b4-321d-9685-7d7a9872c460"),
            Some(uuid)
        );
        assert_eq!(parse_uuid("26ffc8ce73b4321d96857d7a9872c460"), None);
        assert_eq!(parse_uuid("26ffc8ce-73b4-321d-9685-7d7a9872c46g"), None);
        assert_eq!(parse_nguid("1234"), None);
    }
}
