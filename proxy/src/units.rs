//! Sizes and durations as people write them: `512MiB`, `8 MiB`, `4096`; `30s`, `250ms`, `1h`.
//!
//! Durations parse with `humantime`. Sizes keep a parser of their own: the `bytesize` crate's
//! `Display` rounds to one decimal (2^29 and 2^29 + 1 bytes both print `512.0 MiB`), so a
//! configuration printed by `--check-config` would not load back to the same values, and its
//! parser saturates on overflow instead of refusing the value.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A size in bytes, written as an integer or with a unit: `512MiB`, `8 MiB`, `1GB`, `4096`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (digits, unit) = s.split_at(split);
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("`{s}` is not a size (expected e.g. 512MiB)"))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1_000,
            "kib" => 1 << 10,
            "m" | "mb" => 1_000_000,
            "mib" => 1 << 20,
            "g" | "gb" => 1_000_000_000,
            "gib" => 1 << 30,
            "t" | "tb" => 1_000_000_000_000,
            "tib" => 1 << 40,
            other => return Err(format!("unknown size unit `{other}` in `{s}`")),
        };
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| format!("size `{s}` is too large"))
    }
}

impl fmt::Display for ByteSize {
    /// Exact: the largest binary unit that divides the size, else bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 4] = [
            (1 << 40, "TiB"),
            (1 << 30, "GiB"),
            (1 << 20, "MiB"),
            (1 << 10, "KiB"),
        ];
        for (mult, unit) in UNITS {
            if self.0 >= mult && self.0.is_multiple_of(mult) {
                return write!(f, "{}{unit}", self.0 / mult);
            }
        }
        write!(f, "{}", self.0)
    }
}

/// A duration written with a unit (`30s`, `5m`, `250ms`, `1h 30m`), or a bare number of
/// seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    /// `n` seconds.
    pub const fn secs(n: u64) -> Self {
        Self(Duration::from_secs(n))
    }
}

impl FromStr for HumanDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Ok(secs) = s.parse::<u64>() {
            return Ok(Self::secs(secs));
        }
        humantime::parse_duration(s)
            .map(Self)
            .map_err(|e| format!("`{s}` is not a duration (expected e.g. 30s, 250ms, 5m): {e}"))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_zero() {
            return f.write_str("0s");
        }
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

/// Both units print as text and read back from text or a bare integer (bytes, seconds).
macro_rules! text_or_int_serde {
    ($ty:ty, $from_int:expr) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                #[derive(Deserialize)]
                #[serde(untagged)]
                enum Raw {
                    Int(u64),
                    Text(String),
                }
                match Raw::deserialize(d)? {
                    Raw::Int(n) => Ok($from_int(n)),
                    Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
                }
            }
        }
    };
}

text_or_int_serde!(ByteSize, ByteSize);
text_or_int_serde!(HumanDuration, HumanDuration::secs);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizes_and_durations_parse() {
        assert_eq!("512MiB".parse::<ByteSize>().unwrap(), ByteSize(512 << 20));
        assert_eq!("8 MiB".parse::<ByteSize>().unwrap(), ByteSize(8 << 20));
        assert_eq!("1GB".parse::<ByteSize>().unwrap(), ByteSize(1_000_000_000));
        assert_eq!("4096".parse::<ByteSize>().unwrap(), ByteSize(4096));
        assert!("12 parsecs".parse::<ByteSize>().is_err());
        assert!("MiB".parse::<ByteSize>().is_err());
        assert!("99999999999TiB".parse::<ByteSize>().is_err());
        let secs = |s: &str| s.parse::<HumanDuration>().unwrap().0;
        assert_eq!(secs("30s"), Duration::from_secs(30));
        assert_eq!(secs("30"), Duration::from_secs(30));
        assert_eq!(secs("250ms"), Duration::from_millis(250));
        assert_eq!(secs("5m"), Duration::from_secs(300));
        assert_eq!(secs("1h 30m"), Duration::from_secs(5400));
        assert!("5 fortnights".parse::<HumanDuration>().is_err());
    }

    proptest! {
        #[test]
        fn sizes_and_durations_print_as_they_parse(n in 0u64..(1 << 50), ms in 0u64..(1 << 40)) {
            prop_assert_eq!(ByteSize(n).to_string().parse::<ByteSize>().unwrap(), ByteSize(n));
            let d = HumanDuration(Duration::from_millis(ms));
            prop_assert_eq!(d.to_string().parse::<HumanDuration>().unwrap(), d);
        }
    }
}
