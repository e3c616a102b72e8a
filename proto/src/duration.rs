//! Durations as operators type them: `500ms`, `30s`, `10m`, `2h`, `1d`.

use std::time::Duration;

/// Parses `<number><unit>` with unit `ms`, `s`, `m`, `h` or `d`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit: write e.g. 30s, 10m, 2h or 1d"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number"))?;
    let millis = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (ms, s, m, h, d)")),
    };
    n.checked_mul(millis)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// A duration flag's value: read by [`parse`], shown by [`exact`] (so a flag's default prints
/// as `15s`, not as a number of milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Human(pub Duration);

impl std::str::FromStr for Human {
    type Err = String;

    fn from_str(text: &str) -> Result<Human, String> {
        parse(text).map(Human)
    }
}

impl std::fmt::Display for Human {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&exact(self.0))
    }
}

/// The exact short form of a duration, which [`parse`] reads back: the largest unit that
/// divides it (`1500ms`, `90s`, `5m`, `7d`; `0s` for nothing).
pub fn exact(d: Duration) -> String {
    let ms = d.as_millis();
    let units = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    match units
        .iter()
        .find(|(size, _)| ms > 0 && ms.is_multiple_of(*size))
    {
        Some((size, unit)) => format!("{}{unit}", ms / size),
        None if ms == 0 => "0s".into(),
        None => format!("{ms}ms"),
    }
}

/// A short human form of a millisecond age: `850ms`, `42s`, `12m`, `5h`, `3d`.
pub fn human(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{}s", ms / 1_000),
        60_000..3_600_000 => format!("{}m", ms / 60_000),
        3_600_000..86_400_000 => format!("{}h", ms / 3_600_000),
        _ => format!("{}d", ms / 86_400_000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_errors() {
        assert_eq!(parse("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1d"), Ok(Duration::from_secs(86_400)));
        assert!(parse("10").unwrap_err().contains("no unit"));
        assert!(parse("10w").unwrap_err().contains("unknown unit"));
        assert!(parse("m").unwrap_err().contains("whole number"));
        assert_eq!(human(61_000), "1m");
        assert_eq!(human(999), "999ms");
        for (d, text) in [
            (1_500, "1500ms"),
            (90_000, "90s"),
            (300_000, "5m"),
            (0, "0s"),
        ] {
            assert_eq!(exact(Duration::from_millis(d)), text);
            assert_eq!(parse(text), Ok(Duration::from_millis(d)));
        }
        assert_eq!(exact(Duration::from_secs(7 * 86_400)), "7d");
    }
}
