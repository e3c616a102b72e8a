//! Database work that outlives the request that started it.
//!
//! A server drops a handler's future where it stands when the caller goes away (a deadline, a
//! reset HTTP/2 stream, a closed browser tab). Dropped between sending a query and reading the
//! last byte of its answer, an sqlx MySQL/MariaDB connection is left out of step with the server:
//! it goes back to the pool and its next user waits forever for an answer that never comes. A
//! few such drops and every connection of the pool hangs. Running the conversation on a task of
//! its own makes it finish (commit or roll back) whatever the caller does.

use std::future::Future;

/// Runs `work` on a task of its own and waits for it. If the caller's future is dropped, `work`
/// still runs to its end; its output is then discarded. A panic in `work` is resumed here.
pub async fn detached<F>(work: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match tokio::spawn(work).await {
        Ok(output) => output,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Only a runtime shutting down cancels the task; nobody is left to answer.
        Err(e) => panic!("detached database work cancelled: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn work_finishes_after_its_caller_went_away() {
        let finished = Arc::new(AtomicBool::new(false));
        let flag = finished.clone();
        let caller = detached(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            flag.store(true, Ordering::SeqCst);
        });
        // The caller gives up long before the work ends.
        assert!(
            tokio::time::timeout(Duration::from_millis(5), caller)
                .await
                .is_err()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(finished.load(Ordering::SeqCst), "the work was cut short");
    }

    #[tokio::test]
    #[should_panic(expected = "boom")]
    async fn a_panic_reaches_the_caller() {
        detached(async { panic!("boom") }).await
    }
}
