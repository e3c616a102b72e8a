//! Domain types and pure logic: statuses and their allowed transitions, transaction and branch
//! records, saga plans (dependency graph, what may run or compensate next), retry backoff.
//! Nothing here does I/O, so all of it is unit- and property-tested directly.

pub mod alert;
pub mod allow;
pub mod backoff;
pub mod graph;
pub mod history;
pub mod ids;
pub mod job;
pub mod message;
pub mod record;
pub mod saga;
pub mod status;
pub mod tcc;

pub use ids::{BranchId, Fence, Xid};
pub use record::{BranchRow, GlobalRow, TxRecord};
pub use status::{BranchState, Decision, Kind, TxStatus};
