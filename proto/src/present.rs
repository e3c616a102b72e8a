//! How the contract's values read to people (the `dtx` CLI and the web console): enum names
//! without their prefix, epoch milliseconds as UTC times.

/// Longest text kept of a participant's (or a peer's) error, in bytes: what reaches the log,
/// the history, the alerts and the console.
pub const MAX_REASON_BYTES: usize = 512;

/// A participant's error text as it may be stored and shown: control characters escaped (no
/// forged log lines or terminal escapes), cut at [`MAX_REASON_BYTES`] on a character boundary
/// with the cut marked. A participant's words are data, never markup or log structure.
pub fn reason(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_REASON_BYTES + 16));
    for (at, c) in text.char_indices() {
        if out.len() >= MAX_REASON_BYTES {
            out.push_str(&format!(" ... [{} more bytes cut]", text.len() - at));
            return out;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// An enum value's name without its prefix: `TX_STATUS_COMMITTED` -> `COMMITTED`.
pub fn short(name: &str, prefix: &str) -> String {
    name.trim_start_matches(prefix).to_string()
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS.mmm` (UTC); `-` for 0 or less.
pub fn utc(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    let (days, rest) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03}",
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1_000 % 60,
        rest % 1_000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_calendar_dates() {
        assert_eq!(utc(0), "-");
        assert_eq!(utc(1), "1970-01-01 00:00:00.001");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00.000");
        assert_eq!(utc(1_796_320_401_213), "2026-12-03 17:53:21.213");
    }

    #[test]
    fn reasons_are_one_line_of_bounded_text() {
        assert_eq!(reason("no funds"), "no funds");
        assert_eq!(
            reason("ok\nlevel=ERROR forged\x1b[31m"),
            "ok\\nlevel=ERROR forged\\u{1b}[31m"
        );
        let long = "é".repeat(400);
        let cut = reason(&long);
        assert!(cut.len() < MAX_REASON_BYTES + 32, "{}", cut.len());
        assert!(cut.ends_with(" ... [288 more bytes cut]"), "{cut}");
    }

    #[test]
    fn short_names() {
        assert_eq!(
            short("TX_STATUS_NEEDS_ATTENTION", "TX_STATUS_"),
            "NEEDS_ATTENTION"
        );
    }
}
