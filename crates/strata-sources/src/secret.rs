//! Passwords that never print.

use std::fmt;

/// A password. `Debug` and `Display` print `***`; the value is reachable only through
/// [`Secret::expose`], which this crate calls only to hand it to the database driver.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wrap a password (for example one the engine read from an environment variable).
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The password itself. Give it to a connection, nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of the password replaced by `***` (used on driver error
    /// messages before they go into a [`crate::SourceError`]). Passwords shorter than 4
    /// characters are not searched for (they would blank out ordinary words); such a password
    /// is not echoed by the drivers either.
    pub fn scrub(&self, text: &str) -> String {
        if self.0.len() < 4 {
            return text.to_string();
        }
        text.replace(&self.0, "***")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret(s)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Secret(s.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints() {
        let s = Secret::new("hunter2-long");
        assert_eq!(format!("{s}"), "***");
        assert_eq!(format!("{s:?}"), "***");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some(***)");
        assert_eq!(
            s.scrub("auth failed for hunter2-long!"),
            "auth failed for ***!"
        );
        assert_eq!(s.expose(), "hunter2-long");
    }
}
