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


def test_tcc_and_sagas_reach_an_http_participant(coordinator, database):
    """The same handlers served as an HTTP/JSON participant: a target with a path. The client
    POSTs the Tries, the coordinator the Confirms, Cancels, actions and compensations."""
    service = (
        dtx.ParticipantServer(database)
        .tcc("hold", recording(database, "try"), recording(database, "confirm"),
             recording(database, "cancel"))
        .tcc("refuse", refusing(database, "try"), recording(database, "confirm"),
             recording(database, "cancel"))
        .saga("ship", recording(database, "action"), recording(database, "compensate"))
        .saga("fail", refusing(database, "action"), recording(database, "compensate"))
    )
    server, port = service.serve_http()
    target = f"http://127.0.0.1:{port}/dtx/branch"
    try:
        with coordinator.tcc(timeout_s=20) as tx:
            assert tx.call(target, "hold", b"one") == b"done:one"
        assert coordinator.get(tx.xid).status == wire.TX_STATUS_COMMITTED
        assert effects(database, tx.xid) == [("b1", "try"), ("b1", "confirm")]
        with pytest.raises(dtx.BranchRefused):
            with coordinator.tcc(timeout_s=20) as tx:
                tx.call(target, "hold", b"one")
                tx.call(target, "refuse", b"two")
        assert coordinator.wait(tx.xid, timeout_s=20).status == wire.TX_STATUS_ROLLED_BACK
        assert effects(database, tx.xid) == [("b1", "try"), ("b1", "cancel")]
        # A problem body proves nothing (a proxy, another replica): the Try is left in doubt
        # after its retries, never taken for a refusal.
        with pytest.raises(dtx.BranchInDoubt, match="HTTP 404 NOT_FOUND"):
            with coordinator.tcc(timeout_s=20, try_retries=1, wait=False) as tx:
                tx.call(target, "nope", b"x")

        done = (
            coordinator.saga(xid="py-http-ok")
            .step("reserve", target, "ship", b"r")
            .step("charge", target, "ship", b"c")
            .run(timeout_s=20)
        )
        assert done.status == wire.TX_STATUS_SUCCEEDED, done
        assert [a for _, a in effects(database, "py-http-ok")] == ["action", "action"]
        done = (
            coordinator.saga(xid="py-http-undo")
            .step("reserve", target, "ship", b"r")
            .step("charge", target, "fail", b"c")
            .run(timeout_s=20)
        )
        assert done.status == wire.TX_STATUS_COMPENSATED, done
        assert [a for _, a in effects(database, "py-http-undo")] == ["action", "compensate"]
    finally:
        server.shutdown()


def test_the_http_participant_answers_bad_input_with_problem_json(database):
    import json
    import urllib.error
    import urllib.request

    service = dtx.ParticipantServer(database).saga(
        "ship", recording(database, "action"), recording(database, "compensate")
    )
    server, port = service.serve_http()

    def post(body):
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/dtx/branch", data=body,
            headers={"content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        ok = {"xid": "h1", "branchId": "s1", "action": "BRANCH_ACTION_ACTION", "handler": "ship",
              "payload": "cA=="}
        assert post(json.dumps(ok).encode()) == (
            200, {"outcome": "OUTCOME_SUCCESS", "result": "ZG9uZTpw", "detail": "OUTCOME_DETAIL_EXECUTED"}
        )
        status, problem = post(json.dumps(dict(ok, handler="nope")).encode())
        assert (status, problem["code"]) == (404, "NOT_FOUND"), problem
        status, problem = post(json.dumps(dict(ok, xid="")).encode())
        assert (status, problem["code"]) == (400, "INVALID_ARGUMENT"), problem
        assert "xid" in problem["detail"]
        status, problem = post(b"{not json")
        assert (status, problem["code"]) == (400, "INVALID_ARGUMENT"), problem
        assert [a for _, a in effects(database, "h1")] == ["action"]
    finally:
        server.shutdown()
