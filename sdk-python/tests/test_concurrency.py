"""Races over real gRPC: the participant server on a port, many client threads, the barrier on
PostgreSQL and SQLite deciding who wins. The ledger the handlers write is the proof."""

import threading
from concurrent import futures

import grpc
import pytest
from conftest import ledger, recording

import dtx
from dtx.v1 import dtx_pb2 as wire
from dtx.v1 import dtx_pb2_grpc

D = wire
TRY, CONFIRM, CANCEL = wire.BRANCH_ACTION_TRY, wire.BRANCH_ACTION_CONFIRM, wire.BRANCH_ACTION_CANCEL


@pytest.fixture
def participant(database):
    """``(database, stub)``: a served participant with a ``hold`` TCC resource."""
    service = dtx.ParticipantServer(database).tcc(
        "hold", recording(database, "try"), recording(database, "confirm"),
        recording(database, "cancel"),
    )
    server, port = service.serve(max_workers=64)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield database, dtx_pb2_grpc.ParticipantStub(channel)
    finally:
        channel.close()
        server.stop(grace=None)


def branch(stub, action, xid, payload=b"p"):
    request = wire.BranchRequest(
        xid=xid, branch_id="b1", action=action, handler="hold", payload=payload
    )
    response = stub.Branch(request, timeout=60)
    return response.outcome, response.detail


def together(calls):
    """Runs the calls on their own threads, released at the same instant; their answers."""
    gate = threading.Barrier(len(calls))

    def run(call):
        gate.wait()
        return call()

    with futures.ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_fifty_identical_confirms_run_the_confirm_once(participant):
    db, stub = participant
    assert branch(stub, TRY, "x-confirms") == (wire.OUTCOME_SUCCESS, D.OUTCOME_DETAIL_EXECUTED)
    answers = together([lambda: branch(stub, CONFIRM, "x-confirms")] * 50)
    assert all(outcome == wire.OUTCOME_SUCCESS for outcome, _ in answers), answers
    details = [detail for _, detail in answers]
    assert details.count(D.OUTCOME_DETAIL_EXECUTED) == 1, details
    assert details.count(D.OUTCOME_DETAIL_DUPLICATE) == 49, details
    assert [a for _, a, _ in ledger(db, "x-confirms")] == ["try", "confirm"]


def test_a_try_racing_its_cancel_leaves_no_net_effect(participant):
    db, stub = participant
    seen = set()
    for round_ in range(30):
        xid = f"x-race-{round_}"
        try_, cancel = together([lambda: branch(stub, TRY, xid), lambda: branch(stub, CANCEL, xid)])
        effects = [a for _, a, _ in ledger(db, xid)]
        if try_[1] == D.OUTCOME_DETAIL_EXECUTED:
            # The Try won: the Cancel saw it and undid it.
            assert cancel == (wire.OUTCOME_SUCCESS, D.OUTCOME_DETAIL_EXECUTED), (round_, cancel)
            assert effects == ["try", "cancel"], (round_, effects)
        else:
            # The Cancel came first: an empty rollback, and the late Try is suspended.
            assert cancel == (wire.OUTCOME_SUCCESS, D.OUTCOME_DETAIL_EMPTY_ROLLBACK), (round_, cancel)
            assert try_ == (wire.OUTCOME_FAILURE, D.OUTCOME_DETAIL_SUSPENDED), (round_, try_)
            assert effects == [], (round_, effects)
        seen.add(try_[1])
        # A repeated Try gets the first one's outcome: the race is settled for good.
        assert branch(stub, TRY, xid)[0] == try_[0], round_
    print(f"try verdicts seen over 30 races: {sorted(seen)}")


def test_a_confirm_racing_a_cancel_lets_exactly_one_run(participant):
    db, stub = participant
    for round_ in range(10):
        xid = f"x-decide-{round_}"
        branch(stub, TRY, xid)
        confirm, cancel = together(
            [lambda: branch(stub, CONFIRM, xid), lambda: branch(stub, CANCEL, xid)]
        )
        winners = [a for a in (confirm, cancel) if a == (wire.OUTCOME_SUCCESS, D.OUTCOME_DETAIL_EXECUTED)]
        losers = [a for a in (confirm, cancel) if a == (wire.OUTCOME_FAILURE, D.OUTCOME_DETAIL_CONFLICT)]
        assert (len(winners), len(losers)) == (1, 1), (round_, confirm, cancel)
        effects = [a for _, a, _ in ledger(db, xid)]
        assert effects in (["try", "confirm"], ["try", "cancel"]), (round_, effects)
        assert (effects[1] == "confirm") == (confirm == winners[0])
