//! Durations, thread counts, byte sizes and policy names: their one set of
//! limits and the checks that hold them.

use std::time::Duration;

use super::error::SettingError;
use crate::capacity::Policy;

/// The longest duration any setting takes: a day. A timeout, a grace, an
/// age or an interval past it is a mistake whatever the setting (and a
/// longer one overflows the deadlines of some clients).
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// The shortest rescan interval: a reconcile lists the whole directory.
pub const MIN_RESCAN_INTERVAL: Duration = Duration::from_millis(10);

/// The longest rescan interval: [`MAX_DURATION`].
pub const MAX_RESCAN_INTERVAL: Duration = MAX_DURATION;

/// The most I/O threads one tier or transfer pool starts: a thread count
/// is a caller's number, and each thread reserves a stack.
pub const MAX_IO_THREADS: usize = 1024;

/// The most groups one lookup probes at once.
pub const MAX_CONCURRENT_GROUPS: usize = 1 << 16;

/// The largest memory region a setting may ask kvtier to map (a staging
/// area, an offload region): 1 TiB.
pub const MAX_REGION_BYTES: u64 = 1 << 40;

/// A duration given in seconds: a finite number from 0 to a day
/// ([`MAX_DURATION`]).
pub fn seconds(setting: &str, value: f64) -> Result<Duration, SettingError> {
    // guard: H7-durations-are-not-negative
    if value.is_nan() || value < 0.0 {
        return Err(SettingError::new(
            setting,
            format!(
                "is {value}; it must be a number of seconds >= 0, at most {} (a day)",
                MAX_DURATION.as_secs()
            ),
        ));
    }
    // guard: P13-durations-bounded-with-clear-errors
    if value > MAX_DURATION.as_secs_f64() {
        return Err(SettingError::new(
            setting,
            format!(
                "is {value} seconds, too long: at most {} (a day)",
                MAX_DURATION.as_secs()
            ),
        ));
    }
    Ok(Duration::from_secs_f64(value))
}

/// A duration of at most a day ([`MAX_DURATION`]).
pub fn duration(setting: &str, value: Duration) -> Result<Duration, SettingError> {
    if value > MAX_DURATION {
        return Err(SettingError::new(
            setting,
            format!(
                "is {value:?}, too long: at most {} seconds (a day)",
                MAX_DURATION.as_secs()
            ),
        ));
    }
    Ok(value)
}

/// A rescan interval: from [`MIN_RESCAN_INTERVAL`] to
/// [`MAX_RESCAN_INTERVAL`].
pub fn rescan_interval(setting: &str, value: Duration) -> Result<Duration, SettingError> {
    if !(MIN_RESCAN_INTERVAL..=MAX_RESCAN_INTERVAL).contains(&value) {
        return Err(SettingError::new(
            setting,
            format!(
                "is {value:?}; it must be {MIN_RESCAN_INTERVAL:?} to {} seconds (a day)",
                MAX_RESCAN_INTERVAL.as_secs()
            ),
        ));
    }
    Ok(value)
}

/// A number of threads: 1 to [`MAX_IO_THREADS`].
pub fn thread_count(setting: &str, value: u64) -> Result<usize, SettingError> {
    match usize::try_from(value) {
        Ok(threads) if (1..=MAX_IO_THREADS).contains(&threads) => Ok(threads),
        _ => Err(SettingError::new(
            setting,
            format!("is {value}; it must be 1 to {MAX_IO_THREADS} threads"),
        )),
    }
}

/// One side's share of a pool's threads (loads or stores of vLLM's
/// transfers): 0 to [`MAX_IO_THREADS`]; the pool checks that the shares
/// add up to 1 to [`MAX_IO_THREADS`].
pub fn thread_share(setting: &str, value: u64) -> Result<usize, SettingError> {
    match usize::try_from(value) {
        Ok(threads) if threads <= MAX_IO_THREADS => Ok(threads),
        _ => Err(SettingError::new(
            setting,
            format!("is {value}; it must be 0 to {MAX_IO_THREADS} threads"),
        )),
    }
}

/// A number of lookup groups probed at once: 1 to [`MAX_CONCURRENT_GROUPS`].
pub fn group_count(setting: &str, value: u64) -> Result<usize, SettingError> {
    match usize::try_from(value) {
        Ok(groups) if (1..=MAX_CONCURRENT_GROUPS).contains(&groups) => Ok(groups),
        _ => Err(SettingError::new(
            setting,
            format!("is {value}; it must be 1 to {MAX_CONCURRENT_GROUPS} groups"),
        )),
    }
}

