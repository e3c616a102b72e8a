"""dtx for Python: the branch barrier, a participant server and an initiator client.

The same barrier table, rules and wire contract as the Rust SDK (``dtx-sdk``), so a Python
service takes part in the same TCC transactions and sagas as Rust ones.
"""

from .auth import CallRefused, CallVerifier
from .barrier import (
    Action,
    Answer,
    BarrierError,
    BranchKey,
    Detail,
    MessageDropped,
    Prepared,
    Reply,
    call,
    check_back,
    prepare_message,
    request_hash,
)
from .client import (
    BranchInDoubt,
    BranchRefused,
    ClientTls,
    Coordinator,
    CoordinatorError,
    DtxError,
    MessageBuilder,
    PreparedMessage,
)
from .db import Database, MySql, Postgres, Sqlite, from_url
from .limits import LimitError
from .reasons import reason_of
from .server import BranchCall, ParticipantServer, Rejected, ServerTls

__all__ = [
    "Action",
    "Answer",
    "BarrierError",
    "BranchCall",
    "BranchInDoubt",
    "BranchKey",
    "BranchRefused",
    "CallRefused",
    "CallVerifier",
    "ClientTls",
    "Coordinator",
    "CoordinatorError",
    "Database",
    "Detail",
    "DtxError",
    "LimitError",
    "MessageBuilder",
    "MessageDropped",
    "MySql",
    "ParticipantServer",
    "Prepared",
    "PreparedMessage",
    "Postgres",
    "Rejected",
    "Reply",
    "ServerTls",
    "Sqlite",
    "call",
    "check_back",
    "from_url",
    "prepare_message",
    "reason_of",
    "request_hash",
]
