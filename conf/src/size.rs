//! Byte sizes written as `4096`, `"512M"`, `"1G"` or `"1GiB"` (binary multiples only).

use std::fmt;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// A size in bytes. In TOML either an integer or a string with a binary suffix
/// (`K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB`; case-insensitive). Decimal units (`KB`, `MB`)
/// are refused rather than guessed: storage sizes off by 2.4 % are a classic source of
/// "namespace smaller than the image" bugs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

const SUFFIXES: [(&str, u32); 5] = [("", 0), ("k", 10), ("m", 20), ("g", 30), ("t", 40)];

/// Why a size string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("empty size")]
    Empty,
    #[error("{0:?} is not a number with an optional K/M/G/T (or KiB/MiB/GiB/TiB) suffix")]
    Malformed(String),
    #[error("{0:?} does not fit in 64 bits")]
    Overflow(String),
}

impl ByteSize {
    pub const fn bytes(self) -> u64 {
        self.0
    }

    pub fn parse(text: &str) -> Result<ByteSize, SizeError> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(SizeError::Empty);
        }
        let digits_end = trimmed
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(trimmed.len());
        let (digits, suffix) = trimmed.split_at(digits_end);
        if digits.is_empty() {
            return Err(SizeError::Malformed(text.to_owned()));
        }
        let suffix = suffix.trim_start().to_ascii_lowercase();
        // "K", "KiB" and a bare "B" for bytes; "KB" is refused (decimal or binary? ambiguous).
        let unit = match suffix.as_str() {
            "" | "b" => "",
            s if s.len() == 1 => s,
            s if s.len() == 3 && s.ends_with("ib") => &s[..1],
            _ => return Err(SizeError::Malformed(text.to_owned())),
        };
        let shift = SUFFIXES
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, shift)| *shift)
            .ok_or_else(|| SizeError::Malformed(text.to_owned()))?;
        let value: u64 = digits
            .parse()
            .map_err(|_| SizeError::Overflow(text.to_owned()))?;
        value
            .checked_mul(1u64 << shift)
            .map(ByteSize)
            .ok_or_else(|| SizeError::Overflow(text.to_owned()))
    }
}

impl fmt::Display for ByteSize {
    /// The largest suffix that represents the value exactly ("1G", "1536M", "4097").
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return write!(f, "0");
        }
        for (name, shift) in SUFFIXES.iter().rev() {
            let unit = 1u64 << shift;
            if self.0 % unit == 0 {
                return write!(f, "{}{}", self.0 / unit, name.to_ascii_uppercase());
            }
        }
        write!(f, "{}", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a size in bytes: an integer or a string like \"512M\", \"1G\", \"1GiB\"",
                )
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("{v}: a size cannot be negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_suffixed_sizes() {
        assert_eq!(ByteSize::parse("4096"), Ok(ByteSize(4096)));
        assert_eq!(ByteSize::parse("512M"), Ok(ByteSize(512 << 20)));
        assert_eq!(ByteSize::parse("1G"), Ok(ByteSize(1 << 30)));
        assert_eq!(ByteSize::parse("1GiB"), Ok(ByteSize(1 << 30)));
        assert_eq!(ByteSize::parse("1gib"), Ok(ByteSize(1 << 30)));
        assert_eq!(ByteSize::parse(" 8 k "), Ok(ByteSize(8192)));
        assert_eq!(ByteSize::parse("2T"), Ok(ByteSize(2 << 40)));
        assert_eq!(ByteSize::parse("100B"), Ok(ByteSize(100)));
    }

    #[test]
    fn refuses_malformed_ambiguous_and_overflowing_sizes() {
        assert_eq!(ByteSize::parse(""), Err(SizeError::Empty));
        for bad in ["G", "1.5G", "1KB", "1MB", "1X", "-1", "1 GiBs", "0x10"] {
            assert!(
                matches!(ByteSize::parse(bad), Err(SizeError::Malformed(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            ByteSize::parse("99999999999999999999"),
            Err(SizeError::Overflow(_))
        ));
        assert!(matches!(
            ByteSize::parse("17000000T"),
            Err(SizeError::Overflow(_))
        ));
    }

    #[test]
    fn displays_with_the_largest_exact_suffix_and_round_trips() {
        for (value, text) in [
            (0, "0"),
            (4097, "4097"),
            (4096, "4K"),
            (1 << 30, "1G"),
            (1536 << 20, "1536M"),
        ] {
            assert_eq!(ByteSize(value).to_string(), text);
            assert_eq!(ByteSize::parse(text), Ok(ByteSize(value)));
        }
    }
}
