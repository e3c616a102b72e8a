//! Running a local transaction again after it lost a lock conflict - the one loop the
//! participant server and the idempotency records share.

use std::future::Future;
use std::time::Duration;

/// An error that may be a lost lock conflict (see [`crate::is_lock_conflict`]).
pub trait LockConflict {
    /// The database error inside, if this is one.
    fn database_error(&self) -> Option<&sqlx::Error>;

    /// A deadlock victim, a lock wait timeout or SQLite busy: running again may succeed.
    fn is_lock_conflict(&self) -> bool {
        self.database_error().is_some_and(crate::is_lock_conflict)
    }
}

impl LockConflict for sqlx::Error {
    fn database_error(&self) -> Option<&sqlx::Error> {
        Some(self)
    }
}

/// Runs `attempt`, and again while it fails with a lost lock conflict, at most `retries` more
/// times, waiting `delay(n)` before the n-th rerun (counted from 0). `on_rerun(n, error)` is
/// told of each rerun (for metrics and logs). Any other outcome is returned as it is.
pub async fn rerun_lock_conflicts<T, E, F, Fut>(
    retries: u32,
    delay: impl Fn(u32) -> Duration,
    mut on_rerun: impl FnMut(u32, &E),
    mut attempt: F,
) -> Result<T, E>
where
    E: LockConflict,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut reruns = 0;
    loop {
        match attempt().await {
            Err(e) if reruns < retries && e.is_lock_conflict() => {
                on_rerun(reruns + 1, &e);
                tokio::time::sleep(delay(reruns)).await;
                reruns += 1;
            }
            outcome => return outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[derive(Debug)]
    enum Failure {
        Conflict(sqlx::Error),
        Other,
    }

    impl LockConflict for Failure {
        fn database_error(&self) -> Option<&sqlx::Error> {
            match self {
                Failure::Conflict(e) => Some(e),
                Failure::Other => None,
            }
        }
    }

    /// What SQLite says when the database is busy (code 5).
    fn busy() -> sqlx::Error {
        #[derive(Debug)]
        struct Busy;
        impl std::fmt::Display for Busy {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("database is locked")
            }
        }
        impl std::error::Error for Busy {}
        impl sqlx::error::DatabaseError for Busy {
            fn message(&self) -> &str {
                "database is locked"
            }
            fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
                Some("5".into())
            }
            fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
                self
            }
            fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
                self
            }
            fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
                self
            }
            fn kind(&self) -> sqlx::error::ErrorKind {
                sqlx::error::ErrorKind::Other
            }
        }
        sqlx::Error::Database(Box::new(Busy))
    }

    #[tokio::test]
    async fn lock_conflicts_run_again_up_to_the_limit_and_nothing_else_does() {
        let (runs, told) = (AtomicU32::new(0), AtomicU32::new(0));
        let always_busy = rerun_lock_conflicts(
            3,
            |_| Duration::ZERO,
            |n, _: &Failure| assert_eq!(told.fetch_add(1, Ordering::SeqCst) + 1, n),
            || async {
                runs.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(Failure::Conflict(busy()))
            },
        )
        .await;
        assert!(matches!(always_busy, Err(Failure::Conflict(_))));
        assert_eq!(
            (runs.load(Ordering::SeqCst), told.load(Ordering::SeqCst)),
            (4, 3)
        );

        runs.store(0, Ordering::SeqCst);
        let other = rerun_lock_conflicts(
            3,
            |_| Duration::ZERO,
            |_, _| {},
            || async {
                runs.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(Failure::Other)
            },
        )
        .await;
        assert!(matches!(other, Err(Failure::Other)));
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "only lock conflicts run again"
        );

        runs.store(0, Ordering::SeqCst);
        let second_time = rerun_lock_conflicts(
            3,
            |_| Duration::ZERO,
            |_, _| {},
            || async {
                match runs.fetch_add(1, Ordering::SeqCst) {
                    0 => Err(Failure::Conflict(busy())),
                    _ => Ok(7),
                }
            },
        )
        .await;
        assert_eq!(second_time.unwrap(), 7);
    }
}
