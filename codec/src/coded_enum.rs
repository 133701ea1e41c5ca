/// A field-coded enum and its decoder: the variants and their codes are listed once. A code
/// is a literal or a constant of the field's type; the decoder is one `match` (a jump table on
/// the hot path, as the PDU type is).
#[macro_export]
macro_rules! coded_enum {
    ($(#[$meta:meta])* pub enum $name:ident: $repr:ident, $from:ident {
        $($(#[$vmeta:meta])* $variant:ident = $code:expr,)*
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr($repr)]
        pub enum $name {
            $($(#[$vmeta])* $variant = $code,)*
        }

        impl $name {
            // Named constants are patterns: one arm per code.
            #[allow(non_upper_case_globals)]
            pub fn $from(v: $repr) -> Option<Self> {
                $(
                    const $variant: $repr = $name::$variant as $repr;
                )*
                match v {
                    $($variant => Some(Self::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    const SEVEN: u16 = 7;

    crate::coded_enum! {
        /// Literal and constant codes.
        pub enum Sample: u16, from_u16 {
            One = 0x01,
            Seven = SEVEN,
        }
    }

    #[test]
    fn decodes_listed_codes_only() {
        assert_eq!(Sample::from_u16(1), Some(Sample::One));
        assert_eq!(Sample::from_u16(7), Some(Sample::Seven));
        assert_eq!(Sample::Seven as u16, 7);
        assert_eq!(Sample::from_u16(0), None);
        assert_eq!(Sample::from_u16(0x107), None);
    }
}
