//! The string enums' one macro: a name per variant, `as_str`, `Display` and `FromStr`.

/// Implements `as_str` (documented with `$doc`), `Display` and `FromStr` for a field-less
/// enum from its variants' names; `$unknown` builds the error for a name that is none of
/// them, from the name given and the valid ones joined by `, `.
macro_rules! string_enum {
    ($doc:literal, $t:ident { $($v:ident => $s:literal),* $(,)? }, |$other:ident, $valid:ident| $unknown:expr) => {
        impl $t {
            #[doc = $doc]
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$v => $s),* }
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($s => Ok(Self::$v),)*
                    $other => {
                        let $valid = [$($s),*].join(", ");
                        Err($unknown)
                    }
                }
            }
        }
    };
}
