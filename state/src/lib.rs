//! dtx-state: forward-only state transitions, the state-machine side of idempotency. An order,
//! a payment or a refund moves `WAIT_PAY -> PAID -> SHIPPED` by conditional updates
//! (`... SET status = to, version = version + 1 WHERE id = ? AND status IN (from..) AND version = ?`),
//! so a repeated, late or concurrent event can never move it backwards or twice. When an event
//! changes nothing, [`Entity::apply`] reads the entity and says why:
//!
//! * [`Outcome::AlreadyThere`]: it is in the wanted state, entered by the same fact (say, the
//!   same trade number) - a repeat, an idempotent success;
//! * [`Outcome::Stale`]: it is past the wanted state - an event that arrived late, ignored;
//! * [`Outcome::Conflict`]: anything else (another branch such as CLOSED, the state entered by
//!   another fact, a state not reachable yet), with the current state.
//!
//! Each move is logged in `dtx_transitions` in the same transaction (the fact that made it, the
//! state it left, the new version): that is what tells a repeat from a conflict. Runs on
//! PostgreSQL, MySQL/MariaDB and SQLite inside the caller's transaction, next to its other
//! writes (the payment row, an outbox event).
//!
//! ```no_run
//! # async fn run(pool: dtx_sql::sqlx::Pool<dtx_sql::sqlx::Postgres>) -> Result<(), dtx_state::Error> {
//! use dtx_sql::Backend as _;
//! use dtx_state::{Entity, Machine, Outcome};
//! dtx_state::migrate(&pool).await?;
//! let machine = Machine::builder("order")
//!     .transition("WAIT_PAY", "PAID")
//!     .transition("PAID", "SHIPPED")
//!     .transition("WAIT_PAY", "CLOSED")
//!     .build()?;
//! let orders = Entity::new(machine, "orders")?; // columns id, status, version
//! let mut tx = dtx_sql::sqlx::Postgres::begin(&pool).await?;
//! match orders.apply(&mut *tx, &"order-42".into(), "PAID", Some("trade-9")).await? {
//!     Outcome::Moved { .. } | Outcome::AlreadyThere | Outcome::Stale { .. } => {}
//!     Outcome::Conflict { current, reason } => eprintln!("order-42 is {current}: {reason}"),
//! }
//! tx.commit().await?;
//! # Ok(()) }
//! ```

mod error;
mod machine;

use dtx_sql::sqlx::Pool;
use dtx_sql::{Arg, Backend, Conn, Schema, SqlRow, args};

pub use error::Error;
pub use machine::{MAX_NAME, Machine, MachineBuilder, Step};

/// Longest fact (the log's column width).
pub const MAX_FACT: usize = 255;

/// Conditional updates tried before [`Error::Contended`]: each failed one means another
/// transaction moved the entity in between, which a handful of events per entity cannot do
/// for long.
const MAX_TRIES: u32 = 16;

const LOG: &str = "INSERT INTO dtx_transitions (entity, entity_id, state, from_state, version, \
     fact, at) VALUES (?, ?, ?, ?, ?, ?, ?)";

const FACT: &str =
    "SELECT fact FROM dtx_transitions WHERE entity = ? AND entity_id = ? AND state = ?";

/// Creates (or upgrades) the `dtx_transitions` log.
pub async fn migrate<DB: Backend>(pool: &Pool<DB>) -> Result<(), Error> {
    Ok(DB::migrate(pool, Schema::Transitions).await?)
}

/// An entity's id: the type of its id column.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EntityId {
    /// An integer id column.
    Int(i64),
    /// A text id column.
    Text(String),
}

impl EntityId {
    fn arg(&self) -> Arg<'_> {
        match self {
            EntityId::Int(id) => Arg::from(*id),
            EntityId::Text(id) => Arg::from(id.as_str()),
        }
    }
}

impl std::fmt::Display for EntityId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EntityId::Int(id) => write!(f, "{id}"),
            EntityId::Text(id) => f.write_str(id),
        }
    }
}

