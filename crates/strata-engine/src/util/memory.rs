//! The memory a run may use for its large work (a bulk load's sort, the events an ingestion
//! keeps for its flows): a limit given by the user (`--memory-limit 4GiB`,
//! `strata.memoryLimit`, `STRATA_MEMORY_LIMIT`), else a share of the machine's memory, as
//! DuckDB's `memory_limit` is.

/// The share of the machine's memory a run takes when no limit is given: an eighth (3 GiB
/// on a 24 GiB machine), at least [`MIN_DEFAULT`].
const DEFAULT_SHARE: u64 = 8;
const MIN_DEFAULT: u64 = 1 << 30;
/// Below this no sort can make progress: refused when given.
pub(crate) const MIN_LIMIT: u64 = 16 << 20;

/// The pipeline configuration key and environment variable that set the limit.
pub const CONFIG_KEY: &str = "strata.memoryLimit";
pub const ENV_VAR: &str = "STRATA_MEMORY_LIMIT";

/// Parses a size as people write it: `4GiB`, `4G`, `4gb`, `512MiB`, `512m`, `1.5GiB`,
/// `1073741824` (bytes). Binary units throughout (1 GB = 1 GiB, as DuckDB reads them).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| {
        format!("'{text}' is not a size (write it like 4GiB, 512MiB or 1073741824)")
    })?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "'{text}': unknown unit '{other}' (use KiB, MiB, GiB or TiB)"
            ))
        }
    };
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes < MIN_LIMIT as f64 {
        return Err(format!(
            "'{text}' is below the smallest memory limit strata can work in, {} MiB",
            MIN_LIMIT >> 20
        ));
    }
    Ok(bytes as u64)
}

/// `bytes` as a person reads it: `3.0 GiB`, `512 MiB`, `640 KiB`.
pub fn show_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b => format!("{} KiB", b >> 10),
    }
}

/// The machine's memory in bytes (Linux: `/proc/meminfo`), `None` where it cannot be read.
fn machine_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&info)
}

fn parse_meminfo(info: &str) -> Option<u64> {
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The limit when none is given: a share of the machine's memory.
pub fn default_limit() -> u64 {
    machine_memory()
        .map(|m| (m / DEFAULT_SHARE).max(MIN_DEFAULT))
        .unwrap_or(2 * MIN_DEFAULT)
}

/// The run's limit: the pipeline configuration's [`CONFIG_KEY`], else [`ENV_VAR`], else
/// [`default_limit`]. A value that does not parse is an error naming where it came from.
pub fn resolve(configuration: &std::collections::BTreeMap<String, String>) -> Result<u64, String> {
    if let Some(v) = configuration.get(CONFIG_KEY) {
        return parse_size(v).map_err(|e| format!("{CONFIG_KEY}: {e}"));
    }
    if let Ok(v) = std::env::var(ENV_VAR) {
        return parse_size(&v).map_err(|e| format!("{ENV_VAR}: {e}"));
    }
    Ok(default_limit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_people_write_them() {
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("4g"), Ok(4 << 30));
        assert_eq!(parse_size(" 512 MB "), Ok(512 << 20));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        assert!(parse_size("lots").unwrap_err().contains("not a size"));
        assert!(parse_size("4 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_size("1MiB").unwrap_err().contains("smallest"));
    }

    #[test]
    fn the_default_is_a_share_of_the_machine() {
        let info = "MemTotal:       24000000 kB\nMemFree: 1 kB\n";
        assert_eq!(parse_meminfo(info), Some(24_000_000 * 1024));
        assert!(parse_meminfo("nothing").is_none());
        assert!(default_limit() >= MIN_DEFAULT);
        assert_eq!(show_size(3 << 30), "3.0 GiB");
        assert_eq!(show_size(512 << 20), "512 MiB");
    }

    #[test]
    fn configuration_wins_and_bad_values_name_their_source() {
        let mut conf = std::collections::BTreeMap::new();
        conf.insert(CONFIG_KEY.to_string(), "64MiB".to_string());
        assert_eq!(resolve(&conf), Ok(64 << 20));
        conf.insert(CONFIG_KEY.to_string(), "big".to_string());
        assert!(resolve(&conf).unwrap_err().starts_with(CONFIG_KEY));
    }
}
