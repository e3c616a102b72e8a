//! The coordinator's store on SQLite, PostgreSQL and MariaDB: conditional, fenced state changes
//! (a stale worker can never move a transaction), branch registration rules, group commit,
//! disjoint claims by concurrent claimers, retention.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use dtx_coordinator::domain::alert::{Alert, AlertKind};
use dtx_coordinator::domain::history::{Entry, Event};
use dtx_coordinator::domain::{
    BranchId, BranchRow, BranchState, Decision, Fence, Kind, TxStatus, Xid,
};
use dtx_coordinator::store::{
    BeginTcc, Created, Decide, Decided, Delivery, Progress, Progressed, RegisterBranch, Registered,
    SqlStore, Store, StoreOptions,
};
use dtx_sql::{Schema, now_ms};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::test_on_all_databases;
use futures::future::join_all;

async fn store<DB: TestBackend>(db: &TestDb<DB>) -> Arc<dyn Store> {
    Arc::new(
        SqlStore::<DB>::open(&db.url, StoreOptions::default())
            .await
            .unwrap(),
    )
}

fn begin(xid: &str, timeout_ms: i64) -> BeginTcc {
    BeginTcc {
        xid: Xid::checked(xid.into()),
        timeout_ms,
        deadline_ms: now_ms() + timeout_ms,
    }
}

fn branch(id: &str) -> BranchRow {
    BranchRow {
        branch_id: BranchId::checked(id.into()),
        seq: 1,
        target: "http://127.0.0.1:1".into(),
        handler: "h".into(),
        payload: b"p".to_vec(),
        call_timeout_ms: 1000,
        ..BranchRow::default()
    }
}

fn register(xid: &str, id: &str, max: i64) -> RegisterBranch {
    RegisterBranch {
        xid: Xid::checked(xid.into()),
        branch: branch(id),
        max_branches: max,
        begin: None,
    }
}

fn decide(xid: &str, decision: Decision, fence: i64) -> Decide {
    Decide {
        xid: Xid::checked(xid.into()),
        kind: Kind::Tcc,
        decision,
        owner: "me".into(),
        fence: Fence::stored(fence),
        due_ms: now_ms() + 60_000,
        history: Vec::new(),
    }
}

fn progress(xid: &str, fence: i64, from: TxStatus, to: TxStatus) -> Progress {
    Progress {
        xid: Xid::checked(xid.into()),
        fence: Fence::stored(fence),
        new_fence: None,
        from,
        to,
        decision: to.implied_decision().or(from.implied_decision()),
        owner: None,
        due_ms: None,
        last_error: None,
        branches: Vec::new(),
        history: Vec::new(),
        alerts: Vec::new(),
    }
}

async fn stale_workers_cannot_move_a_transaction<DB: TestBackend>(db: &'static TestDb<DB>) {
    let s = store(db).await;
    assert_eq!(
        s.begin_tcc(begin("x1", 60_000)).await.unwrap(),
        Created::Inserted
    );
    assert_eq!(
        s.register_branch(register("x1", "b1", 64)).await.unwrap(),
        Registered::Added { begun: false }
    );
    let Decided::Claimed { branches, .. } =
        s.decide(decide("x1", Decision::Commit, 42)).await.unwrap()
    else {
        panic!("decide");
    };
    assert_eq!(branches.len(), 1);
    // The opposite decision, a second decision, a wrong fence, a wrong expected status: nothing.
    assert!(matches!(
        s.decide(decide("x1", Decision::Rollback, 7)).await.unwrap(),
        Decided::Exists(_)
    ));
    assert_eq!(
        s.progress(progress(
            "x1",
            41,
            TxStatus::Committing,
            TxStatus::Committed
        ))
        .await
        .unwrap(),
        Progressed::Fenced
    );
    assert_eq!(
        s.progress(progress(
            "x1",
            42,
            TxStatus::RollingBack,
            TxStatus::RolledBack
        ))
        .await
        .unwrap(),
        Progressed::Fenced
    );
    let got = s.get("x1").await.unwrap().unwrap();
    assert_eq!(
        (got.global.status, got.global.decision),
        (TxStatus::Committing, Some(Decision::Commit))
    );
    // The owner finishes; from then on even the right fence changes nothing.
    assert_eq!(
        s.progress(progress(
            "x1",
            42,
            TxStatus::Committing,
            TxStatus::Committed
        ))
        .await
        .unwrap(),
        Progressed::Applied
    );
    assert_eq!(
        s.progress(progress(
            "x1",
            42,
            TxStatus::Committing,
            TxStatus::NeedsAttention
        ))
        .await
        .unwrap(),
        Progressed::Fenced
    );
    let got = s.get("x1").await.unwrap().unwrap();
    assert_eq!(got.global.status, TxStatus::Committed);
    assert_eq!(got.global.due_ms, None, "settled work is never due");
}
test_on_all_databases!(
    stale_workers_cannot_move_a_transaction,
    &[Schema::Coordinator]
);