impl From<i64> for EntityId {
    fn from(id: i64) -> Self {
        EntityId::Int(id)
    }
}

impl From<&str> for EntityId {
    fn from(id: &str) -> Self {
        EntityId::Text(id.to_string())
    }
}

impl From<String> for EntityId {
    fn from(id: String) -> Self {
        EntityId::Text(id)
    }
}

/// What an event did to an entity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Moved from `from` into the wanted state; the row's version is now `version`.
    Moved {
        /// The state it left.
        from: String,
        /// The row's version after the move.
        version: i64,
    },
    /// Already in the wanted state, entered by the same fact (or without one): a repeat.
    AlreadyThere,
    /// Already past the wanted state (`current` comes after it): a late event, ignored.
    Stale {
        /// The entity's state now.
        current: String,
    },
    /// Not applicable: `current` is on another branch, or the wanted state was entered by
    /// another fact, or it is not reachable from `current` in one step yet.
    Conflict {
        /// The entity's state now.
        current: String,
        /// Why the event does not apply, for logs and the sender.
        reason: String,
    },
}

impl Outcome {
    /// Moved, a repeat or a late event: the sender may be told "done".
    pub fn is_done(&self) -> bool {
        !matches!(self, Outcome::Conflict { .. })
    }
}

/// One entity table driven by a [`Machine`].
#[derive(Debug, Clone)]
pub struct Entity {
    machine: Machine,
    table: String,
    id: String,
    status: String,
    version: String,
    select: String,
}

impl Entity {
    /// The entity stored in `table`, with the columns `id`, `status` and `version` (an integer
    /// that every move increments).
    pub fn new(machine: Machine, table: &str) -> Result<Self, Error> {
        Self::with_columns(machine, table, "id", "status", "version")
    }

    /// As [`Entity::new`], naming the id, status and version columns.
    pub fn with_columns(
        machine: Machine,
        table: &str,
        id: &str,
        status: &str,
        version: &str,
    ) -> Result<Self, Error> {
        for name in [table, id, status, version] {
            check_identifier(name)?;
        }
        Ok(Entity {
            select: format!("SELECT {status}, {version} FROM {table} WHERE {id} = ?"),
            machine,
            table: table.into(),
            id: id.into(),
            status: status.into(),
            version: version.into(),
        })
    }

    /// The machine that drives this table.
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// The entity's table and its id column, for callers that read more of the row.
    pub fn table(&self) -> (&str, &str) {
        (&self.table, &self.id)
    }

    /// The entity's state and version, if it exists.
    pub async fn current<C: Conn>(
        &self,
        conn: &mut C,
        id: &EntityId,
    ) -> Result<Option<(String, i64)>, Error> {
        let rows = conn
            .fetch_all_dynamic(self.select.clone(), &[id.arg()])
            .await?;
        match rows.first() {
            Some(row) => Ok(Some((row.text(0)?, row.i64(1)?))),
            None => Ok(None),
        }
    }

