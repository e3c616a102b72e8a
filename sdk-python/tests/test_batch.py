"""``Participant.BranchBatch`` on the Python participant server: every item gets the answer it
would get alone (the ledger its handlers write is the proof), the items share one local
transaction, and a real coordinator that lets one call out at a time sends the calls that come
due meanwhile as one batch."""

import threading
import time
from concurrent import futures

import grpc
import pytest
from conftest import ledger, recording, refusing, run_coordinator

import dtx
from dtx.v1 import dtx_pb2 as wire
from dtx.v1 import dtx_pb2_grpc

ACTION, COMPENSATE = wire.BRANCH_ACTION_ACTION, wire.BRANCH_ACTION_COMPENSATE


class Batches(dtx.ParticipantServer):
    """Records the size of every batch it is sent."""

    def __init__(self, database):
        super().__init__(database)
        self.sizes = []

    def handle_batch(self, items):
        self.sizes.append(len(items))
        return super().handle_batch(items)


def erring_once(db, action):
    """A recording handler that raises on its first call of each xid, then records."""
    record, seen = recording(db, action), set()

    def handler(conn, call):
        if call.xid not in seen:
            seen.add(call.xid)
            raise RuntimeError("injected handler error")
        return record(conn, call)

    return handler


@pytest.fixture
def served(database):
    """``(database, service, stub)``: saga handlers ``ship`` (records), ``fail`` (refuses) and
    ``flaky`` (raises once per xid)."""
    service = (
        Batches(database)
        .saga("ship", recording(database, "action"), recording(database, "compensate"))
        .saga("fail", refusing(database, "action"), recording(database, "compensate"))
        .saga("flaky", erring_once(database, "action"), recording(database, "compensate"))
    )
    server, port = service.serve()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield database, service, dtx_pb2_grpc.ParticipantStub(channel)
    finally:
        channel.close()
        server.stop(grace=None)


def item(xid, handler, action=ACTION, payload=b"p"):
    request = wire.BranchRequest(
        xid=xid, branch_id="s1", action=action, handler=handler, payload=payload
    )
    return wire.BranchBatchItem(request=request)


def batch(stub, *items):
    return stub.BranchBatch(wire.BranchBatchRequest(items=items), timeout=30).answers


def outcomes(answers):
    return [
        (grpc.StatusCode.OK.value[0], a.response.outcome, a.response.detail) if a.code == 0
        else (a.code, None, None)
        for a in answers
    ]


OK = grpc.StatusCode.OK.value[0]
EXECUTED, DUPLICATE = wire.OUTCOME_DETAIL_EXECUTED, wire.OUTCOME_DETAIL_DUPLICATE
SUCCESS, FAILURE, RETRY = wire.OUTCOME_SUCCESS, wire.OUTCOME_FAILURE, wire.OUTCOME_RETRY


def test_each_item_gets_its_own_answer_and_a_repeat_is_answered_from_the_barrier(served):
    db, _, stub = served
    items = [
        item("x-ok", "ship"),
        item("x-refused", "fail"),
        item("x-unknown", "no-such-handler"),
        item("x-bad", "ship", payload=b"x" * (dtx.limits.MAX_PAYLOAD_BYTES + 1)),
        item("x-ok2", "ship"),
        item("x-undo", "ship", action=COMPENSATE),
    ]
    first = outcomes(batch(stub, *items))
    assert first == [
        (OK, SUCCESS, EXECUTED),
        (OK, FAILURE, EXECUTED),
        (grpc.StatusCode.NOT_FOUND.value[0], None, None),
        (grpc.StatusCode.INVALID_ARGUMENT.value[0], None, None),
        (OK, SUCCESS, EXECUTED),
        (OK, SUCCESS, wire.OUTCOME_DETAIL_EMPTY_ROLLBACK),
    ]
    # The refusal undid its own write and nothing of its neighbours'.
    for xid, rows in [("x-ok", 1), ("x-refused", 0), ("x-unknown", 0), ("x-bad", 0),
                      ("x-ok2", 1), ("x-undo", 0)]:
        assert len(ledger(db, xid)) == rows, xid
    again = outcomes(batch(stub, *items))
    assert [a[2] for a in again if a[0] == OK] == [DUPLICATE] * 4
    assert len(ledger(db, "x-ok")) == 1


def test_an_erring_item_sends_the_batch_to_run_alone_and_nothing_runs_twice(served):
    db, _, stub = served
    answers = outcomes(batch(stub, item("e-1", "ship"), item("e-2", "flaky"), item("e-3", "ship")))
    # The shared transaction rolled back; the flaky item's one error was spent there, so alone
    # it runs and records once, like its neighbours: no answer claims a rolled-back effect.
    assert answers == [(OK, SUCCESS, EXECUTED)] * 3
    for xid in ["e-1", "e-2", "e-3"]:
        assert len(ledger(db, xid)) == 1, xid


def test_a_batch_over_the_limit_is_refused_whole(served):
    db, _, stub = served
    items = [item(f"l-{i}", "ship") for i in range(dtx.limits.MAX_BATCH_ITEMS + 1)]
    with pytest.raises(grpc.RpcError) as refused:
        batch(stub, *items)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(dtx.limits.MAX_BATCH_ITEMS) in refused.value.details()
    assert ledger(db, "l-0") == []


def test_a_coordinator_sends_calls_due_together_as_one_batch(tmp_path, database):
    held = threading.Event()

    def slow_first(conn, call):
        # The first call is held, so the other sagas' steps come due while it is out.
        if not held.is_set():
            held.set()
            time.sleep(0.3)
        return recording(database, "action")(conn, call)

    service = Batches(database).saga(
        "ship", slow_first, recording(database, "compensate")
    )
    server, port = service.serve()
    target = f"http://127.0.0.1:{port}"
    coordinator = run_coordinator(
        tmp_path, "--branch-batch-in-flight", "1", "--branch-batch-wait", "2s"
    )
    client = next(coordinator)
    try:
        def saga(i):
            return (
                client.saga(xid=f"py-batch-{i}")
                .step("s1", target, "ship", b"a")
                .step("s2", target, "ship", b"b", after=["s1"])
                .run(timeout_s=30)
            )

        with futures.ThreadPoolExecutor(8) as pool:
            done = list(pool.map(saga, range(8)))
        assert all(d.status == wire.TX_STATUS_SUCCEEDED for d in done), done
        for i in range(8):
            assert [a for _, a, _ in ledger(database, f"py-batch-{i}")] == ["action", "action"]
        assert service.sizes and max(service.sizes) > 1, service.sizes
    finally:
        coordinator.close()
        server.stop(grace=None)
