/// A field-coded enum and its decoder: the variants and their codes are listed once.
#[macro_export]
macro_rules! coded_enum {
    ($(#[$meta:meta])* pub enum $name:ident: $repr:ty, $from:ident {
        $($(#[$vmeta:meta])* $variant:ident = $code:literal,)*
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vmeta])* $variant = $code,)*
        }

        impl $name {
            pub fn $from(v: $repr) -> Option<Self> {
                match v {
                    $($code => Some(Self::$variant),)*
                    _ => None,
                }
            }
        }
    };
}