    /// Moves entity `id` to `to` if a declared transition leads there from where it is, by a
    /// conditional update in the caller's transaction (`conn`), logging `fact`; otherwise
    /// says why not (see [`Outcome`]). Never moves it backwards. Concurrent callers wanting
    /// the same move: one moves it, the others get [`Outcome::AlreadyThere`].
    pub async fn apply<C: Conn>(
        &self,
        conn: &mut C,
        id: &EntityId,
        to: &str,
        fact: Option<&str>,
    ) -> Result<Outcome, Error> {
        if let Some(fact) = fact.filter(|f| f.len() > MAX_FACT) {
            return Err(Error::FactTooLong(fact.len()));
        }
        let sources = self.machine.sources(to)?;
        for _ in 0..MAX_TRIES {
            let Some((current, version)) = self.current(conn, id).await? else {
                return Err(Error::NotFound {
                    entity: self.machine.name().into(),
                    id: id.to_string(),
                });
            };
            let step = self.machine.step(&current, to)?;
            if step == Step::Move {
                if self.update(conn, id, to, version, &sources).await? {
                    self.log(conn, id, to, &current, version + 1, fact).await?;
                    return Ok(Outcome::Moved {
                        from: current,
                        version: version + 1,
                    });
                }
                continue; // moved by someone else in between: look again
            }
            if step == Step::Off {
                let reason = format!("no transition from {current} to {to}");
                return Ok(Outcome::Conflict { current, reason });
            }
            // Here or past: a repeat or a late event - unless another fact entered `to`.
            let entered_by = self.fact(conn, id, to).await?;
            if let (Some(entered_by), Some(fact)) = (entered_by, fact)
                && entered_by != fact
            {
                let reason = format!("{to} was entered by {entered_by:?}, not {fact:?}");
                return Ok(Outcome::Conflict { current, reason });
            }
            return Ok(if step == Step::Here {
                Outcome::AlreadyThere
            } else {
                Outcome::Stale { current }
            });
        }
        Err(Error::Contended {
            entity: self.machine.name().into(),
            id: id.to_string(),
            tries: MAX_TRIES,
        })
    }

    /// `UPDATE ... WHERE id = ? AND version = ? AND status IN (sources)`: true if it moved.
    async fn update<C: Conn>(
        &self,
        conn: &mut C,
        id: &EntityId,
        to: &str,
        version: i64,
        sources: &[&str],
    ) -> Result<bool, Error> {
        let (table, status, version_col) = (&self.table, &self.status, &self.version);
        let mut sql = format!(
            "UPDATE {table} SET {status} = ?, {version_col} = {version_col} + 1 \
             WHERE {} = ? AND {version_col} = ? AND {status} IN (",
            self.id
        );
        for i in 0..sources.len() {
            sql.push_str(if i == 0 { "?" } else { ", ?" });
        }
        sql.push(')');
        let mut all: Vec<Arg> = vec![Arg::from(to), id.arg(), Arg::from(version)];
        all.extend(sources.iter().map(|s| Arg::from(*s)));
        Ok(conn.execute_dynamic(sql, &all).await? == 1)
    }

    async fn log<C: Conn>(
        &self,
        conn: &mut C,
        id: &EntityId,
        to: &str,
        from: &str,
        version: i64,
        fact: Option<&str>,
    ) -> Result<(), Error> {
        let entity_id = id.to_string();
        let at = dtx_sql::now_ms();
        let name = self.machine.name();
        let args = args![name, entity_id.as_str(), to, from, version, fact, at];
        conn.execute(LOG, args).await?;
        Ok(())
    }

    /// The fact that moved entity `id` into `state`, if one did and was given.
    pub async fn fact<C: Conn>(
        &self,
        conn: &mut C,
        id: &EntityId,
        state: &str,
    ) -> Result<Option<String>, Error> {
        let entity_id = id.to_string();
        let args = args![self.machine.name(), entity_id.as_str(), state];
        match conn.fetch_optional(FACT, args).await? {
            Some(row) => Ok(row.opt_text(0)?),
            None => Ok(None),
        }
    }
}

/// A table or column name: `[A-Za-z_][A-Za-z0-9_]*`, at most 64 characters, optionally
/// `schema.name` - the only text of these statements not bound as a parameter.
fn check_identifier(name: &str) -> Result<(), Error> {
    let plain = |part: &str| {
        let mut chars = part.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let parts: Vec<&str> = name.split('.').collect();
    if name.len() > 64 || parts.len() > 2 || !parts.iter().all(|p| plain(p)) {
        return Err(Error::Identifier(name.into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_plain_names() {
        for good in ["orders", "shop.orders", "_v2"] {
            assert!(check_identifier(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "orders; DROP TABLE x",
            "a.b.c",
            "1st",
            "ord-ers",
            "\"orders\"",
        ] {
            assert!(check_identifier(bad).is_err(), "{bad}");
        }
    }
}
