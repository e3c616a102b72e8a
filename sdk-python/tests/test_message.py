"""Two-phase messages at the initiator's barrier, on SQLite, PostgreSQL and MariaDB (the Python
side of ``tests/tests/message_check_back.rs``): the local transaction takes the message's slot
next to its business change, the coordinator's check-back takes it when the local transaction
did not commit; the check-back says "deliver" exactly when the business change committed."""

import threading
import time

import grpc
import pytest
from conftest import ledger

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
