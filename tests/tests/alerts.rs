//! Alert webhooks against a real HTTP receiver, on every database: parked, stuck and
//! failing-branch events, signed; one event per parked transaction even when the coordinator
//! process is SIGKILLed between the park and the delivery; a receiver that is down for a while
//! gets the events once it is back.

use std::collections::BTreeSet;
use std::time::Duration;

use dtx_coordinator::domain::alert::verify;
use dtx_proto::v1::TxStatus;
use dtx_sdk::barrier::Action;
use dtx_sdk::client::{TccBranch, TccOptions};
use dtx_tests::coordinator::Process;
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::participant::{Fault, payload};
use dtx_tests::test_on_all_databases;
use dtx_tests::webhook::{Receiver, url_of};
use dtx_tests::world::{SCHEMAS, World, bank, park};

const BIN: &str = env!("CARGO_BIN_EXE_test-coordinator");
const SECRET: &str = "alert-test-secret";

/// Exactly one distinct event id for each of `xids`, and for no other transaction.
fn one_id_each(receiver: &Receiver, kind: &str, xids: &[&str]) {
    let by_xid = receiver.ids_by_xid(kind);
    let got: BTreeSet<&str> = by_xid.keys().map(String::as_str).collect();
    assert_eq!(got, xids.iter().copied().collect(), "{kind} events");
    for (xid, ids) in by_xid {
        assert_eq!(ids.len(), 1, "{xid}: one event id, got {ids:?}");
    }
}

/// A parked TCC, a branch that keeps giving no answer and an undecided TCC left open: each
/// raises its event, signed with the secret (and only with it), linking to the console.
async fn parked_stuck_and_failing_transactions_raise_signed_events<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let receiver = Receiver::start().await;
    let w = World::start(
        db,
        &[
            "--alert-webhook",
            &receiver.url,
            "--alert-secret",
            SECRET,
            "--alert-attempts",
            "2",
            "--alert-stuck-after",
            "1s",
            "--alert-console-url",
            "http://console.example:8070",
        ],
    )
    .await;
    let parked = w
        .park(
            "parked-1",
            "alice",
            Fault::RefuseWith("account closed".into()),
        )
        .await;
    assert_eq!(parked.status(), TxStatus::NeedsAttention);

    // Confirm of b1 gives no answer three times, then succeeds: attempts 1-3 failed.
    w.faults
        .push("b1", Action::Confirm, vec![Fault::UnavailableAfter; 3]);
    let options = TccOptions {
        xid: Some("flaky-1".into()),
        ..TccOptions::default()
    };
    let tx = w.client.begin(options).await.unwrap();
    tx.call(TccBranch::new(&w.bank, "transfer", payload("bob", 10)).id("b1"))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // Begun (with its Try) and a long timeout, never decided: open, so stuck after a second.
    let open = TccOptions {
        xid: Some("open-1".into()),
        timeout: Duration::from_secs(120),
        ..TccOptions::default()
    };
    let open = w.client.begin(open).await.unwrap();
    open.call(TccBranch::new(&w.bank, "transfer", payload("carol", 10)).id("b1"))
        .await
        .unwrap();

    let received = receiver
        .until(Duration::from_secs(15), |r| {
            let has = |t: &str, xid: &str| {
                r.iter()
                    .any(|e| e.event["type"] == t && e.event["xid"] == xid)
            };
            has("transaction.parked", "parked-1")
                && has("branch.attempts", "flaky-1")
                && has("transaction.stuck", "open-1")
        })
        .await;
    let done = w
        .client
        .wait("flaky-1", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(done.status(), TxStatus::Committed);

    for r in &received {
        assert_eq!(
            r.event["id"],
            r.id.as_str(),
            "the header carries the body's id"
        );
        let signature = r.signature.as_deref().expect("signed");
        assert!(verify(SECRET.as_bytes(), signature, &r.body), "{r:?}");
        assert!(
            !verify(b"another secret", signature, &r.body),
            "a wrong secret fails"
        );
        assert!(!verify(
            SECRET.as_bytes(),
            signature,
            &r.body.replace("1", "2")
        ));
    }
    let event = |t: &str| {
        received
            .iter()
            .find(|r| r.event["type"] == t)
            .unwrap()
            .event
            .clone()
    };
    let parked = event("transaction.parked");
    assert_eq!(parked["xid"], "parked-1");
    assert_eq!(parked["status"], "NEEDS_ATTENTION");
    assert_eq!(parked["kind"], "tcc");
    assert!(
        parked["reason"]
            .as_str()
            .unwrap()
            .contains("account closed"),
        "{parked}"
    );
    assert_eq!(
        parked["console_url"],
        "http://console.example:8070/tx/parked-1"
    );
    let attempts = event("branch.attempts");
    assert_eq!(
        (attempts["branch_id"].clone(), attempts["attempt"].clone()),
        ("b1".into(), 3.into())
    );
    let stuck = event("transaction.stuck");
    assert_eq!(stuck["status"], "TRYING");

    // Give the scan and the driver time to raise them again, had they a hole: they must not.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    one_id_each(&receiver, "transaction.parked", &["parked-1"]);
    one_id_each(&receiver, "branch.attempts", &["flaky-1"]);
    assert!(receiver.ids_by_xid("transaction.stuck")["open-1"].len() == 1);
}
test_on_all_databases!(
    parked_stuck_and_failing_transactions_raise_signed_events,
    SCHEMAS
);

