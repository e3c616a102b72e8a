//! A small world for end-to-end tests: one database (holding the coordinator's tables, the
//! participant's barrier and the ledger), the bank participant on a real gRPC port, and an
//! in-process coordinator on the same database.

use std::time::Duration;

use dtx_proto::v1::{BranchStatus, Transaction, TxKind, TxStatus};
use dtx_sdk::barrier::Action;
use dtx_sdk::client::{
    Coordinator, MessageBranch, MessageBuilder, RetryPolicy, SagaStep, TccBranch, TccOptions,
};
use dtx_sql::Schema;
use tonic::transport::Server;

use crate::coordinator::InProcess;
use crate::db::{TestBackend, TestDb};
use crate::ledger;
use crate::net::{RunningServer, serve};
use crate::participant::{Bank, Fault, Faults, ORDERS_CHECK_BACK, payload};

/// Every schema an end-to-end test needs.
pub const SCHEMAS: &[Schema] = &[Schema::Coordinator, Schema::Barrier];

/// Starting balance of the accounts `alice`, `bob` and `carol`.
pub const START: i64 = 1_000_000;

pub struct World<DB: TestBackend> {
    pub db: &'static TestDb<DB>,
    /// URL of the bank participant.
    pub bank: String,
    pub faults: Faults,
    pub coordinator: InProcess,
    pub client: Coordinator,
    pub bank_server: RunningServer,
}

impl<DB: TestBackend> World<DB> {
    /// The bank and a coordinator (with [`crate::coordinator::FAST`] settings plus `flags`).
    pub async fn start(db: &'static TestDb<DB>, flags: &[&str]) -> World<DB> {
        let (faults, bank_server) = bank(db).await;
        let coordinator = InProcess::start(&db.url, flags).await;
        let client = coordinator.client().await;
        World {
            db,
            bank: bank_server.url(),
            faults,
            coordinator,
            client,
            bank_server,
        }
    }

    /// A TCC transaction `xid` moving 10 from `account` in branch b1, whose Confirm meets
    /// `fault` (a refusal parks it), committed and waited for until it settles or parks.
    pub async fn park(&self, xid: &str, account: &str, fault: Fault) -> Transaction {
        park(&self.client, &self.bank, &self.faults, xid, account, fault).await
    }

    pub async fn account(&self, id: &str) -> (i64, i64) {
        ledger::account(&self.db.pool, id).await
    }

    pub async fn effects(&self, xid: &str, branch: &str, kind: &str) -> i64 {
        ledger::effects(&self.db.pool, xid, branch, kind).await
    }

    /// `xid` once settled (terminal or parked), waiting up to 20 s.
    pub async fn settled(&self, xid: &str) -> Transaction {
        let tx = self
            .client
            .wait(xid, Duration::from_secs(20))
            .await
            .unwrap();
        assert!(tx.status().is_settled(), "{xid} did not settle: {tx:?}");
        tx
    }

    /// The order message `xid` ([`order_message`]) settled delivered: each credit once, the
    /// order once.
    pub async fn assert_order_delivered(&self, xid: &str) {
        let tx = self.settled(xid).await;
        assert_eq!(tx.status(), TxStatus::Committed, "{tx:?}");
        assert_eq!(tx.kind(), TxKind::Message);
        for branch in &tx.branches {
            assert_eq!(branch.status(), BranchStatus::Done, "{branch:?}");
        }
        self.assert_order_effects(xid, 1).await;
    }

    /// The order message `xid` settled dropped: nothing delivered, no order.
    pub async fn assert_order_dropped(&self, xid: &str) {
        let tx = self.settled(xid).await;
        assert_eq!(tx.status(), TxStatus::RolledBack, "{tx:?}");
        for branch in &tx.branches {
            assert_eq!(branch.status(), BranchStatus::Skipped, "{branch:?}");
        }
        self.assert_order_effects(xid, 0).await;
    }

