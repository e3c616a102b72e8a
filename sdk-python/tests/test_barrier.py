"""The barrier's rules, one table row per test, through the participant server's `handle`
(the same path a gRPC call takes after decoding), on PostgreSQL and SQLite. Effects are read
from the business ledger the handlers write in the barrier's transaction."""

import grpc
import pytest
from conftest import ledger, recording, refusing

import dtx
from dtx.v1 import dtx_pb2 as wire

OK, FAILURE, RETRY = wire.OUTCOME_SUCCESS, wire.OUTCOME_FAILURE, wire.OUTCOME_RETRY
D = wire  # OUTCOME_DETAIL_* constants

TRY, CONFIRM, CANCEL = wire.BRANCH_ACTION_TRY, wire.BRANCH_ACTION_CONFIRM, wire.BRANCH_ACTION_CANCEL
ACTION, COMPENSATE = wire.BRANCH_ACTION_ACTION, wire.BRANCH_ACTION_COMPENSATE


def server(db, try_=None):
    return (
        dtx.ParticipantServer(db)
        .tcc("hold", try_ or recording(db, "try"), recording(db, "confirm"), recording(db, "cancel"))
        .tcc("refuse", refusing(db, "try"), recording(db, "confirm"), recording(db, "cancel"))
        .saga("ship", recording(db, "action"), recording(db, "compensate"))
    )


def send(s, action, xid="x1", branch="b1", handler="hold", payload=b"p"):
    request = wire.BranchRequest(
        xid=xid, branch_id=branch, action=action, handler=handler, payload=payload
    )
    response = s.handle(request)
    return response.outcome, response.detail, bytes(response.result), response.message


def test_try_confirm_once_each_and_repeats_answered_from_the_barrier(database):
    s = server(database)
    assert send(s, TRY)[:3] == (OK, D.OUTCOME_DETAIL_EXECUTED, b"done:p")
    assert send(s, TRY)[:3] == (OK, D.OUTCOME_DETAIL_DUPLICATE, b"done:p")
    assert send(s, CONFIRM)[:2] == (OK, D.OUTCOME_DETAIL_EXECUTED)
    assert send(s, CONFIRM)[:2] == (OK, D.OUTCOME_DETAIL_DUPLICATE)
    assert [a for _, a, _ in ledger(database, "x1")] == ["try", "confirm"]


def test_phase_two_is_one_way(database):
    s = server(database)
    send(s, TRY)
    send(s, CONFIRM)
    outcome, detail, _, message = send(s, CANCEL)
    assert (outcome, detail) == (FAILURE, D.OUTCOME_DETAIL_CONFLICT)
    assert "already confirmed" in message
    # And the reverse, on another branch.
    send(s, TRY, branch="b2")
    send(s, CANCEL, branch="b2")
    outcome, detail, _, message = send(s, CONFIRM, branch="b2")
    assert (outcome, detail) == (FAILURE, D.OUTCOME_DETAIL_CONFLICT)
    assert "already cancelled" in message
    assert [(b, a) for b, a, _ in ledger(database, "x1")] == [
        ("b1", "try"), ("b1", "confirm"), ("b2", "try"), ("b2", "cancel")
    ]


def test_cancel_before_try_is_an_empty_rollback_and_blocks_the_late_try(database):
    s = server(database)
    assert send(s, CANCEL)[:2] == (OK, D.OUTCOME_DETAIL_EMPTY_ROLLBACK)
    outcome, detail, _, message = send(s, TRY)
    assert (outcome, detail) == (FAILURE, D.OUTCOME_DETAIL_SUSPENDED)
    assert "suspended" in message
    assert send(s, CANCEL)[:2] == (OK, D.OUTCOME_DETAIL_DUPLICATE)
    assert ledger(database, "x1") == []


def test_a_repeat_with_another_request_is_a_conflict(database):
    s = server(database)
    send(s, TRY, payload=b"ten")
    outcome, detail, _, message = send(s, TRY, payload=b"eleven")
    assert (outcome, detail) == (FAILURE, D.OUTCOME_DETAIL_CONFLICT)
    assert "different request" in message
    assert ledger(database, "x1") == [("b1", "try", b"ten")]


