//! Byte sizes as people write them: `4096`, `512KiB`, `4M`, `1.5GiB`.
//! Units are binary whatever their spelling (`k`, `KiB` and `KB` are all
//! 1024), as every Sluice option means memory or file sizes.

/// Parses `4194304`, `4MiB`, `4M`, `512KiB`, `2GiB`, `1.5G` (binary units).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("not a byte size: {s:?}"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        "t" | "tib" | "tb" => 1 << 40,
        other => return Err(format!("unknown byte unit {other:?} in {s:?}")),
    };
    let bytes = number * scale as f64;
    // `u64::MAX as f64` rounds up to 2^64, which itself does not fit.
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(format!("byte size out of range: {s:?}"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_byte_sizes_with_binary_units() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_bytes("512k").unwrap(), 512 << 10);
        assert_eq!(parse_bytes("1.5G").unwrap(), 3 << 29);
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("").is_err());
    }

    #[test]
    fn two_to_the_64_and_more_are_out_of_range_not_saturated() {
        for s in [
            "18446744073709551616",
            "99999999999999999999",
            "16777216TiB",
        ] {
            let e = parse_bytes(s).unwrap_err();
            assert!(e.contains("out of range"), "{s}: {e}");
        }
        assert_eq!(parse_bytes("16777215TiB").unwrap(), 16777215 << 40);
    }
}
