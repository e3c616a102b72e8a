//! Checking the string literals spelled in SQL text against the enums that own them.

/// The single-quoted literals of `sql`, without their quotes, in order (a doubled `''` inside
/// one stays doubled). Skips `--` and `/* */` comments; an unterminated literal runs to the end.
pub fn sql_literals(sql: &str) -> Vec<&str> {
    let bytes = sql.as_bytes();
    let mut literals = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' => {
                let start = i + 1;
                let mut j = start;
                loop {
                    match bytes.get(j) {
                        None => {
                            literals.push(&sql[start..]);
                            return literals;
                        }
                        Some(b'\'') if bytes.get(j + 1) == Some(&b'\'') => j += 2,
                        Some(b'\'') => break,
                        Some(_) => j += 1,
                    }
                }
                literals.push(&sql[start..j]);
                i = j + 1;
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                i = sql[i..].find('\n').map_or(bytes.len(), |n| i + n + 1);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = sql[i + 2..]
                    .find("*/")
                    .map_or(bytes.len(), |n| i + 2 + n + 2);
            }
            _ => i += 1,
        }
    }
    literals
}

/// Panics, naming the statement and the literal, if a literal in one of `statements` is none
/// of `spellings` (typically `[Status::SPELLINGS, Kind::SPELLINGS, ...]` of
/// [`db_enum!`](crate::db_enum)s). For a test that lists a store's statement consts: a status
/// spelled in SQL text can then not drift from its enum.
#[track_caller]
pub fn assert_literals_known(statements: &[&str], spellings: &[&[&str]]) {
    for statement in statements {
        for literal in sql_literals(statement) {
            if !spellings.iter().any(|known| known.contains(&literal)) {
                panic!(
                    "SQL literal '{literal}' is no enum's spelling (known: {spellings:?}) in:\n{statement}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_found_outside_comments() {
        assert_eq!(
            sql_literals(
                "UPDATE t SET s = 'DONE' -- it's done\n WHERE s IN ('A', 'B''C') /* 'x' */ AND n = ''"
            ),
            ["DONE", "A", "B''C", ""]
        );
        assert_eq!(sql_literals("SELECT 1"), Vec::<&str>::new());
        assert_eq!(sql_literals("SELECT 'open"), ["open"]);
        assert_eq!(sql_literals("SELECT 'a' /* open"), ["a"]);
    }

    #[test]
    fn known_literals_pass() {
        assert_literals_known(
            &["UPDATE t SET s = 'DONE' WHERE k = 'tcc'", "SELECT 1"],
            &[&["PENDING", "DONE"], &["tcc", "saga"]],
        );
    }

    #[test]
    fn an_unknown_literal_names_itself_and_its_statement() {
        let caught = std::panic::catch_unwind(|| {
            assert_literals_known(
                &["SELECT 1", "UPDATE t SET s = 'DONE' WHERE s = 'PENDNG'"],
                &[&["PENDING", "DONE"]],
            )
        })
        .expect_err("an unknown literal must panic");
        let message = caught
            .downcast_ref::<String>()
            .expect("a formatted panic message");
        assert!(message.contains("'PENDNG'"), "{message}");
        assert!(
            message.contains("UPDATE t SET s = 'DONE' WHERE s = 'PENDNG'"),
            "{message}"
        );
    }
}
