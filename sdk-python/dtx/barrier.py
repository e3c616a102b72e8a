"""The branch barrier: makes repeated, concurrent and out-of-order branch calls safe.

The same table (``dtx_barrier``), rows and rules as the Rust SDK's ``dtx_sdk::barrier``, so a
branch may be served by either and a database may be shared. Every call writes a row keyed by
(xid, branch_id, action) inside the local transaction of the business change; the unique key,
not a check before the insert, decides every race:

=============================  ==================================  ==============================
call                           row insert                          answer
=============================  ==================================  ==============================
Try/Action, first              own row inserted                    run the handler, keep outcome
Try/Action, repeat             own row exists, same request        stored first outcome, result
Try/Action, other request      own row exists, other hash          FAILURE (CONFLICT), no effect
Try/Action after Cancel        row exists, written by Cancel       FAILURE (SUSPENDED), no effect
Confirm/Cancel, first          phase-two slot inserted             run the handler
Confirm/Cancel, repeat         slot exists, same op                SUCCESS (DUPLICATE), no effect
Cancel after Confirm (or rev)  slot exists, other op               FAILURE (CONFLICT), no effect
Compensate, repeat             own row exists                      SUCCESS (DUPLICATE), no effect
Cancel before Try              Try's row inserted *by Cancel*      SUCCESS (EMPTY_ROLLBACK)
Cancel of a refused Try        Try's row says failure              SUCCESS (NOTHING_TO_UNDO)
Confirm of a Try not done      -                                   FAILURE (OUT_OF_ORDER)
=============================  ==================================  ==============================

Phase two is one-way: Confirm and Cancel both insert the branch's one ``phase2`` row with their
name in ``written_by``; the loser of a race reads the winner's name and answers a conflict.
"""

import enum
import hashlib
import struct
import time
from dataclasses import dataclass

from . import limits

SAVEPOINT = "dtx_barrier"

_INSERT = (
    "dtx_barrier (xid, branch_id, action, written_by, outcome, result, request_hash, created_ms) "
    "VALUES (?, ?, ?, ?, ?, NULL, ?, ?)"
)
_READ = (
    "SELECT written_by, outcome, result, request_hash FROM dtx_barrier "
    "WHERE xid = ? AND branch_id = ? AND action = ?"
)
_RECORD = (
    "UPDATE dtx_barrier SET outcome = ?, result = ? "
    "WHERE xid = ? AND branch_id = ? AND action = ?"
)
_PURGE = {
    "postgres": "DELETE FROM dtx_barrier WHERE ctid IN (SELECT ctid FROM dtx_barrier "
    "WHERE created_ms < ? ORDER BY created_ms LIMIT ?)",
    "mysql": "DELETE FROM dtx_barrier WHERE created_ms < ? ORDER BY created_ms LIMIT ?",
    "sqlite": "DELETE FROM dtx_barrier WHERE rowid IN (SELECT rowid FROM dtx_barrier "
    "WHERE created_ms < ? ORDER BY created_ms LIMIT ?)",
}
PHASE_TWO = "phase2"
#: A two-phase message's one slot (the ``action`` column) and its branch id.
MESSAGE_SLOT = "message"
MESSAGE_BRANCH = "msg"


class Action(enum.Enum):
    """A branch call's action; the value is the name stored in ``action`` / ``written_by``."""

    TRY = "try"
    CONFIRM = "confirm"
    CANCEL = "cancel"
    ACTION = "action"
    COMPENSATE = "compensate"
    #: The coordinator asking whether a two-phase message's local transaction committed.
    CHECK_BACK = "check_back"
    #: A two-phase message's local transaction (no wire action: the initiator writes it).
    MESSAGE = "message"

    @property
    def is_forward(self):
        return self in (Action.TRY, Action.ACTION)

    @property
    def is_phase_two(self):
        return self in (Action.CONFIRM, Action.CANCEL)

    @property
    def undoes(self):
        return {Action.CANCEL: Action.TRY, Action.COMPENSATE: Action.ACTION}.get(self)


class Outcome(enum.Enum):
    """``outcome`` of a row."""

    PENDING = "pending"
    SUCCESS = "success"
    FAILURE = "failure"
    EMPTY = "none"


class Detail(enum.Enum):
    """Why the barrier answered as it did (the wire's ``OutcomeDetail``)."""

    EXECUTED = 1
    DUPLICATE = 2
    EMPTY_ROLLBACK = 3
    SUSPENDED = 4
    NOTHING_TO_UNDO = 5
    OUT_OF_ORDER = 6
    CONFLICT = 7


@dataclass(frozen=True)
class Reply:
    """What a handler decided: success with a result repeats get back, or an explicit refusal
    (its changes are undone; from Try/Action it is recorded, so repeats get it too)."""

    success: bool
    result: bytes = b""

    @staticmethod
    def ok(result=b""):
        return Reply(True, bytes(result))

    @staticmethod
    def refuse(reason):
        return Reply(False, reason.encode() if isinstance(reason, str) else bytes(reason))


@dataclass(frozen=True)
class Answer:
    reply: Reply
    detail: Detail

    @property
    def is_success(self):
        return self.reply.success


