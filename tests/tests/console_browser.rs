//! The web console in a real headless Chromium: an operator finds a parked transaction in the
//! queue, opens it, resumes it with a reason, and sees it finish and the action in the
//! timeline; text from participants and operators containing HTML is shown as text.

use dtx_sdk::client::{TccBranch, TccOptions};
use dtx_tests::browser::Browser;
use dtx_tests::db::{TestBackend, TestDb, with_db};
use dtx_tests::net::free_addr;
use dtx_tests::participant::{Fault, payload};
use dtx_tests::world::{SCHEMAS, START, World};
use fantoccini::Locator;

/// The world with the console on a free port, and the console's URL.
async fn world_with_console<DB: TestBackend>(db: &'static TestDb<DB>) -> (World<DB>, String) {
    let addr = free_addr().await.to_string();
    let w = World::start(db, &["--admin-listen", &addr]).await;
    (w, format!("http://{addr}"))
}

/// Fills `reason` (and `operator`) into the action form `#form`, submits it, checks the
/// confirmation page repeats the reason, and confirms.
async fn act_through_the_form(browser: &Browser, form: &str, reason: &str, operator: &str) {
    let b = &browser.client;
    let form = b.find(Locator::Css(&format!("form#{form}"))).await.unwrap();
    for (field, value) in [("reason", reason), ("operator", operator)] {
        let input = form
            .find(Locator::Css(&format!("input[name={field}]")))
            .await
            .unwrap();
        input.send_keys(value).await.unwrap();
    }
    form.find(Locator::Css("button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(browser.text("#reason").await, reason);
    b.find(Locator::Css("#do"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

async fn an_operator_resumes_a_parked_transaction_from_the_queue<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let Some(browser) = Browser::start("console browser test").await else {
        return;
    };
    let (w, console) = world_with_console(db).await;
    w.park("order-42", "alice", Fault::Refuse).await;
    for i in 0..3 {
        let tx = w
            .client
            .begin(TccOptions {
                xid: Some(format!("order-{}", 43 + i)),
                ..TccOptions::default()
            })
            .await
            .unwrap();
        tx.call(TccBranch::new(&w.bank, "transfer", payload("bob", 1)).id("b1"))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    let b = &browser.client;

    // The queue lists it; it links to the transaction's page.
    b.goto(&console).await.unwrap();
    let queue = browser.text("#transactions").await;
    assert!(
        queue.contains("order-42") && queue.contains("NEEDS_ATTENTION"),
        "{queue}"
    );
    // The console's own script and style sheet ran under its Content-Security-Policy.
    let loaded = b
        .execute(
            "return [document.documentElement.dataset.refresh || 'not run', \
             getComputedStyle(document.body).fontSize]",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(loaded, serde_json::json!(["on", "14px"]));
    browser.screenshot("console-queue").await;
    b.goto(&format!("{console}/transactions")).await.unwrap();
    browser.screenshot("console-list").await;
    b.goto(&console).await.unwrap();
    b.find(Locator::Css("#transactions a.xid"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(browser.text("#xid").await, "order-42");
    let branches = browser.text("#branches").await;
    assert!(
        branches.contains("STUCK") && branches.contains("injected refusal"),
        "{branches}"
    );

    // Resume with a reason, through the confirmation step.
    act_through_the_form(&browser, "resume", "bank limit raised", "ops-anna").await;
    assert!(browser.text("#banner").await.contains("resume: done"));

    let page = format!("{console}/tx/order-42");
    browser.until_text(&page, "h2", "COMMITTED").await;
    let history = browser.until_text(&page, "#history", "STATUS").await;
    assert!(
        history.contains("OPERATOR") && history.contains("ops-anna: resume: bank limit raised"),
        "{history}"
    );
    browser.screenshot("console-transaction").await;
    assert_eq!(w.effects("order-42", "b1", "confirm").await, 1);
    assert_eq!(w.account("alice").await, (START - 10, 0));

    // Force rollback of a committed transaction is refused, and the page says why.
    b.goto(&page).await.unwrap();
    act_through_the_form(&browser, "rollback", "too late", "").await;
    let banner = browser.text("#banner").await;
    assert!(banner.contains("too late to roll back"), "{banner}");
    browser.close().await;
}

async fn html_from_participants_and_operators_is_shown_as_text<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let Some(browser) = Browser::start("console browser test").await else {
        return;
    };
    let (w, console) = world_with_console(db).await;
    let hostile = "<img src=x onerror=\"window.pwned=1\"><b id=injected>bold</b>";
    w.park("html-check", "alice", Fault::RefuseWith(hostile.into()))
        .await;
    let b = &browser.client;
    let page = format!("{console}/tx/html-check");
    b.goto(&page).await.unwrap();
    let shown = browser.text("#last-error").await;
    assert!(shown.contains(hostile), "shown as text: {shown}");
    assert!(
        b.find(Locator::Css("#injected")).await.is_err(),
        "no element injected"
    );

    // An operator's reason with a script in it, through the confirmation page and the history.
    let reason = "<script>window.pwned=2</script>fixed";
    act_through_the_form(&browser, "resume", reason, "").await;
    let history = browser.until_text(&page, "#history", reason).await;
    assert!(history.contains(hostile), "{history}");
    let pwned = b
        .execute("return window.pwned === undefined", vec![])
        .await
        .unwrap();
    assert_eq!(
        pwned,
        serde_json::Value::Bool(true),
        "no injected script ran"
    );
    browser.close().await;
}

/// One database is enough: the console reads through the same Admin calls on every store.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn console_in_chromium() {
    use dtx_sql::sqlx::Sqlite;
    with_db::<Sqlite, _, _>(
        SCHEMAS,
        an_operator_resumes_a_parked_transaction_from_the_queue,
    )
    .await;
    with_db::<Sqlite, _, _>(
        SCHEMAS,
        html_from_participants_and_operators_is_shown_as_text,
    )
    .await;
}