async fn branches_are_registered_only_while_trying<DB: TestBackend>(db: &'static TestDb<DB>) {
    let s = store(db).await;
    assert_eq!(
        s.register_branch(register("nope", "b1", 64)).await.unwrap(),
        Registered::Missing
    );
    s.begin_tcc(begin("x1", 60_000)).await.unwrap();
    assert_eq!(
        s.register_branch(register("x1", "b1", 2)).await.unwrap(),
        Registered::Added { begun: false }
    );
    // A repeat reports the existing branch and does not count twice.
    let Registered::Refused {
        existing: Some(b),
        global,
    } = s.register_branch(register("x1", "b1", 2)).await.unwrap()
    else {
        panic!("repeat");
    };
    assert_eq!(
        (
            b.branch_id.as_str(),
            b.payload.as_slice(),
            global.branch_count
        ),
        ("b1", &b"p"[..], 1)
    );
    assert_eq!(
        s.register_branch(register("x1", "b2", 2)).await.unwrap(),
        Registered::Added { begun: false }
    );
    // Over the limit.
    let Registered::Refused {
        existing: None,
        global,
    } = s.register_branch(register("x1", "b3", 2)).await.unwrap()
    else {
        panic!("limit");
    };
    assert_eq!(global.branch_count, 2);
    // After the decision.
    s.decide(decide("x1", Decision::Rollback, 1)).await.unwrap();
    let Registered::Refused {
        existing: None,
        global,
    } = s.register_branch(register("x1", "b9", 64)).await.unwrap()
    else {
        panic!("after decision");
    };
    assert_eq!(global.status, TxStatus::RollingBack);
    // Past the deadline.
    s.begin_tcc(begin("x2", 1)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(matches!(
        s.register_branch(register("x2", "b1", 64)).await.unwrap(),
        Registered::Refused { .. }
    ));
    // Commit is refused past the deadline; Rollback is not.
    assert!(matches!(
        s.decide(decide("x2", Decision::Commit, 1)).await.unwrap(),
        Decided::Exists(_)
    ));
    assert!(matches!(
        s.decide(decide("x2", Decision::Rollback, 1)).await.unwrap(),
        Decided::Claimed { .. }
    ));
    let rows = s.get("x1").await.unwrap().unwrap().branches;
    assert_eq!(
        rows.iter()
            .map(|b| b.branch_id.as_str())
            .collect::<Vec<_>>(),
        ["b1", "b2"]
    );
}
test_on_all_databases!(
    branches_are_registered_only_while_trying,
    &[Schema::Coordinator]
);

async fn the_first_branch_can_begin_its_transaction<DB: TestBackend>(db: &'static TestDb<DB>) {
    let s = store(db).await;
    let lazy = |id: &str| RegisterBranch {
        xid: Xid::checked("lazy".into()),
        branch: branch(id),
        max_branches: 64,
        begin: Some((60_000, now_ms() + 60_000)),
    };
    assert_eq!(
        s.register_branch(lazy("b1")).await.unwrap(),
        Registered::Added { begun: true }
    );
    // The next branch (and a repeat) find it begun.
    assert_eq!(
        s.register_branch(lazy("b2")).await.unwrap(),
        Registered::Added { begun: false }
    );
    assert!(matches!(
        s.register_branch(lazy("b1")).await.unwrap(),
        Registered::Refused {
            existing: Some(_),
            ..
        }
    ));
    let got = s.get("lazy").await.unwrap().unwrap();
    assert_eq!(
        (
            got.global.status,
            got.global.branch_count,
            got.branches.len()
        ),
        (TxStatus::Trying, 2, 2)
    );
    // An explicit Begin with the same timeout is an identical repeat.
    assert!(matches!(
        s.begin_tcc(begin("lazy", 60_000)).await.unwrap(),
        Created::Exists(_)
    ));
    // After the decision the lazy path does not create anything new.
    s.decide(decide("lazy", Decision::Commit, 3)).await.unwrap();
    assert!(matches!(
        s.register_branch(lazy("b3")).await.unwrap(),
        Registered::Refused { existing: None, .. }
    ));
}
test_on_all_databases!(
    the_first_branch_can_begin_its_transaction,
    &[Schema::Coordinator]
);

async fn concurrent_writes_share_commits<DB: TestBackend>(db: &'static TestDb<DB>) {
    let s = store(db).await;
    let writes = (0..300).map(|i| {
        let s = s.clone();
        tokio::spawn(async move { s.begin_tcc(begin(&format!("g{i}"), 60_000)).await.unwrap() })
    });
    let results = join_all(writes).await;
    assert!(results.into_iter().all(|r| r.unwrap() == Created::Inserted));
    let (commits, writes) = s.stats().snapshot();
    assert_eq!(writes, 300);
    assert!(
        commits < 300,
        "{commits} commits for 300 concurrent writes: no batching happened"
    );
    eprintln!("{}: 300 writes in {commits} commits", DB::NAME);
    for i in [0, 150, 299] {
        assert!(s.get(&format!("g{i}")).await.unwrap().is_some());
    }
}
test_on_all_databases!(concurrent_writes_share_commits, &[Schema::Coordinator]);

/// A write the store refuses (here a transition the status rule forbids) fails alone, with its
/// own error, even when it shares a batch: its neighbours commit, and the caller learns it was
/// refused (INTERNAL), not that the store is unavailable.
async fn one_invalid_write_in_a_batch_fails_alone<DB: TestBackend>(db: &'static TestDb<DB>) {
    let options = StoreOptions {
        writers: 1,
        ..StoreOptions::default()
    };
    let s: Arc<dyn Store> = Arc::new(SqlStore::<DB>::open(&db.url, options).await.unwrap());
    s.begin_tcc(begin("bad", 60_000)).await.unwrap();
    // Queued in one go with the invalid write in the middle: while the one writer commits what
    // it took first, the rest wait in the queue and form the next batch together.
    let good = |range: std::ops::Range<i32>| {
        join_all(range.map(|i| s.begin_tcc(begin(&format!("ok{i}"), 60_000))))
    };
    let bad = s.progress(progress("bad", 0, TxStatus::Trying, TxStatus::Committed));
    let (before, bad, after) = tokio::join!(good(0..10), bad, good(10..20));
    match bad {
        Err(e @ dtx_coordinator::Error::Corrupt(_)) => {
            assert_eq!(tonic::Status::from(e).code(), tonic::Code::Internal)
        }
        other => panic!("the invalid write: {other:?}"),
    }
    for (i, result) in before.into_iter().chain(after).enumerate() {
        assert_eq!(result.unwrap(), Created::Inserted, "write ok{i}");
    }
    let row = s.get("bad").await.unwrap().unwrap().global;
    assert_eq!(
        row.status,
        TxStatus::Trying,
        "the refused write changed nothing"
    );
    let failed = s.stats().failed_writes();
    assert!(failed.contains(&("progress", 1)), "{failed:?}");
    assert!(failed.contains(&("begin_tcc", 0)), "{failed:?}");
}
test_on_all_databases!(
    one_invalid_write_in_a_batch_fails_alone,
    &[Schema::Coordinator]
);

async fn concurrent_claimers_take_disjoint_work<DB: TestBackend>(db: &'static TestDb<DB>) {
    let s1 = store(db).await;
    let s2 = store(db).await;
    for i in 0..40 {
        s1.begin_tcc(begin(&format!("due{i}"), 1)).await.unwrap();
    }
    s1.begin_tcc(begin("later", 60_000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let (a, b) = tokio::join!(
        s1.claim_due("one", Duration::from_secs(30), 25),
        s2.claim_due("two", Duration::from_secs(30), 25)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let a: HashSet<String> = a.into_iter().map(|r| r.global.xid.into()).collect();
    let b: HashSet<String> = b.into_iter().map(|r| r.global.xid.into()).collect();
    assert!(
        a.is_disjoint(&b),
        "claimed twice: {:?}",
        a.intersection(&b).collect::<Vec<_>>()
    );
    assert_eq!(a.len() + b.len(), 40, "{} + {}", a.len(), b.len());
    assert!(!a.contains("later") && !b.contains("later"), "not due yet");
    // Claimed rows carry the claimer and are not due again until the lease ends.
    let row = s1.get("due0").await.unwrap().unwrap().global;
    assert!(row.owner.is_some() && row.due_ms.unwrap() > now_ms() + 20_000);
    assert!(
        s1.claim_due("three", Duration::from_secs(30), 100)
            .await
            .unwrap()
            .is_empty()
    );
}
test_on_all_databases!(
    concurrent_claimers_take_disjoint_work,
    &[Schema::Coordinator]
);

async fn finished_transactions_are_purged_with_their_branches<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let s = store(db).await;
    for i in 0..7 {
        let xid = format!("old{i}");
        s.begin_tcc(begin(&xid, 60_000)).await.unwrap();
        s.register_branch(register(&xid, "b1", 64)).await.unwrap();
        s.decide(decide(&xid, Decision::Commit, 5)).await.unwrap();
        let mut done = branch("b1");
        done.state = BranchState::Confirmed;
        let mut p = progress(&xid, 5, TxStatus::Committing, TxStatus::Committed);
        p.branches = vec![done];
        p.history = vec![Entry::tx(
            now_ms(),
            Event::Status,
            Some(TxStatus::Committed),
        )];
        assert_eq!(s.progress(p).await.unwrap(), Progressed::Applied);
    }
    assert_eq!(
        s.history("old3").await.unwrap().len(),
        1,
        "written with the change"
    );
    s.begin_tcc(begin("running", 60_000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(s.purge_finished(now_ms(), 3).await.unwrap(), 7);
    assert!(s.get("old3").await.unwrap().is_none());
    assert!(
        s.history("old3").await.unwrap().is_empty(),
        "history goes with its transaction"
    );
    assert!(
        s.get("running").await.unwrap().is_some(),
        "unfinished work is never purged"
    );
}
test_on_all_databases!(
    finished_transactions_are_purged_with_their_branches,
    &[Schema::Coordinator]
);

async fn parked_transactions_are_counted_for_the_alert_gauge<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let s = store(db).await;
    assert_eq!(s.count_parked().await.unwrap(), 0);
    for xid in ["p1", "p2", "ok"] {
        s.begin_tcc(begin(xid, 60_000)).await.unwrap();
        s.decide(decide(xid, Decision::Commit, 9)).await.unwrap();
    }
    for xid in ["p1", "p2"] {
        let written = s
            .progress(progress(
                xid,
                9,
                TxStatus::Committing,
                TxStatus::NeedsAttention,
            ))
            .await
            .unwrap();
        assert_eq!(written, Progressed::Applied);
    }
    assert_eq!(s.count_parked().await.unwrap(), 2);
}
test_on_all_databases!(
    parked_transactions_are_counted_for_the_alert_gauge,
    &[Schema::Coordinator]
);

fn alert(id: &str, xid: &str) -> Alert {
    Alert {
        id: id.into(),
        xid: xid.into(),
        kind: AlertKind::Parked,
        at_ms: now_ms(),
        body: format!("{{\"id\":\"{id}\"}}"),
    }
}

/// An alert is stored only with the change that raised it, once per id, and the delivery
/// queue hands each due alert to one sender at a time until it is delivered.
async fn alerts_are_stored_with_their_change_and_delivered_through_claims<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let s = store(db).await;
    for xid in ["a1", "a2"] {
        s.begin_tcc(begin(xid, 60_000)).await.unwrap();
        s.decide(decide(xid, Decision::Commit, 9)).await.unwrap();
    }
    // A fenced write stores nothing, not even its alert.
    let mut stale = progress("a1", 8, TxStatus::Committing, TxStatus::NeedsAttention);
    stale.alerts = vec![alert("parked:a1:8", "a1")];
    assert_eq!(s.progress(stale).await.unwrap(), Progressed::Fenced);
    assert!(
        s.claim_alerts(Duration::from_secs(30), 10)
            .await
            .unwrap()
            .is_empty()
    );

    let mut park = progress("a1", 9, TxStatus::Committing, TxStatus::NeedsAttention);
    park.alerts = vec![alert("parked:a1:9", "a1")];
    assert_eq!(s.progress(park).await.unwrap(), Progressed::Applied);
    // The same id again (a stuck scan on two instances, say) is kept once.
    let again = [alert("parked:a1:9", "a1"), alert("stuck:a2", "a2")];
    assert_eq!(s.add_alerts(&again).await.unwrap(), 1);

    let claimed = s.claim_alerts(Duration::from_secs(30), 10).await.unwrap();
    let mut ids: Vec<_> = claimed.iter().map(|a| a.id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["parked:a1:9", "stuck:a2"]);
    assert_eq!(claimed[0].body, format!("{{\"id\":\"{}\"}}", claimed[0].id));
    // Claimed: no other sender gets them while the claim lasts.
    assert!(
        s.claim_alerts(Duration::from_secs(30), 10)
            .await
            .unwrap()
            .is_empty()
    );

    // One delivered everywhere, one reached one webhook of two and is due again at once.
    let done = Delivery {
        delivered: vec!["w1".into(), "w2".into()],
        retry_at_ms: None,
        error: None,
    };
    let partly = Delivery {
        delivered: vec!["w1".into()],
        retry_at_ms: Some(0),
        error: Some("w2: HTTP 503".into()),
    };
    s.finish_alert("parked:a1:9", &done).await.unwrap();
    s.finish_alert("stuck:a2", &partly).await.unwrap();
    let again = s.claim_alerts(Duration::from_secs(30), 10).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(
        (
            again[0].id.as_str(),
            again[0].attempts,
            again[0].delivered.clone()
        ),
        ("stuck:a2", 1, vec!["w1".to_string()])
    );

    // A claim that is never finished (the sender died) is due again once it expires.
    s.finish_alert("stuck:a2", &partly).await.unwrap();
    let held = s
        .claim_alerts(Duration::from_millis(300), 10)
        .await
        .unwrap();
    assert_eq!(held.len(), 1);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let retaken = s.claim_alerts(Duration::from_secs(30), 10).await.unwrap();
    assert_eq!(retaken.len(), 1, "an expired claim is taken again");
}
test_on_all_databases!(
    alerts_are_stored_with_their_change_and_delivered_through_claims,
    &[Schema::Coordinator]
);
