"""The wire contract's limits (proto/proto/dtx/v1/dtx.proto, `dtx_proto::limits` in Rust).

Checked before anything is written, with the same messages as the Rust SDK, so a bad call is
refused the same way whichever language serves it.
"""

import re

MAX_XID_LEN = 128
MAX_TENANT_LEN = 32
MAX_BRANCH_ID_LEN = 64
MAX_HANDLER_LEN = 128
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_HEADERS = 32
MAX_HEADER_KEY_LEN = 64
MAX_HEADER_VALUE_LEN = 1024
#: Most items in one ``Participant.BranchBatch`` call.
MAX_BATCH_ITEMS = 64

_ID = (re.compile(r"[A-Za-z0-9._:-]"), "[A-Za-z0-9._:-]")
_TENANT = (re.compile(r"[A-Za-z0-9._-]"), "[A-Za-z0-9._-]")
_HANDLER = (re.compile(r"[A-Za-z0-9._:/-]"), "[A-Za-z0-9._:/-]")
_HEADER_KEY = (re.compile(r"[A-Za-z0-9._-]"), "[A-Za-z0-9._-]")


class LimitError(ValueError):
    """A value outside the contract's limits; the message names the field and the limit."""


def _token(field, value, limit, charset):
    pattern, described = charset
    if not value:
        raise LimitError(f"{field} must not be empty")
    size = len(value.encode())
    if size > limit:
        raise LimitError(f"{field} is {size} bytes, longer than the limit of {limit} bytes")
    for char in value:
        if not pattern.fullmatch(char):
            raise LimitError(f"{field} contains {char!r}, outside the allowed charset {described}")


def check_xid(xid):
    _token("xid", xid, MAX_XID_LEN, _ID)


def check_scoped_xid(xid):
    """An xid as participants receive it: ``xid``, or ``tenant/xid`` for a tenant other than
    the default one; at most 128 bytes together."""
    tenant, sep, rest = xid.partition("/")
    if not sep or len(xid.encode()) > MAX_XID_LEN:
        check_xid(xid)
        return
    _token("tenant", tenant, MAX_TENANT_LEN, _TENANT)
    check_xid(rest)


def check_branch_id(field, branch_id):
    _token(field, branch_id, MAX_BRANCH_ID_LEN, _ID)


def check_handler(field, handler):
    _token(field, handler, MAX_HANDLER_LEN, _HANDLER)


def check_payload(field, payload):
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise LimitError(
            f"{field} is {len(payload)} bytes, larger than the limit of {MAX_PAYLOAD_BYTES} bytes"
        )


def check_headers(field, headers):
    if len(headers) > MAX_HEADERS:
        raise LimitError(
            f"{field} has {len(headers)} entries, more than the limit of {MAX_HEADERS}"
        )
    for key, value in headers.items():
        _token(f"{field} key", key, MAX_HEADER_KEY_LEN, _HEADER_KEY)
        size = len(value.encode())
        if size > MAX_HEADER_VALUE_LEN:
            raise LimitError(
                f"{field} value of {key!r} is {size} bytes, longer than the limit of "
                f"{MAX_HEADER_VALUE_LEN} bytes"
            )