/// The coordinator parks three transactions, stores their alerts and starts delivering them to
/// a receiver that takes the requests and never answers; SIGKILL. A new process on the same
/// database delivers each, under the same event id.
async fn an_alert_survives_a_kill_between_the_park_and_its_delivery<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let receiver = Receiver::start().await;
    receiver.hang(true);
    let flags = [
        "--alert-webhook",
        &receiver.url,
        "--alert-secret",
        SECRET,
        "--alert-timeout",
        "2s",
    ];
    let (faults, bank) = bank(db).await;
    let first = Process::start(BIN, &db.url, &flags).await;
    let client = first.client().await;
    let xids = ["kill-1", "kill-2", "kill-3"];
    for xid in xids {
        let parked = park(&client, &bank.url(), &faults, xid, "alice", Fault::Refuse).await;
        assert_eq!(parked.status(), TxStatus::NeedsAttention);
    }
    // Every alert is in flight to the hanging receiver: kill the sender now.
    receiver
        .until(Duration::from_secs(10), |r| {
            xids.iter().all(|x| r.iter().any(|e| e.event["xid"] == *x))
        })
        .await;
    first.kill().await;
    let in_flight = receiver.received().len();
    receiver.hang(false);

    let _second = Process::start(BIN, &db.url, &flags).await;
    receiver
        .until(Duration::from_secs(15), |r| {
            xids.iter()
                .all(|x| r[in_flight..].iter().any(|e| e.event["xid"] == *x))
        })
        .await;
    one_id_each(&receiver, "transaction.parked", &xids);
    for r in receiver.received() {
        assert!(verify(
            SECRET.as_bytes(),
            r.signature.as_deref().unwrap(),
            &r.body
        ));
    }
}
test_on_all_databases!(
    an_alert_survives_a_kill_between_the_park_and_its_delivery,
    SCHEMAS
);

/// Nothing listens at the webhook while two transactions park; the receiver comes up later on
/// that address and gets both events, once each.
async fn a_receiver_down_for_a_while_gets_the_events_later<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let addr = dtx_tests::net::free_addr().await;
    let url = url_of(addr);
    let w = World::start(db, &["--alert-webhook", &url, "--alert-retry-max", "1s"]).await;
    for xid in ["down-1", "down-2"] {
        let parked = w.park(xid, "alice", Fault::Refuse).await;
        assert_eq!(parked.status(), TxStatus::NeedsAttention);
    }
    // A few refused rounds, then the receiver is back.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let receiver = Receiver::start_on(addr).await;
    receiver
        .until(Duration::from_secs(10), |r| {
            ["down-1", "down-2"]
                .iter()
                .all(|x| r.iter().any(|e| e.event["xid"] == *x))
        })
        .await;
    assert!(
        receiver.received().iter().all(|r| r.signature.is_none()),
        "no secret: unsigned"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        receiver.received().len(),
        2,
        "delivered once each: {:#?}",
        receiver.received()
    );
}
test_on_all_databases!(a_receiver_down_for_a_while_gets_the_events_later, SCHEMAS);
