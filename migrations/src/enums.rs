//! [`db_enum!`](crate::db_enum): Rust enums whose variants are stored as fixed strings.

/// Declares an enum whose variants are stored in the database as fixed strings, and the one
/// place those strings are spelled:
///
/// ```
/// dtx_sql::db_enum! {
///     /// How a thing ended.
///     pub enum Outcome { Success = "success", Failure = "failure" }
/// }
/// assert_eq!(Outcome::Success.as_str(), "success");
/// assert_eq!(Outcome::parse("failure"), Some(Outcome::Failure));
/// assert_eq!(Outcome::SPELLINGS, ["success", "failure"]);
/// assert_eq!(Outcome::ALL, [Outcome::Success, Outcome::Failure]);
/// assert_eq!(Outcome::Failure.to_string(), "failure");
/// ```
///
/// Generates the enum (`Debug, Clone, Copy, PartialEq, Eq, Hash`; more derives and docs go on
/// top), `as_str` (the stored spelling), `parse` (its inverse), `Display` (the spelling),
/// `ALL` (every variant) and `SPELLINGS` (every spelling, for
/// [`assert_literals_known`](crate::assert_literals_known)), both in declaration order. Two
/// variants with one spelling make `parse` unreachable for the second, which rustc warns about.
#[macro_export]
macro_rules! db_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vattr:meta])* $variant:ident = $text:literal),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name { $($(#[$vattr])* $variant),* }

        impl $name {
            /// Every variant, in declaration order.
            #[allow(dead_code)]
            pub const ALL: &'static [Self] = &[$($name::$variant),*];

            /// Every database spelling, in declaration order.
            #[allow(dead_code)]
            pub const SPELLINGS: &'static [&'static str] = &[$($text),*];

            /// The spelling stored in the database.
            #[allow(dead_code)]
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),* }
            }

            /// Parses the database spelling.
            #[allow(dead_code)]
            pub fn parse(text: &str) -> ::std::option::Option<Self> {
                match text {
                    $($text => ::std::option::Option::Some($name::$variant),)*
                    _ => ::std::option::Option::None,
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

#[cfg(test)]
mod tests {
    crate::db_enum! {
        /// A test enum.
        #[derive(Default)]
        enum Colour {
            #[default]
            Red = "red",
            /// Documented variant.
            DarkBlue = "DARK_BLUE",
        }
    }

    #[test]
    fn spellings_round_trip_in_declaration_order() {
        assert_eq!(Colour::ALL, [Colour::Red, Colour::DarkBlue]);
        assert_eq!(Colour::SPELLINGS, ["red", "DARK_BLUE"]);
        for (colour, text) in Colour::ALL.iter().zip(Colour::SPELLINGS) {
            assert_eq!(colour.as_str(), *text);
            assert_eq!(Colour::parse(text), Some(*colour));
            assert_eq!(colour.to_string(), *text);
        }
        assert_eq!(Colour::parse("Red"), None);
        assert_eq!(Colour::default(), Colour::Red);
    }
}
