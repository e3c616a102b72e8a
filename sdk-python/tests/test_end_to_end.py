"""Python participants and the Python client against the real coordinator binary: TCC commit
and rollback, a saga that completes and one that compensates. Effects are read from the ledger
the participant handlers write in the barrier's transaction."""

import pytest
from conftest import ledger, recording, refusing

import dtx
from dtx.v1 import dtx_pb2 as wire


@pytest.fixture
def participant(database):
    """``(database, target)`` of a served participant: TCC ``hold`` / ``refuse``, saga ``ship``
    / ``fail``."""
    service = (
        dtx.ParticipantServer(database)
        .tcc("hold", recording(database, "try"), recording(database, "confirm"),
             recording(database, "cancel"))
        .tcc("refuse", refusing(database, "try"), recording(database, "confirm"),
             recording(database, "cancel"))
        .saga("ship", recording(database, "action"), recording(database, "compensate"))
        .saga("fail", refusing(database, "action"), recording(database, "compensate"))
    )
    server, port = service.serve()
    try:
        yield database, f"http://127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def effects(db, xid):
    return [(b, a) for b, a, _ in ledger(db, xid)]


def test_tcc_commit_confirms_every_branch(coordinator, participant):
    db, target = participant
    with coordinator.tcc(timeout_s=20) as tx:
        assert tx.call(target, "hold", b"one") == b"done:one"
        tx.call(target, "hold", b"two")
    assert coordinator.get(tx.xid).status == wire.TX_STATUS_COMMITTED
    assert sorted(effects(db, tx.xid)) == [
        ("b1", "confirm"), ("b1", "try"), ("b2", "confirm"), ("b2", "try")
    ]


def test_a_refused_try_rolls_the_transaction_back(coordinator, participant):
    db, target = participant
    with pytest.raises(dtx.BranchRefused):
        with coordinator.tcc(timeout_s=20) as tx:
            tx.call(target, "hold", b"one")
            tx.call(target, "refuse", b"two")
    done = coordinator.wait(tx.xid, timeout_s=20)
    assert done.status == wire.TX_STATUS_ROLLED_BACK
    # b1 is cancelled; b2's Try was refused (its write undone) and its Cancel is empty.
    assert effects(db, tx.xid) == [("b1", "try"), ("b1", "cancel")]


def test_a_saga_runs_every_step(coordinator, participant):
    db, target = participant
    done = (
        coordinator.saga(xid="py-saga-ok")
        .step("reserve", target, "ship", b"r")
        .step("charge", target, "ship", b"c", after=["reserve"])
        .run(timeout_s=20)
    )
    assert done.status == wire.TX_STATUS_SUCCEEDED, done
    assert [a for _, a in effects(db, "py-saga-ok")] == ["action", "action"]


def test_a_refused_step_compensates_the_ones_before(coordinator, participant):
    db, target = participant
    done = (
        coordinator.saga(xid="py-saga-undo")
        .step("reserve", target, "ship", b"r")
        .step("charge", target, "fail", b"c", after=["reserve"])
        .run(timeout_s=20)
    )
    assert done.status == wire.TX_STATUS_COMPENSATED, done
    assert [a for _, a in effects(db, "py-saga-undo")] == ["action", "compensate"]