    async fn assert_order_effects(&self, xid: &str, times: i64) {
        assert_eq!(self.effects(xid, "credit-bob", "action").await, times);
        assert_eq!(self.effects(xid, "credit-carol", "action").await, times);
        let orders = crate::idempotency::orders_for(&self.db.pool, xid).await;
        assert_eq!(orders, times, "orders of {xid}");
    }

    /// The transaction's history as the Admin API describes it: one event per line, its kind,
    /// branch, status and detail.
    pub async fn history(&self, xid: &str) -> String {
        use dtx_proto::v1::DescribeTransactionRequest;
        use dtx_proto::v1::admin_client::AdminClient;
        let mut admin = AdminClient::connect(self.coordinator.url.clone())
            .await
            .unwrap();
        let request = DescribeTransactionRequest { xid: xid.into() };
        let detail = admin.describe_transaction(request).await.unwrap();
        let lines: Vec<String> = detail
            .into_inner()
            .history
            .iter()
            .map(|e| {
                let kind = e.kind().as_str_name().trim_start_matches("HISTORY_KIND_");
                format!("{kind} {} {} {}", e.branch_id, e.status, e.detail)
            })
            .collect();
        lines.join("\n")
    }
}

/// The accounts `alice`, `bob` and `carol` (at [`START`]) and the bank on a real gRPC port,
/// with the faults it injects.
pub async fn bank<DB: TestBackend>(db: &'static TestDb<DB>) -> (Faults, RunningServer) {
    ledger::create_tables(&db.pool).await;
    for account in ["alice", "bob", "carol"] {
        ledger::open_account(&db.pool, account, START).await;
    }
    let faults = Faults::default();
    let bank = serve(
        Server::builder().add_service(Bank::new(db.pool.clone(), faults.clone()).into_service()),
    )
    .await;
    (faults, bank)
}

/// A TCC transaction `xid` through `client` moving 10 from `account` in branch b1 at `bank`,
/// whose Confirm meets `fault` (a refusal parks it), committed and waited for until it settles
/// or parks.
pub async fn park(
    client: &Coordinator,
    bank: &str,
    faults: &Faults,
    xid: &str,
    account: &str,
    fault: Fault,
) -> Transaction {
    faults.push("b1", Action::Confirm, [fault]);
    let options = TccOptions {
        xid: Some(xid.into()),
        ..TccOptions::default()
    };
    let tx = client.begin(options).await.unwrap();
    let branch = TccBranch::new(bank, "transfer", payload(account, 10)).id("b1");
    tx.call(branch).await.unwrap();
    tx.commit().await.unwrap();
    client.wait(xid, Duration::from_secs(10)).await.unwrap()
}

/// Alice's account (at [`START`]) and the bank on a real gRPC port, with `branch`'s saga action
/// delayed by `delay` in the network: for tests that act while that step is in flight.
pub async fn alice_with_a_slow_step<DB: TestBackend>(
    db: &'static TestDb<DB>,
    branch: &str,
    delay: Duration,
) -> (Faults, RunningServer) {
    let (faults, bank) = bank(db).await;
    faults.push(branch, Action::Action, [Fault::Delay(delay)]);
    (faults, bank)
}

/// The bank's order message `xid` through `client`: credit bob 5, then carol 7, at the bank
/// `url`, which also answers its check-backs (after 300 ms); retried every 50 to 200 ms.
pub fn order_message(client: &Coordinator, url: &str, xid: &str) -> MessageBuilder {
    client
        .message(url, ORDERS_CHECK_BACK)
        .xid(xid)
        .check_back_after(Duration::from_millis(300))
        .retry(RetryPolicy {
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(200),
            call_timeout: Duration::from_secs(2),
            ..RetryPolicy::default()
        })
        .branch(MessageBranch::new("credit-bob", url, "credit").payload(payload("bob", 5)))
        .branch(
            MessageBranch::new("credit-carol", url, "credit")
                .payload(payload("carol", 7))
                .after(["credit-bob"]),
        )
}

/// A saga step `name` debiting `amount` from alice at the bank `url`.
pub fn debit_alice(name: &str, url: impl Into<String>, amount: i64) -> SagaStep {
    SagaStep::new(name, url, "debit").payload(payload("alice", amount))
}
