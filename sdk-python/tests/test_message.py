"""Two-phase messages at the initiator's barrier, on SQLite, PostgreSQL and MariaDB (the Python
side of ``tests/tests/message_check_back.rs``): the local transaction takes the message's slot
next to its business change, the coordinator's check-back takes it when the local transaction
did not commit; the check-back says "deliver" exactly when the business change committed."""

import threading
import time

import grpc
import pytest
from conftest import ledger, recording

import dtx
from dtx.v1 import dtx_pb2 as wire


def local_transaction(db, xid, hold=0.0):
    """An order (a ledger row) and the message's slot; True if it committed, False if a
    check-back had dropped the message (then nothing committed)."""
    try:
        with db.transaction() as tx:
            tx.execute(
                "INSERT INTO ledger (xid, branch_id, action, payload) VALUES (?, ?, ?, ?)",
                (xid, "order", "order", b""),
            )
            assert dtx.prepare_message(tx, xid) == dtx.Prepared.FRESH
            time.sleep(hold)
        return True
    except dtx.MessageDropped:
        return False


def check_back(server, xid):
    """The coordinator's check-back as the participant server answers it: (deliver, detail)."""
    response = server.handle(
        wire.BranchRequest(
            xid=xid, branch_id="msg", action=wire.BRANCH_ACTION_CHECK_BACK, handler="orders"
        )
    )
    assert response.outcome != wire.OUTCOME_RETRY, response.message
    return response.outcome == wire.OUTCOME_SUCCESS, response.detail


def orders(db, xid):
    return len(ledger(db, xid))


def test_a_committed_message_is_delivered_and_not_run_twice(database):
    server = dtx.ParticipantServer(database).message_check_back("orders")
    assert local_transaction(database, "m-1")
    assert check_back(server, "m-1") == (True, wire.OUTCOME_DETAIL_DUPLICATE)
    assert check_back(server, "m-1")[0]
    with pytest.raises(RuntimeError), database.transaction() as tx:
        assert dtx.prepare_message(tx, "m-1") == dtx.Prepared.ALREADY_COMMITTED
        raise RuntimeError("roll back")
    assert orders(database, "m-1") == 1


def test_a_check_back_first_drops_the_message_and_the_late_commit(database):
    server = dtx.ParticipantServer(database).message_check_back("orders")
    assert check_back(server, "m-2") == (False, wire.OUTCOME_DETAIL_EMPTY_ROLLBACK)
    assert not local_transaction(database, "m-2"), "the late local transaction committed"
    assert orders(database, "m-2") == 0
    assert check_back(server, "m-2") == (False, wire.OUTCOME_DETAIL_DUPLICATE)
    # A check-back needs a registered check-back handler; the barrier refuses to run one as a
    # branch call.
    with pytest.raises(dtx.Rejected) as refused:
        dtx.ParticipantServer(database).handle(
            wire.BranchRequest(
                xid="m-2", branch_id="msg", action=wire.BRANCH_ACTION_CHECK_BACK, handler="x"
            )
        )
    assert refused.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(dtx.BarrierError), database.transaction() as tx:
        dtx.call(tx, dtx.BranchKey("m-2", "msg", dtx.Action.CHECK_BACK), lambda conn: None)