def test_a_refused_try_keeps_no_effect_and_nothing_to_undo(database):
    s = server(database)
    assert send(s, TRY, handler="refuse")[:2] == (FAILURE, D.OUTCOME_DETAIL_EXECUTED)
    assert send(s, TRY, handler="refuse")[:2] == (FAILURE, D.OUTCOME_DETAIL_DUPLICATE)
    assert send(s, CONFIRM, handler="refuse")[:2] == (FAILURE, D.OUTCOME_DETAIL_OUT_OF_ORDER)
    assert send(s, CANCEL, handler="refuse")[:2] == (OK, D.OUTCOME_DETAIL_NOTHING_TO_UNDO)
    assert ledger(database, "x1") == []


def test_confirm_before_try_is_refused_and_decides_nothing(database):
    s = server(database)
    assert send(s, CONFIRM)[:2] == (FAILURE, D.OUTCOME_DETAIL_OUT_OF_ORDER)
    # The slot was not taken: once the Try ran, the Confirm runs.
    send(s, TRY)
    assert send(s, CONFIRM)[:2] == (OK, D.OUTCOME_DETAIL_EXECUTED)


def test_a_handler_error_rolls_back_and_answers_retry(database):
    failures = []

    def flaky(conn, call):
        recording(database, "try")(conn, call)
        if not failures:
            failures.append(1)
            raise RuntimeError("the database of a dependency is down")
        return dtx.Reply.ok(b"second")

    s = server(database, try_=flaky)
    outcome, _, _, message = send(s, TRY)
    assert outcome == RETRY and "dependency is down" in message
    assert ledger(database, "x1") == []
    assert send(s, TRY)[:3] == (OK, D.OUTCOME_DETAIL_EXECUTED, b"second")
    assert len(ledger(database, "x1")) == 1


def test_saga_action_and_compensation(database):
    s = server(database)
    assert send(s, COMPENSATE, handler="ship")[:2] == (OK, D.OUTCOME_DETAIL_EMPTY_ROLLBACK)
    assert send(s, ACTION, handler="ship")[:2] == (FAILURE, D.OUTCOME_DETAIL_SUSPENDED)
    send(s, ACTION, branch="b2", handler="ship")
    assert send(s, COMPENSATE, branch="b2", handler="ship")[:2] == (OK, D.OUTCOME_DETAIL_EXECUTED)
    assert send(s, COMPENSATE, branch="b2", handler="ship")[:2] == (OK, D.OUTCOME_DETAIL_DUPLICATE)
    assert [a for _, a, _ in ledger(database, "x1")] == ["action", "compensate"]


@pytest.mark.parametrize(
    "fields, code, names",
    [
        ({"xid": "bad xid"}, grpc.StatusCode.INVALID_ARGUMENT, "xid contains ' '"),
        ({"xid": "x" * 129}, grpc.StatusCode.INVALID_ARGUMENT, "limit of 128 bytes"),
        ({"branch_id": ""}, grpc.StatusCode.INVALID_ARGUMENT, "branch_id must not be empty"),
        ({"payload": b"x" * 65537}, grpc.StatusCode.INVALID_ARGUMENT, "limit of 65536 bytes"),
        ({"action": 9}, grpc.StatusCode.INVALID_ARGUMENT, "not one of TRY"),
        ({"handler": "nobody"}, grpc.StatusCode.NOT_FOUND, "no handler named 'nobody'"),
        ({"handler": "ship"}, grpc.StatusCode.FAILED_PRECONDITION, "has no try"),
    ],
)
def test_bad_input_is_rejected_with_its_code_and_writes_nothing(database, fields, code, names):
    s = server(database)
    request = dict(xid="x1", branch_id="b1", action=TRY, handler="hold", payload=b"p")
    request.update(fields)
    with pytest.raises(dtx.Rejected) as rejected:
        s.handle(wire.BranchRequest(**request))
    assert rejected.value.code == code
    assert names in str(rejected.value)
    conn = database.connect()
    cursor = conn.cursor()
    cursor.execute("SELECT count(*) FROM dtx_barrier")
    assert cursor.fetchone()[0] == 0
    conn.close()


def test_migrate_is_repeatable(database):
    database.migrate()
    conn = database.connect()
    cursor = conn.cursor()
    cursor.execute("SELECT version, description FROM dtx_migrations_barrier ORDER BY version")
    assert list(cursor.fetchall()) == [(1, "barrier"), (2, "phase two and request hash")]
    conn.close()


def test_purge_deletes_old_rows_in_batches(database):
    s = server(database)
    for i in range(5):
        send(s, TRY, branch=f"b{i}")
    assert dtx.barrier.purge_older_than(database, 0, batch=2) == 0
    assert dtx.barrier.purge_older_than(database, 2**62, batch=2) == 5
