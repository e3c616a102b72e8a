//! The web console in a real headless Chromium: an operator finds a parked transaction in the
//! queue, opens it, resumes it with a reason, and sees it finish and the action in the
//! timeline; text from participants and operators containing HTML is shown as text.

use std::time::Duration;

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

/// Types `fields` into the inputs of the form `#form` and submits it.
async fn submit(browser: &Browser, form: &str, fields: &[(&str, &str)]) {
    let b = &browser.client;
    // Waited for like every other element the tests read (see `Browser::text`); the page says
    // why when it never comes.
    let css = format!("form#{form}");
    let waited = b.wait().at_most(Duration::from_secs(10));
    let form = match waited.for_element(Locator::Css(&css)).await {
        Ok(form) => form,
        Err(e) => {
            let page = b.source().await.unwrap_or_default();
            panic!("{css}: {e}; the page: {}", &page[..page.len().min(4000)]);
        }
    };
    for (field, value) in fields {
        let input = form
            .find(Locator::Css(&format!("input[name={field}]")))
            .await
            .unwrap();
        input.send_keys(value).await.unwrap();
    }
    let button = form.find(Locator::Css("button")).await.unwrap();
    browser.click_and_load(button).await;
}

/// Fills `reason` (and `operator`) into the action form `#form`, submits it, checks the
/// confirmation page repeats the reason, and confirms.
async fn act_through_the_form(browser: &Browser, form: &str, reason: &str, operator: &str) {
    let b = &browser.client;
    submit(browser, form, &[("reason", reason), ("operator", operator)]).await;
    assert_eq!(browser.text("#reason").await, reason);
    browser
        .click_and_load(b.find(Locator::Css("#do")).await.unwrap())
        .await;
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
    let link = b.find(Locator::Css("#transactions a.xid")).await.unwrap();
    browser.click_and_load(link).await;
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

/// With auth on: the console sends a browser without a session to `/login`; a reader's token
/// signs in (an `HttpOnly`, `SameSite=Strict` session cookie, the token kept server-side) and
/// sees its tenant's parked transaction but may not act; an operator's token acts, and the
/// history names the token's subject, not a typed-in name; another tenant sees nothing.
async fn signing_in_with_a_token(db: &'static TestDb<dtx_sql::sqlx::Sqlite>) {
    let Some(browser) = Browser::start("console sign-in test").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let keys = dtx_tests::auth::AuthKeys::new(dir.path());
    let operator = keys.opaque("ops-olga", "acme", &["operator"]);
    let reader = keys.jwt("rita", "acme", &["reader"]);
    let stranger = keys.jwt("gus", "globex", &["operator"]);
    let (faults, bank) = dtx_tests::world::bank(db).await;
    let addr = free_addr().await.to_string();
    let mut flags = keys.flags();
    flags.extend(["--admin-listen".into(), addr.clone()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let coordinator = dtx_tests::coordinator::InProcess::start(&db.url, &flags).await;
    let acme = coordinator
        .client()
        .await
        .with_token(&keys.jwt("orders", "acme", &["initiator"]))
        .unwrap();
    let parked = dtx_tests::world::park(
        &acme,
        &bank.url(),
        &faults,
        "order-77",
        "alice",
        Fault::Refuse,
    )
    .await;
    assert_eq!(parked.status(), dtx_proto::v1::TxStatus::NeedsAttention);
    let console = format!("http://{addr}");

    // The cookie, seen from a plain HTTP client.
    let answer = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{console}/login"))
        .header("origin", &console)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={reader}"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 303);
    let cookie = answer.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains(&reader),
        "the cookie carries the token: {cookie}"
    );

    let b = &browser.client;
    let (br, console) = (&browser, console.as_str());
    let sign_in = |token: String| async move {
        b.goto(&format!("{console}/")).await.unwrap();
        assert_eq!(br.text("h2").await, "Sign in");
        submit(br, "login", &[("token", &token)]).await;
    };
    let sign_out = || submit(br, "logout", &[]);

    // A bad token stays on the sign-in page, saying why.
    sign_in("dtx_wrong".into()).await;
    assert!(
        browser
            .text("#banner")
            .await
            .contains("unknown bearer token")
    );

    // The reader sees the queue, not the actions.
    sign_in(reader).await;
    let queue = browser.text("#transactions").await;
    assert!(queue.contains("order-77"), "{queue}");
    b.goto(&format!("{console}/tx/order-77")).await.unwrap();
    // Refused before the confirmation step.
    submit(&browser, "resume", &[("reason", "limit raised")]).await;
    let refused = browser.text("#banner").await;
    assert!(refused.contains("needs the role operator"), "{refused}");
    sign_out().await;

    // Another tenant's operator does not see it at all.
    sign_in(stranger).await;
    assert!(!browser.text("main").await.contains("order-77"));
    b.goto(&format!("{console}/tx/order-77")).await.unwrap();
    assert!(browser.text("#banner").await.contains("no transaction"));
    sign_out().await;

    // The operator resumes it; the history names the token's subject.
    sign_in(operator).await;
    b.goto(&format!("{console}/tx/order-77")).await.unwrap();
    act_through_the_form(&browser, "resume", "limit raised", "someone-else").await;
    let page = format!("{console}/tx/order-77");
    let history = browser.until_text(&page, "#history", "OPERATOR").await;
    assert!(
        history.contains("ops-olga: resume: limit raised"),
        "{history}"
    );
    assert!(!history.contains("someone-else"), "{history}");
    sign_out().await;
    assert_eq!(browser.text("h2").await, "Sign in");
    browser.close().await;
    coordinator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn console_sign_in_in_chromium() {
    with_db::<dtx_sql::sqlx::Sqlite, _, _>(SCHEMAS, signing_in_with_a_token).await;
}
