"""dtx.reason_of: the reason of a failed coordinator call from its gRPC details or problem body
(the coordinator's own answers are checked from the Rust side, cli/tests/error_reasons.rs)."""

import grpc

from dtx import reason_of, reasons


def _field(number, value):
    """One length-delimited protobuf field."""
    return bytes([number << 3 | 2, len(value)]) + value


def _status_with(reason, domain=reasons.DOMAIN):
    info = _field(1, reason.encode()) + _field(2, domain.encode())
    detail = _field(1, b"type.googleapis.com/google.rpc.ErrorInfo") + _field(2, info)
    return bytes([1 << 3, 6]) + _field(2, b"why") + _field(3, detail)


class _Failed(grpc.RpcError):
    def __init__(self, code, trailers):
        self._code, self._trailers = code, trailers

    def code(self):
        return self._code

    def trailing_metadata(self):
        return self._trailers

    def details(self):
        return "why"


def test_the_detail_names_the_reason_and_a_bare_code_implies_one():
    details = ("grpc-status-details-bin", _status_with("ROLE_DENIED"))
    assert reason_of(_Failed(grpc.StatusCode.PERMISSION_DENIED, [details])) == "ROLE_DENIED"
    assert reason_of(_Failed(grpc.StatusCode.PERMISSION_DENIED, [])) == "TARGET_NOT_ALLOWED"
    assert reason_of(_Failed(grpc.StatusCode.UNIMPLEMENTED, [])) is None
    # Another domain's reason, or a damaged detail, falls back to the code.
    other = ("grpc-status-details-bin", _status_with("ROLE_DENIED", "example.com"))
    assert reason_of(_Failed(grpc.StatusCode.NOT_FOUND, [other])) == "UNKNOWN_TRANSACTION"
    cut = ("grpc-status-details-bin", _status_with("ROLE_DENIED")[:-3])
    assert reason_of(_Failed(grpc.StatusCode.NOT_FOUND, [cut])) == "UNKNOWN_TRANSACTION"


def test_a_problem_body_names_its_reason_by_type():
    assert reason_of({"type": "urn:dtx:reason:KEY_REUSED", "code": "ALREADY_EXISTS"}) == "KEY_REUSED"
    assert reason_of({"type": "about:blank", "code": "ABORTED"}) == "ALREADY_DECIDED"
    assert reason_of({"type": "urn:dtx:reason:NO_SUCH", "code": "NOT_FOUND"}) == "UNKNOWN_TRANSACTION"
    assert reason_of(ValueError("local")) is None


class _Flaky:
    """A stub whose Get answers UNAVAILABLE `failures` times, then OK."""

    def __init__(self, failures, code=grpc.StatusCode.UNAVAILABLE):
        self.failures, self.code, self.calls = failures, code, 0

    def Get(self, request, timeout, metadata):
        self.calls += 1
        if self.calls <= self.failures:
            raise _Failed(self.code, [])
        return "answer"


def _client_with(stub):
    import dtx
    client = dtx.Coordinator("127.0.0.1:1")
    client.stub = stub
    return client


def _raised_reason(stub):
    import dtx
    try:
        _client_with(stub).get("x")
    except dtx.CoordinatorError as e:
        return e.reason
    raise AssertionError("no error")


def test_unavailable_is_repeated_and_other_codes_are_not():
    flaky = _Flaky(3)
    assert _client_with(flaky).get("x") == "answer"
    assert flaky.calls == 4
    down = _Flaky(10)
    assert _raised_reason(down) == "UNAVAILABLE"
    assert down.calls == 5
    refused = _Flaky(10, grpc.StatusCode.NOT_FOUND)
    assert _raised_reason(refused) == "UNKNOWN_TRANSACTION"
    assert refused.calls == 1