def test_a_local_transaction_racing_its_check_back_is_never_a_guess(database):
    server = dtx.ParticipantServer(database).message_check_back("orders")
    delivered = dropped = 0
    for round_ in range(40):
        xid = f"race-{round_}"
        local_start = (round_ * 7919) % 4000 / 1e6
        check_start = (round_ * 104_729) % 4000 / 1e6
        hold = (round_ * 1_299_709) % 3000 / 1e6
        results = {}

        def local():
            time.sleep(local_start)
            while True:
                try:
                    results["committed"] = local_transaction(database, xid, hold)
                    return
                except Exception as e:  # a lost lock conflict runs again
                    if not database.is_lock_conflict(e):
                        results["error"] = e
                        return

        def checking():
            time.sleep(check_start)
            results["deliver"] = check_back(server, xid)[0]

        threads = [threading.Thread(target=local), threading.Thread(target=checking)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert "error" not in results, results
        committed, deliver = results["committed"], results["deliver"]
        assert (committed, orders(database, xid)) == (deliver, int(deliver)), (
            f"round {round_}: committed {committed}, deliver {deliver}"
        )
        assert check_back(server, xid)[0] == deliver
        delivered += deliver
        dropped += not deliver
    assert delivered and dropped, f"{delivered} delivered, {dropped} dropped: no race"


# -- a Python initiator against the real coordinator ---------------------------------------


@pytest.fixture
def orders_service(database):
    """``(database, target)`` of a served order service: it answers its messages'
    check-backs (``orders``) and takes their deliveries (``ship``, writing a ledger row)."""
    service = (
        dtx.ParticipantServer(database)
        .message_check_back("orders")
        .saga("ship", recording(database, "action"), recording(database, "compensate"))
    )
    server, port = service.serve()
    try:
        yield database, f"http://127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def order_message(coordinator, target, xid):
    """Ship ``b1``, then ``b2``; checked back 300 ms after it was prepared."""
    return (
        coordinator.message(target, "orders", xid=xid, check_back_after_s=0.3)
        .branch("b1", target, "ship", b"one")
        .branch("b2", target, "ship", b"two", after=["b1"])
        .retry(initial_backoff_ms=50, max_backoff_ms=200)
    )


def place_order(xid):
    def body(tx):
        tx.execute(
            "INSERT INTO ledger (xid, branch_id, action, payload) VALUES (?, ?, ?, ?)",
            (xid, "order", "order", b""),
        )
        return "placed"

    return body


def placed(db, xid):
    return sum(1 for _, a, _ in ledger(db, xid) if a == "order")


def deliveries(db, xid):
    return sorted((b, a) for b, a, _ in ledger(db, xid) if a != "order")


def test_a_python_initiator_delivers_exactly_when_its_order_commits(coordinator, orders_service):
    db, target = orders_service
    assert order_message(coordinator, target, "py-m1").do_and_submit(db, place_order("py-m1")) \
        == "placed"
    assert coordinator.wait("py-m1", timeout_s=20).status == wire.TX_STATUS_COMMITTED
    assert deliveries(db, "py-m1") == [("b1", "action"), ("b2", "action")]
    assert placed(db, "py-m1") == 1
    # Run again (a retried request): the order is not placed twice.
    again = order_message(coordinator, target, "py-m1").do_and_submit(db, place_order("py-m1"))
    assert again == dtx.Prepared.ALREADY_COMMITTED
    assert placed(db, "py-m1") == 1

    # The body raises: rolled back, aborted, nothing delivered.
    def out_of_stock(tx):
        place_order("py-m2")(tx)
        raise RuntimeError("out of stock")

    with pytest.raises(RuntimeError):
        order_message(coordinator, target, "py-m2").do_and_submit(db, out_of_stock)
    assert coordinator.wait("py-m2", timeout_s=20).status == wire.TX_STATUS_ROLLED_BACK
    assert ledger(db, "py-m2") == []


def test_a_silent_python_initiator_is_checked_back(coordinator, orders_service):
    db, target = orders_service
    # Committed, never submitted: the check-back finds the order and delivers.
    committed = order_message(coordinator, target, "py-m3").prepare()
    with db.transaction() as tx:
        dtx.prepare_message(tx, committed.branch_xid)
        place_order("py-m3")(tx)
    assert coordinator.wait("py-m3", timeout_s=20).status == wire.TX_STATUS_COMMITTED
    assert deliveries(db, "py-m3") == [("b1", "action"), ("b2", "action")]

    # Rolled back, never aborted: the check-back drops it; a late commit cannot happen.
    silent = order_message(coordinator, target, "py-m4").prepare()
    with pytest.raises(RuntimeError), db.transaction() as tx:
        dtx.prepare_message(tx, silent.branch_xid)
        place_order("py-m4")(tx)
        raise RuntimeError("the process died here")
    assert coordinator.wait("py-m4", timeout_s=20).status == wire.TX_STATUS_ROLLED_BACK
    assert not local_transaction(db, silent.branch_xid)
    assert ledger(db, "py-m4") == []
