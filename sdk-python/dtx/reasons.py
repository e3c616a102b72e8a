"""Why a coordinator call failed: the stable reason names of ``dtx_proto::reason`` (the README's
table of error reasons).

The coordinator sends the reason in the gRPC status details, a ``google.rpc.ErrorInfo`` of
domain ``dtx.v1`` (trailer ``grpc-status-details-bin``), and over HTTP/JSON as the problem
body's ``type`` (``urn:dtx:reason:<REASON>``). A status without it has the reason its code
implies. The two messages are decoded here from their few fields, so the package needs no
googleapis dependency.
"""

import grpc

DOMAIN = "dtx.v1"
PROBLEM_TYPE_PREFIX = "urn:dtx:reason:"

# Every reason with the gRPC code it is sent with, in the order of ``dtx_proto::reason::TABLE``
# (a cross-language test checks they agree). A bare code implies its first reason.
TABLE = (
    ("INVALID_REQUEST", grpc.StatusCode.INVALID_ARGUMENT),
    ("UNKNOWN_TRANSACTION", grpc.StatusCode.NOT_FOUND),
    ("UNKNOWN_METHOD", grpc.StatusCode.NOT_FOUND),
    ("KEY_REUSED", grpc.StatusCode.ALREADY_EXISTS),
    ("ALREADY_DECIDED", grpc.StatusCode.ABORTED),
    ("WRONG_STATE", grpc.StatusCode.FAILED_PRECONDITION),
    ("TARGET_NOT_ALLOWED", grpc.StatusCode.PERMISSION_DENIED),
    ("ROLE_DENIED", grpc.StatusCode.PERMISSION_DENIED),
    ("UNAUTHENTICATED", grpc.StatusCode.UNAUTHENTICATED),
    ("QUOTA_EXCEEDED", grpc.StatusCode.RESOURCE_EXHAUSTED),
    ("UNAVAILABLE", grpc.StatusCode.UNAVAILABLE),
    ("INTERNAL", grpc.StatusCode.INTERNAL),
)
REASONS = frozenset(name for name, _ in TABLE)
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


def implied_by(code):
    """The reason a bare ``grpc.StatusCode`` stands for, or ``None``."""
    return next((name for name, c in TABLE if c == code), None)


def reason_of(error):
    """The reason name of a failed call: a ``CoordinatorError``, a ``grpc.RpcError``, or a
    problem body (a ``dict`` decoded from ``application/problem+json``); ``None`` when it
    names none."""
    reason = getattr(error, "reason", None)
    if isinstance(reason, str):
        return reason
    if isinstance(error, dict):
        kind = error.get("type", "")
        if kind.startswith(PROBLEM_TYPE_PREFIX) and kind[len(PROBLEM_TYPE_PREFIX):] in REASONS:
            return kind[len(PROBLEM_TYPE_PREFIX):]
        code = getattr(grpc.StatusCode, str(error.get("code", "")), None)
        return implied_by(code)
    if isinstance(error, grpc.RpcError):
        return _of_rpc_error(error)
    return None


def _of_rpc_error(error):
    trailers = error.trailing_metadata() or ()
    for key, value in trailers:
        if key == "grpc-status-details-bin":
            found = _error_info_reason(value)
            if found:
                return found
    return implied_by(error.code())


def _error_info_reason(status_bytes):
    """The dtx reason in an encoded ``google.rpc.Status``'s ``ErrorInfo`` detail, if any."""
    try:
        for number, value in _fields(status_bytes):
            if number != 3:  # Status.details: repeated Any
                continue
            any_fields = dict(_fields(value))
            if any_fields.get(1, b"").decode() != _ERROR_INFO:
                continue
            info = dict(_fields(any_fields.get(2, b"")))
            reason, domain = info.get(1, b"").decode(), info.get(2, b"").decode()
            if domain == DOMAIN and reason in REASONS:
                return reason
    except (ValueError, IndexError, UnicodeDecodeError):
        return None
    return None


def _fields(data):
    """The (field number, value) pairs of an encoded message: varints as ints,
    length-delimited fields as bytes (the only wire types these messages use)."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _varint(data, pos)
        elif wire_type == 2:
            length, pos = _varint(data, pos)
            value, pos = bytes(data[pos:pos + length]), pos + length
            if pos > len(data):
                raise ValueError("truncated field")
        else:
            raise ValueError(f"wire type {wire_type}")
        yield number, value


def _varint(data, pos):
    result, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