/// The bytes of a memory region: 1 to [`MAX_REGION_BYTES`].
pub fn region_bytes(setting: &str, value: u64) -> Result<u64, SettingError> {
    if !(1..=MAX_REGION_BYTES).contains(&value) {
        return Err(SettingError::new(
            setting,
            format!("is {value}; it must be 1 to {MAX_REGION_BYTES} bytes (1 TiB)"),
        ));
    }
    Ok(value)
}

/// An eviction policy by its name: `"lru"` or `"s3fifo"`, exactly (the
/// names [`Policy::name`] gives).
pub fn policy_named(setting: &str, name: &str) -> Result<Policy, SettingError> {
    Policy::from_name(name).ok_or_else(|| {
        SettingError::new(
            setting,
            format!("is {name:?}; it must be \"lru\" or \"s3fifo\""),
        )
    })
}

/// A byte size written as digits, then optionally a unit: `B`, or `K`,
/// `M`, `G` or `T` (powers of 1024) alone or followed by `B` or `iB`, in
/// any case, with at most one space between: `4096`, `64K`, `5GiB`,
/// `1 TB`. Nothing else: no sign, no fraction, no repeated unit, and no
/// more than 2^64 - 1 bytes.
pub fn parse_bytes(setting: &str, text: &str) -> Result<u64, SettingError> {
    let refuse = |why: &str| SettingError::new(setting, format!("is {text:?}; {why}"));
    let grammar = "a size is digits, then optionally B, or K, M, G or T (powers of 1024) alone or with B or iB";
    let trimmed = text.trim();
    if trimmed.starts_with('-') {
        return Err(refuse("a size is not negative"));
    }
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    if digits.is_empty() {
        return Err(refuse(grammar));
    }
    let unit = unit.strip_prefix(' ').unwrap_or(unit).to_ascii_uppercase();
    // guard: H8-sizes-parse-whole-units
    let shift = match unit.as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(refuse(grammar)),
    };
    let too_large = || refuse(&format!("at most {} bytes fit", u64::MAX));
    let number: u64 = digits.parse().map_err(|_| too_large())?;
    number.checked_mul(1u64 << shift).ok_or_else(too_large)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_whole_units_and_nothing_else() {
        for (text, bytes) in [
            ("0", 0),
            ("4096", 4096),
            ("7B", 7),
            ("64K", 64 << 10),
            ("64kb", 64 << 10),
            ("5GiB", 5 << 30),
            ("1 TB", 1 << 40),
            (" 3M ", 3 << 20),
            ("18446744073709551615", u64::MAX),
        ] {
            assert_eq!(parse_bytes("--capacity", text), Ok(bytes), "{text}");
        }
        for text in [
            "", "G", "5GIBIBIB", "5BBBB", "5 G B", "5  G", "1.5G", "+5", "5P", "0x10", "5G5",
        ] {
            let error = parse_bytes("--capacity", text).unwrap_err();
            assert!(error.to_string().starts_with("--capacity is"), "{error}");
            assert!(
                error.problem.contains("a size is digits"),
                "{text}: {error}"
            );
        }
        let error = parse_bytes("--capacity", "-1").unwrap_err();
        assert!(error.problem.contains("not negative"), "{error}");
        for text in [
            "18446744073709551616",
            "16777216T",
            "99999999999999999999999",
        ] {
            let error = parse_bytes("--capacity", text).unwrap_err();
            assert!(
                error.problem.contains("at most 18446744073709551615"),
                "{text}: {error}"
            );
        }
    }

    #[test]
    fn durations_threads_and_policies_hold_one_set_of_limits() {
        assert_eq!(seconds("t", 86_400.0), Ok(MAX_DURATION));
        assert_eq!(seconds("t", 0.0), Ok(Duration::ZERO));
        for bad in [f64::NAN, -1.0, 86_400.5, f64::INFINITY, 1e20] {
            let error = seconds("lookup_timeout", bad).unwrap_err();
            assert_eq!(error.setting, "lookup_timeout", "{bad}");
        }
        assert!(duration("d", MAX_DURATION + Duration::from_nanos(1)).is_err());
        assert!(rescan_interval("r", Duration::from_millis(9)).is_err());
        assert!(rescan_interval("r", MAX_DURATION).is_ok());
        assert_eq!(thread_count("n", 1), Ok(1));
        assert_eq!(thread_count("n", 1024), Ok(1024));
        for bad in [0, 1025, u64::MAX] {
            assert!(thread_count("n", bad).is_err(), "{bad}");
        }
        assert_eq!(policy_named("p", "lru"), Ok(Policy::Lru));
        assert_eq!(policy_named("p", "s3fifo"), Ok(Policy::S3Fifo));
        for bad in ["LRU", "S3-FIFO", "s3-fifo", "", "fifo"] {
            let error = policy_named("eviction_policy", bad).unwrap_err();
            assert!(error.problem.contains("\"lru\" or \"s3fifo\""), "{error}");
        }
    }
}
