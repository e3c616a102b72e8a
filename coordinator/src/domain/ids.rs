//! Identifiers and tokens as their own types. An [`Xid`] or [`BranchId`] is made only by
//! checking its text where a request enters, or by reading it back from the coordinator's own
//! rows (checked when they were written), so code past the entry never checks again and cannot
//! pass a branch id where an xid belongs. A [`Fence`] is made only fresh or read back, never
//! from a caller.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

use dtx_proto::limits::{self, LimitError};

/// Text identifiers: checked on the way in, read as `&str` everywhere after.
macro_rules! text_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(String);

        impl $name {
            /// Text checked where it entered: a value of the coordinator's own rows, or of a
            /// plan that checked it.
            pub fn checked(text: String) -> $name {
                $name(text)
            }

            /// The text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        /// Quoted, as the text itself would be (messages say `xid "order-7"`).
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        /// Literal ids in unit tests.
        #[cfg(test)]
        impl From<&str> for $name {
            fn from(text: &str) -> $name {
                $name(text.to_string())
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

text_id!(
    /// A global transaction's id as the store keeps it: `tenant/xid` for a tenant other than
    /// the default one (see [`limits::check_scoped_xid`]).
    Xid
);

text_id!(
    /// A branch's id within its transaction (a TCC branch id, a saga step's name, a message's
    /// delivery name).
    BranchId
);

impl Xid {
    /// Checks a (tenant-scoped) xid from a request.
    pub fn parse(text: String) -> Result<Xid, LimitError> {
        limits::check_scoped_xid(&text)?;
        Ok(Xid(text))
    }

    /// A fresh xid for a caller that named none.
    pub fn generate() -> Xid {
        Xid(uuid::Uuid::new_v4().to_string())
    }
}

impl BranchId {
    /// Checks a branch id from a request; `field` names it in the error.
    pub fn parse(field: &str, text: String) -> Result<BranchId, LimitError> {
        limits::check_branch_id(field, &text)?;
        Ok(BranchId(text))
    }
}

/// A fencing token: the owner of a transaction writes only while the row still holds the
/// token it installed, so a driver that lost its lease cannot overwrite its successor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Fence(i64);

impl Fence {
    /// The token of a row no driver has claimed yet (a TCC transaction still trying, a
    /// prepared message).
    pub const UNCLAIMED: Fence = Fence(0);

    /// A fresh token (non-negative: it is stored as a signed BIGINT).
    pub fn fresh() -> Fence {
        Fence(rand::random::<i64>() & i64::MAX)
    }

    /// A token read back from the store.
    pub fn stored(value: i64) -> Fence {
        Fence(value)
    }

    /// The value the store keeps.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_checked_text_becomes_an_id() {
        assert!(Xid::parse("order-7".into()).is_ok());
        assert!(Xid::parse("acme/order-7".into()).is_ok());
        let error = Xid::parse("order 7".into()).unwrap_err();
        assert!(error.to_string().contains("xid"), "{error}");
        assert!(Xid::parse(String::new()).is_err());
        assert!(BranchId::parse("steps[0].name", "a/b".into()).is_err());
        assert_eq!(BranchId::parse("b", "b-1".into()).unwrap(), "b-1");
    }

    #[test]
    fn fresh_fences_are_non_negative_and_differ() {
        let (a, b) = (Fence::fresh(), Fence::fresh());
        assert!(a.get() >= 0 && b.get() >= 0);
        assert_ne!(a, b);
        assert_ne!(a, Fence::UNCLAIMED);
    }
}
