//! The web console in a real headless Chromium: an operator finds a parked transaction in the
//! queue, opens it, resumes it with a reason, and sees it finish and the action in the
//! timeline; text from participants and operators containing HTML is shown as text.

use std::time::Duration;

use dtx_sdk::barrier::Action;
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

/// Begins `xid` with one transfer from alice as branch b1 whose Confirm meets `fault`, commits,
/// and waits until it is parked.
async fn parked<DB: TestBackend>(w: &World<DB>, xid: &str, fault: Fault) {
    w.faults.push("b1", Action::Confirm, [fault]);
    let tx = w
        .client
        .begin(TccOptions {
            xid: Some(xid.into()),
            ..TccOptions::default()
        })
        .await
        .unwrap();
    tx.call(TccBranch::new(&w.bank, "transfer", payload("alice", 10)).id("b1"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let t = w.client.wait(xid, Duration::from_secs(10)).await.unwrap();
    assert_eq!(t.status(), dtx_proto::v1::TxStatus::NeedsAttention);
}

async fn an_operator_resumes_a_parked_transaction_from_the_queue<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let Some(browser) = Browser::start("console browser test").await else {
        return;
    };
    let (w, console) = world_with_console(db).await;
    parked(&w, "order-42", Fault::Refuse).await;
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
    let form = b.find(Locator::Css("form#resume")).await.unwrap();
    form.find(Locator::Css("input[name=reason]"))
        .await
        .unwrap()
        .send_keys("bank limit raised")
        .await
        .unwrap();
    form.find(Locator::Css("input[name=operator]"))
        .await
        .unwrap()
        .send_keys("ops-anna")
        .await
        .unwrap();
    form.find(Locator::Css("button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(browser.text("#reason").await, "bank limit raised");
    b.find(Locator::Css("#do"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
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
    let form = b.find(Locator::Css("form#rollback")).await.unwrap();
    form.find(Locator::Css("input[name=reason]"))
        .await
        .unwrap()
        .send_keys("too late")
        .await
        .unwrap();
    form.find(Locator::Css("button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.find(Locator::Css("#do"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
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
    parked(&w, "html-check", Fault::RefuseWith(hostile.into())).await;
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
    let form = b.find(Locator::Css("form#resume")).await.unwrap();
    form.find(Locator::Css("input[name=reason]"))
        .await
        .unwrap()
        .send_keys(reason)
        .await
        .unwrap();
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

// One database is enough: the console reads through the same Admin calls on every store.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn console_resume_from_the_queue() {
    with_db::<dtx_sql::sqlx::Sqlite, _, _>(
        SCHEMAS,
        an_operator_resumes_a_parked_transaction_from_the_queue,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn console_shows_html_as_text() {
    with_db::<dtx_sql::sqlx::Sqlite, _, _>(
        SCHEMAS,
        html_from_participants_and_operators_is_shown_as_text,
    )
    .await;
}
