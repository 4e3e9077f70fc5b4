//! PostgreSQL log sequence numbers.

use std::fmt;
use std::str::FromStr;

/// A PostgreSQL WAL position (`pg_lsn`), printed and parsed as PostgreSQL does (`16/B374D848`).
///
/// In change batches it appears as `_commit_lsn` BIGINT: the same 64-bit number, as `i64`
/// (positions stay far below 2^63 in practice; [`Lsn::to_i64`] saturates rather than wrap).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// `0/0`.
    pub const ZERO: Lsn = Lsn(0);

    /// The position as the `_commit_lsn` column stores it.
    pub fn to_i64(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }

    /// Back from a `_commit_lsn` value (negative values give `0/0`).
    pub fn from_i64(v: i64) -> Lsn {
        Lsn(u64::try_from(v).unwrap_or(0))
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// A string that is not `hex/hex`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "'{0}' is not an LSN (expected two hexadecimal numbers separated by '/', like 16/B374D848)"
)]
pub struct ParseLsnError(pub String);

impl FromStr for Lsn {
    type Err = ParseLsnError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseLsnError(s.to_string());
        let (hi, lo) = s.trim().split_once('/').ok_or_else(err)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn(((hi as u64) << 32) | lo as u64))
    }
}

impl From<pgwire_replication::Lsn> for Lsn {
    fn from(l: pgwire_replication::Lsn) -> Self {
        Lsn(l.as_u64())
    }
}

impl From<Lsn> for pgwire_replication::Lsn {
    fn from(l: Lsn) -> Self {
        pgwire_replication::Lsn::from_u64(l.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for s in ["0/0", "16/B374D848", "FFFFFFFF/FFFFFFFF", "0/167F878"] {
            let l: Lsn = s.parse().unwrap();
            assert_eq!(l.to_string(), s);
        }
        assert_eq!("1/0".parse::<Lsn>().unwrap(), Lsn(1 << 32));
        assert!("1-0".parse::<Lsn>().is_err());
        assert!("x/0".parse::<Lsn>().is_err());
        assert!("1/100000000".parse::<Lsn>().is_err());
    }
}