@dataclass(frozen=True)
class BranchKey:
    """One branch call: the barrier's key, and the hash of the request a Try/Action carries
    (``None``: no check, the stored first result is replayed to any repeat)."""

    xid: str
    branch_id: str
    action: Action
    request_hash: str = None

    def __post_init__(self):
        limits.check_scoped_xid(self.xid)
        limits.check_branch_id("branch_id", self.branch_id)


class BarrierError(RuntimeError):
    """The table holds something the protocol cannot produce."""


class MessageDropped(RuntimeError):
    """A check-back found the message's local transaction uncommitted and dropped the message:
    roll the local transaction back (nothing will be delivered)."""


class Prepared(enum.Enum):
    """What :func:`prepare_message` found."""

    #: The slot is this transaction's: run the business change and commit.
    FRESH = "fresh"
    #: An earlier local transaction of this message committed: do not run the business again.
    ALREADY_COMMITTED = "already_committed"


def request_hash(*parts):
    """SHA-256 (hex) over length-prefixed parts, as the Rust ``RequestHash::of_parts``: the
    participant server hashes (handler, payload)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(struct.pack(">Q", len(part)))
        digest.update(part)
    return digest.hexdigest()


def call(tx, key, handler):
    """Runs one branch call through the barrier inside ``tx`` (a :class:`dtx.db.Tx`).

    ``handler(conn)`` runs at most once, only on the first arrival of a call that may have an
    effect, on the same connection and transaction; it returns a :class:`Reply` or raises (then
    roll the transaction back: the barrier row goes with it and a retry runs again). After a
    return, committing is always right: a refusal is already isolated by a savepoint.
    """
    if key.action in (Action.CHECK_BACK, Action.MESSAGE):
        raise BarrierError(
            f"{key.action.value} is a two-phase message's, not a branch call's: use "
            "check_back/prepare_message"
        )
    origin = key.action.undoes
    if origin is not None:
        return _undo(tx, key, origin, handler)
    if key.action.is_forward:
        return _forward(tx, key, handler)
    return _confirm(tx, key, handler)


def prepare_message(tx, xid):
    """Inside the initiator's local transaction of two-phase message ``xid``: takes the
    message's slot (see :func:`check_back`). Raises :class:`MessageDropped` if a check-back
    took it first - the message is dropped and ``tx`` must roll back."""
    limits.check_scoped_xid(xid)
    if _insert(tx, xid, MESSAGE_BRANCH, MESSAGE_SLOT, Action.MESSAGE, Outcome.SUCCESS):
        return Prepared.FRESH
    if _message_holder(tx, xid) == Action.MESSAGE:
        return Prepared.ALREADY_COMMITTED
    raise MessageDropped(f"message {xid} was dropped by a check-back before its local "
                         "transaction committed")


def check_back(tx, xid):
    """The coordinator's check-back of message ``xid``, in a transaction of its own (commit it
    after a return): SUCCESS if the message's local transaction committed (deliver); otherwise
    it takes the slot so that transaction never can, and answers FAILURE (drop). While the local
    transaction still runs, the insert waits for it: the answer is never a guess."""
    limits.check_scoped_xid(xid)
    dropped = Reply.refuse(f"message {xid}: its local transaction did not commit")
    if _insert(tx, xid, MESSAGE_BRANCH, MESSAGE_SLOT, Action.CHECK_BACK, Outcome.EMPTY):
        return Answer(dropped, Detail.EMPTY_ROLLBACK)
    if _message_holder(tx, xid) == Action.MESSAGE:
        return Answer(Reply.ok(), Detail.DUPLICATE)
    return Answer(dropped, Detail.DUPLICATE)


def _message_holder(tx, xid):
    row = _read(tx, xid, MESSAGE_BRANCH, MESSAGE_SLOT)
    if row is None:
        raise BarrierError(f"message slot of {xid} vanished")
    return row[0]


def _insert(tx, xid, branch_id, action, written_by, outcome, request=None):
    sql = tx.database.insert_ignore(_INSERT)
    now_ms = int(time.time() * 1000)
    args = (xid, branch_id, action, written_by.value, outcome.value, request, now_ms)
    return tx.execute(sql, args) == 1


def _read(tx, xid, branch_id, action):
    row = tx.fetchone(_READ + tx.database.share_lock(), (xid, branch_id, action))
    if row is None:
        return None
    written_by, outcome, result, stored_hash = row
    try:
        return (
            Action(written_by),
            Outcome(outcome),
            bytes(result or b""),
            stored_hash.rstrip() if stored_hash else None,
        )
    except ValueError as e:
        raise BarrierError(f"unknown value in dtx_barrier: {e}") from None


class _Savepoint:
    def __init__(self, tx):
        self.tx = tx
        tx.execute(f"SAVEPOINT {SAVEPOINT}")

    def end(self, keep):
        if not keep:
            self.tx.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
        self.tx.execute(f"RELEASE SAVEPOINT {SAVEPOINT}")


def _forward(tx, key, handler):
    own = (key.xid, key.branch_id, key.action.value)
    if not _insert(tx, *own, key.action, Outcome.PENDING, key.request_hash):
        row = _read(tx, *own)
        if row is None:
            raise BarrierError(f"barrier row of {own} vanished")
        return _repeat_of_forward(key, row)
    savepoint = _Savepoint(tx)
    reply = _checked(handler(tx.conn))
    savepoint.end(reply.success)
    limits.check_payload("handler result", reply.result)
    outcome = Outcome.SUCCESS if reply.success else Outcome.FAILURE
    tx.execute(_RECORD, (outcome.value, reply.result, *own))
    return Answer(reply, Detail.EXECUTED)


def _repeat_of_forward(key, row):
    written_by, outcome, result, stored_hash = row
    action = key.action.value
    if written_by != key.action:
        return Answer(
            Reply.refuse(f"suspended: {action} arrived after its {written_by.value}"),
            Detail.SUSPENDED,
        )
    if stored_hash and key.request_hash and stored_hash != key.request_hash:
        return Answer(
            Reply.refuse(
                f"{action} refused: branch {key.xid}/{key.branch_id} was tried with a "
                "different request"
            ),
            Detail.CONFLICT,
        )
    return Answer(Reply(outcome != Outcome.FAILURE, result), Detail.DUPLICATE)


def _confirm(tx, key, handler):
    savepoint = _Savepoint(tx)
    answer = _claim_phase_two(tx, key)
    if answer is not None:
        savepoint.end(True)
        return answer
    if not _insert_own(tx, key):
        # A Confirm that ran before its slot existed (written by an older barrier).
        savepoint.end(True)
        return Answer(Reply.ok(), Detail.DUPLICATE)
    tried = _read(tx, key.xid, key.branch_id, Action.TRY.value)
    if tried is None:
        problem = "never ran (or its barrier row was purged)"
    elif tried[0] != Action.TRY:
        problem = f"was blocked by {tried[0].value}"
    elif tried[1] != Outcome.SUCCESS:
        problem = "was refused"
    else:
        problem = None
    if problem is not None:
        # Nothing was decided here: rolling back frees the slot again.
        savepoint.end(False)
        return Answer(
            Reply.refuse(
                f"confirm of xid {key.xid} branch {key.branch_id} rejected: its try {problem}"
            ),
            Detail.OUT_OF_ORDER,
        )
    return _run_undoable(tx, savepoint, handler)


def _undo(tx, key, origin, handler):
    savepoint = _Savepoint(tx)
    if key.action.is_phase_two:
        answer = _claim_phase_two(tx, key)
        if answer is not None:
            savepoint.end(True)
            return answer
    # Claiming the origin's row succeeds only if the Try/Action never ran (and now never will).
    origin_row = (key.xid, key.branch_id, origin.value)
    claimed_origin = _insert(tx, *origin_row, key.action, Outcome.EMPTY)
    first = _insert_own(tx, key)
    detail = None
    if not first:
        detail = Detail.DUPLICATE
    elif claimed_origin:
        detail = Detail.EMPTY_ROLLBACK
    else:
        row = _read(tx, *origin_row)
        if row is not None and row[1] == Outcome.FAILURE:
            detail = Detail.NOTHING_TO_UNDO
    if detail is not None:
        savepoint.end(True)
        return Answer(Reply.ok(), detail)
    return _run_undoable(tx, savepoint, handler)


def _insert_own(tx, key):
    return _insert(tx, key.xid, key.branch_id, key.action.value, key.action, Outcome.SUCCESS)


def _claim_phase_two(tx, key):
    """Takes the branch's phase-two slot; ``None`` if taken now, else the answer."""
    op = key.action
    if _insert(tx, key.xid, key.branch_id, PHASE_TWO, op, Outcome.SUCCESS):
        return None
    row = _read(tx, key.xid, key.branch_id, PHASE_TWO)
    if row is None:
        raise BarrierError(f"phase-two slot of {key.xid}/{key.branch_id} vanished")
    holder = row[0]
    if holder == op:
        return Answer(Reply.ok(), Detail.DUPLICATE)
    decided = {Action.CONFIRM: "confirmed", Action.CANCEL: "cancelled"}.get(
        holder, f"taken by {holder.value}"
    )
    reason = f"{op.value} refused: branch {key.xid}/{key.branch_id} was already {decided}"
    return Answer(Reply.refuse(reason), Detail.CONFLICT)


def _run_undoable(tx, savepoint, handler):
    reply = _checked(handler(tx.conn))
    savepoint.end(reply.success)
    return Answer(reply, Detail.EXECUTED)


def _checked(reply):
    if not isinstance(reply, Reply):
        raise TypeError(f"a handler must return dtx.Reply, not {type(reply).__name__}")
    return reply


def purge_older_than(database, cutoff_ms, batch=1000):
    """Deletes rows created before ``cutoff_ms`` (Unix ms), ``batch`` per transaction, until
    none is left; returns how many. Keep rows longer than the coordinator's retry horizon."""
    total = 0
    while True:
        with database.transaction() as tx:
            deleted = tx.execute(_PURGE[database.dialect], (cutoff_ms, batch))
        total += max(deleted, 0)
        if deleted < batch:
            return total
