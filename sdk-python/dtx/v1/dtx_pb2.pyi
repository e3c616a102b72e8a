from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TxKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TX_KIND_UNSPECIFIED: _ClassVar[TxKind]
    TX_KIND_TCC: _ClassVar[TxKind]
    TX_KIND_SAGA: _ClassVar[TxKind]
    TX_KIND_MESSAGE: _ClassVar[TxKind]

class TxStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TX_STATUS_UNSPECIFIED: _ClassVar[TxStatus]
    TX_STATUS_TRYING: _ClassVar[TxStatus]
    TX_STATUS_COMMITTING: _ClassVar[TxStatus]
    TX_STATUS_COMMITTED: _ClassVar[TxStatus]
    TX_STATUS_ROLLING_BACK: _ClassVar[TxStatus]
    TX_STATUS_ROLLED_BACK: _ClassVar[TxStatus]
    TX_STATUS_RUNNING: _ClassVar[TxStatus]
    TX_STATUS_SUCCEEDED: _ClassVar[TxStatus]
    TX_STATUS_COMPENSATING: _ClassVar[TxStatus]
    TX_STATUS_COMPENSATED: _ClassVar[TxStatus]
    TX_STATUS_NEEDS_ATTENTION: _ClassVar[TxStatus]
    TX_STATUS_PREPARED: _ClassVar[TxStatus]

class BranchStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BRANCH_STATUS_UNSPECIFIED: _ClassVar[BranchStatus]
    BRANCH_STATUS_PENDING: _ClassVar[BranchStatus]
    BRANCH_STATUS_IN_DOUBT: _ClassVar[BranchStatus]
    BRANCH_STATUS_DONE: _ClassVar[BranchStatus]
    BRANCH_STATUS_REFUSED: _ClassVar[BranchStatus]
    BRANCH_STATUS_CONFIRMED: _ClassVar[BranchStatus]
    BRANCH_STATUS_CANCELLED: _ClassVar[BranchStatus]
    BRANCH_STATUS_COMPENSATED: _ClassVar[BranchStatus]
    BRANCH_STATUS_STUCK: _ClassVar[BranchStatus]
    BRANCH_STATUS_SKIPPED: _ClassVar[BranchStatus]

class BranchAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BRANCH_ACTION_UNSPECIFIED: _ClassVar[BranchAction]
    BRANCH_ACTION_TRY: _ClassVar[BranchAction]
    BRANCH_ACTION_CONFIRM: _ClassVar[BranchAction]
    BRANCH_ACTION_CANCEL: _ClassVar[BranchAction]
    BRANCH_ACTION_ACTION: _ClassVar[BranchAction]
    BRANCH_ACTION_COMPENSATE: _ClassVar[BranchAction]
    BRANCH_ACTION_CHECK_BACK: _ClassVar[BranchAction]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_SUCCESS: _ClassVar[Outcome]
    OUTCOME_FAILURE: _ClassVar[Outcome]
    OUTCOME_RETRY: _ClassVar[Outcome]

class OutcomeDetail(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_DETAIL_UNSPECIFIED: _ClassVar[OutcomeDetail]
    OUTCOME_DETAIL_EXECUTED: _ClassVar[OutcomeDetail]
    OUTCOME_DETAIL_DUPLICATE: _ClassVar[OutcomeDetail]
    OUTCOME_DETAIL_EMPTY_ROLLBACK: _ClassVar[OutcomeDetail]
    OUTCOME_DETAIL_SUSPENDED: _ClassVar[OutcomeDetail]
    OUTCOME_DETAIL_NOTHING_TO_UNDO: _ClassVar[OutcomeDetail]
    OUTCOME_DETAIL_OUT_OF_ORDER: _ClassVar[OutcomeDetail]
    OUTCOME_DETAIL_CONFLICT: _ClassVar[OutcomeDetail]

class HistoryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HISTORY_KIND_UNSPECIFIED: _ClassVar[HistoryKind]
    HISTORY_KIND_CREATED: _ClassVar[HistoryKind]
    HISTORY_KIND_REGISTERED: _ClassVar[HistoryKind]
    HISTORY_KIND_DECIDED: _ClassVar[HistoryKind]
    HISTORY_KIND_STATUS: _ClassVar[HistoryKind]
    HISTORY_KIND_BRANCH: _ClassVar[HistoryKind]
    HISTORY_KIND_ATTEMPT_FAILED: _ClassVar[HistoryKind]
    HISTORY_KIND_ATTEMPT_UNKNOWN: _ClassVar[HistoryKind]
    HISTORY_KIND_TAKEOVER: _ClassVar[HistoryKind]
    HISTORY_KIND_OPERATOR: _ClassVar[HistoryKind]
TX_KIND_UNSPECIFIED: TxKind
TX_KIND_TCC: TxKind
TX_KIND_SAGA: TxKind
TX_KIND_MESSAGE: TxKind
TX_STATUS_UNSPECIFIED: TxStatus
TX_STATUS_TRYING: TxStatus
TX_STATUS_COMMITTING: TxStatus
TX_STATUS_COMMITTED: TxStatus
TX_STATUS_ROLLING_BACK: TxStatus
TX_STATUS_ROLLED_BACK: TxStatus
TX_STATUS_RUNNING: TxStatus
TX_STATUS_SUCCEEDED: TxStatus
TX_STATUS_COMPENSATING: TxStatus
TX_STATUS_COMPENSATED: TxStatus
TX_STATUS_NEEDS_ATTENTION: TxStatus
TX_STATUS_PREPARED: TxStatus
BRANCH_STATUS_UNSPECIFIED: BranchStatus
BRANCH_STATUS_PENDING: BranchStatus
BRANCH_STATUS_IN_DOUBT: BranchStatus
BRANCH_STATUS_DONE: BranchStatus
BRANCH_STATUS_REFUSED: BranchStatus
BRANCH_STATUS_CONFIRMED: BranchStatus
BRANCH_STATUS_CANCELLED: BranchStatus
BRANCH_STATUS_COMPENSATED: BranchStatus
BRANCH_STATUS_STUCK: BranchStatus
BRANCH_STATUS_SKIPPED: BranchStatus
BRANCH_ACTION_UNSPECIFIED: BranchAction
BRANCH_ACTION_TRY: BranchAction
BRANCH_ACTION_CONFIRM: BranchAction
BRANCH_ACTION_CANCEL: BranchAction
BRANCH_ACTION_ACTION: BranchAction
BRANCH_ACTION_COMPENSATE: BranchAction
BRANCH_ACTION_CHECK_BACK: BranchAction
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_SUCCESS: Outcome
OUTCOME_FAILURE: Outcome
OUTCOME_RETRY: Outcome
OUTCOME_DETAIL_UNSPECIFIED: OutcomeDetail
OUTCOME_DETAIL_EXECUTED: OutcomeDetail
OUTCOME_DETAIL_DUPLICATE: OutcomeDetail
OUTCOME_DETAIL_EMPTY_ROLLBACK: OutcomeDetail
OUTCOME_DETAIL_SUSPENDED: OutcomeDetail
OUTCOME_DETAIL_NOTHING_TO_UNDO: OutcomeDetail
OUTCOME_DETAIL_OUT_OF_ORDER: OutcomeDetail
OUTCOME_DETAIL_CONFLICT: OutcomeDetail
HISTORY_KIND_UNSPECIFIED: HistoryKind
HISTORY_KIND_CREATED: HistoryKind
HISTORY_KIND_REGISTERED: HistoryKind
HISTORY_KIND_DECIDED: HistoryKind
HISTORY_KIND_STATUS: HistoryKind
HISTORY_KIND_BRANCH: HistoryKind
HISTORY_KIND_ATTEMPT_FAILED: HistoryKind
HISTORY_KIND_ATTEMPT_UNKNOWN: HistoryKind
HISTORY_KIND_TAKEOVER: HistoryKind
HISTORY_KIND_OPERATOR: HistoryKind

class BeginRequest(_message.Message):
    __slots__ = ("xid", "timeout_ms")
    XID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    xid: str
    timeout_ms: int
    def __init__(self, xid: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class BeginResponse(_message.Message):
    __slots__ = ("xid", "deadline_unix_ms", "status")
    XID_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    xid: str
    deadline_unix_ms: int
    status: TxStatus
    def __init__(self, xid: _Optional[str] = ..., deadline_unix_ms: _Optional[int] = ..., status: _Optional[_Union[TxStatus, str]] = ...) -> None: ...

class RegisterBranchRequest(_message.Message):
    __slots__ = ("xid", "branch_id", "target", "handler", "payload", "headers", "call_timeout_ms", "begin_timeout_ms")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    XID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    HANDLER_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    CALL_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    BEGIN_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    xid: str
    branch_id: str
    target: str
    handler: str
    payload: bytes
    headers: _containers.ScalarMap[str, str]
    call_timeout_ms: int
    begin_timeout_ms: int
    def __init__(self, xid: _Optional[str] = ..., branch_id: _Optional[str] = ..., target: _Optional[str] = ..., handler: _Optional[str] = ..., payload: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, str]] = ..., call_timeout_ms: _Optional[int] = ..., begin_timeout_ms: _Optional[int] = ...) -> None: ...

class RegisterBranchResponse(_message.Message):
    __slots__ = ("branch_xid", "try_token")
    BRANCH_XID_FIELD_NUMBER: _ClassVar[int]
    TRY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    branch_xid: str
    try_token: str
    def __init__(self, branch_xid: _Optional[str] = ..., try_token: _Optional[str] = ...) -> None: ...

class DecideRequest(_message.Message):
    __slots__ = ("xid", "wait", "wait_timeout_ms")
    XID_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    xid: str
    wait: bool
    wait_timeout_ms: int
    def __init__(self, xid: _Optional[str] = ..., wait: _Optional[bool] = ..., wait_timeout_ms: _Optional[int] = ...) -> None: ...

class DecideResponse(_message.Message):
    __slots__ = ("xid", "status")
    XID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    xid: str
    status: TxStatus
    def __init__(self, xid: _Optional[str] = ..., status: _Optional[_Union[TxStatus, str]] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("max_attempts", "initial_backoff_ms", "max_backoff_ms", "call_timeout_ms")
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_BACKOFF_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BACKOFF_MS_FIELD_NUMBER: _ClassVar[int]
    CALL_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    max_attempts: int
    initial_backoff_ms: int
    max_backoff_ms: int
    call_timeout_ms: int
    def __init__(self, max_attempts: _Optional[int] = ..., initial_backoff_ms: _Optional[int] = ..., max_backoff_ms: _Optional[int] = ..., call_timeout_ms: _Optional[int] = ...) -> None: ...

class SagaStep(_message.Message):
    __slots__ = ("name", "target", "handler", "action_payload", "compensate_payload", "depends_on", "retry", "headers")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    HANDLER_FIELD_NUMBER: _ClassVar[int]
    ACTION_PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    COMPENSATE_PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    target: str
    handler: str
    action_payload: bytes
    compensate_payload: bytes
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    retry: RetryPolicy
    headers: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., target: _Optional[str] = ..., handler: _Optional[str] = ..., action_payload: _Optional[bytes] = ..., compensate_payload: _Optional[bytes] = ..., depends_on: _Optional[_Iterable[str]] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., headers: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SubmitSagaRequest(_message.Message):
    __slots__ = ("xid", "steps", "timeout_ms", "retry", "headers", "wait_timeout_ms")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    XID_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    xid: str
    steps: _containers.RepeatedCompositeFieldContainer[SagaStep]
    timeout_ms: int
    retry: RetryPolicy
    headers: _containers.ScalarMap[str, str]
    wait_timeout_ms: int
    def __init__(self, xid: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[SagaStep, _Mapping]]] = ..., timeout_ms: _Optional[int] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., headers: _Optional[_Mapping[str, str]] = ..., wait_timeout_ms: _Optional[int] = ...) -> None: ...

class SubmitSagaResponse(_message.Message):
    __slots__ = ("xid", "status", "deadline_unix_ms", "transaction")
    XID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    xid: str
    status: TxStatus
    deadline_unix_ms: int
    transaction: Transaction
    def __init__(self, xid: _Optional[str] = ..., status: _Optional[_Union[TxStatus, str]] = ..., deadline_unix_ms: _Optional[int] = ..., transaction: _Optional[_Union[Transaction, _Mapping]] = ...) -> None: ...

class MessageBranch(_message.Message):
    __slots__ = ("name", "target", "handler", "payload", "depends_on", "retry", "headers")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    HANDLER_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    target: str
    handler: str
    payload: bytes
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    retry: RetryPolicy
    headers: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., target: _Optional[str] = ..., handler: _Optional[str] = ..., payload: _Optional[bytes] = ..., depends_on: _Optional[_Iterable[str]] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., headers: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CheckBack(_message.Message):
    __slots__ = ("target", "handler")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    HANDLER_FIELD_NUMBER: _ClassVar[int]
    target: str
    handler: str
    def __init__(self, target: _Optional[str] = ..., handler: _Optional[str] = ...) -> None: ...

class PrepareMessageRequest(_message.Message):
    __slots__ = ("xid", "branches", "check_back", "check_back_after_ms", "retry", "headers")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    XID_FIELD_NUMBER: _ClassVar[int]
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    CHECK_BACK_FIELD_NUMBER: _ClassVar[int]
    CHECK_BACK_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    xid: str
    branches: _containers.RepeatedCompositeFieldContainer[MessageBranch]
    check_back: CheckBack
    check_back_after_ms: int
    retry: RetryPolicy
    headers: _containers.ScalarMap[str, str]
    def __init__(self, xid: _Optional[str] = ..., branches: _Optional[_Iterable[_Union[MessageBranch, _Mapping]]] = ..., check_back: _Optional[_Union[CheckBack, _Mapping]] = ..., check_back_after_ms: _Optional[int] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., headers: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PrepareMessageResponse(_message.Message):
    __slots__ = ("xid", "status", "branch_xid", "check_back_unix_ms")
    XID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BRANCH_XID_FIELD_NUMBER: _ClassVar[int]
    CHECK_BACK_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    xid: str
    status: TxStatus
    branch_xid: str
    check_back_unix_ms: int
    def __init__(self, xid: _Optional[str] = ..., status: _Optional[_Union[TxStatus, str]] = ..., branch_xid: _Optional[str] = ..., check_back_unix_ms: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("xid",)
    XID_FIELD_NUMBER: _ClassVar[int]
    xid: str
    def __init__(self, xid: _Optional[str] = ...) -> None: ...

class WaitRequest(_message.Message):
    __slots__ = ("xid", "timeout_ms")
    XID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    xid: str
    timeout_ms: int
    def __init__(self, xid: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("xid",)
    XID_FIELD_NUMBER: _ClassVar[int]
    xid: str
    def __init__(self, xid: _Optional[str] = ...) -> None: ...

class Branch(_message.Message):
    __slots__ = ("branch_id", "target", "handler", "status", "attempts", "last_error", "result", "depends_on")
    BRANCH_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    HANDLER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    branch_id: str
    target: str
    handler: str
    status: BranchStatus
    attempts: int
    last_error: str
    result: bytes
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, branch_id: _Optional[str] = ..., target: _Optional[str] = ..., handler: _Optional[str] = ..., status: _Optional[_Union[BranchStatus, str]] = ..., attempts: _Optional[int] = ..., last_error: _Optional[str] = ..., result: _Optional[bytes] = ..., depends_on: _Optional[_Iterable[str]] = ...) -> None: ...

class Transaction(_message.Message):
    __slots__ = ("xid", "kind", "status", "decision", "deadline_unix_ms", "created_unix_ms", "updated_unix_ms", "branches", "last_error")
    XID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    xid: str
    kind: TxKind
    status: TxStatus
    decision: str
    deadline_unix_ms: int
    created_unix_ms: int
    updated_unix_ms: int
    branches: _containers.RepeatedCompositeFieldContainer[Branch]
    last_error: str
    def __init__(self, xid: _Optional[str] = ..., kind: _Optional[_Union[TxKind, str]] = ..., status: _Optional[_Union[TxStatus, str]] = ..., decision: _Optional[str] = ..., deadline_unix_ms: _Optional[int] = ..., created_unix_ms: _Optional[int] = ..., updated_unix_ms: _Optional[int] = ..., branches: _Optional[_Iterable[_Union[Branch, _Mapping]]] = ..., last_error: _Optional[str] = ...) -> None: ...

class BranchBatchRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[BranchBatchItem]
    def __init__(self, items: _Optional[_Iterable[_Union[BranchBatchItem, _Mapping]]] = ...) -> None: ...

class BranchBatchItem(_message.Message):
    __slots__ = ("request", "call_token")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    CALL_TOKEN_FIELD_NUMBER: _ClassVar[int]
    request: BranchRequest
    call_token: str
    def __init__(self, request: _Optional[_Union[BranchRequest, _Mapping]] = ..., call_token: _Optional[str] = ...) -> None: ...

class BranchBatchResponse(_message.Message):
    __slots__ = ("answers",)
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[BranchBatchAnswer]
    def __init__(self, answers: _Optional[_Iterable[_Union[BranchBatchAnswer, _Mapping]]] = ...) -> None: ...

class BranchBatchAnswer(_message.Message):
    __slots__ = ("code", "message", "response")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    response: BranchResponse
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., response: _Optional[_Union[BranchResponse, _Mapping]] = ...) -> None: ...

class BranchRequest(_message.Message):
    __slots__ = ("xid", "branch_id", "action", "handler", "payload", "headers")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    XID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    HANDLER_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    xid: str
    branch_id: str
    action: BranchAction
    handler: str
    payload: bytes
    headers: _containers.ScalarMap[str, str]
    def __init__(self, xid: _Optional[str] = ..., branch_id: _Optional[str] = ..., action: _Optional[_Union[BranchAction, str]] = ..., handler: _Optional[str] = ..., payload: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, str]] = ...) -> None: ...

class BranchResponse(_message.Message):
    __slots__ = ("outcome", "result", "message", "detail")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    outcome: Outcome
    result: bytes
    message: str
    detail: OutcomeDetail
    def __init__(self, outcome: _Optional[_Union[Outcome, str]] = ..., result: _Optional[bytes] = ..., message: _Optional[str] = ..., detail: _Optional[_Union[OutcomeDetail, str]] = ...) -> None: ...

class ListTransactionsRequest(_message.Message):
    __slots__ = ("statuses", "kind", "xid_prefix", "created_from_unix_ms", "created_to_unix_ms", "updated_from_unix_ms", "updated_to_unix_ms", "needs_attention", "older_than_ms", "limit", "page_token")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    XID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    CREATED_FROM_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_TO_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FROM_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_TO_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    NEEDS_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    OLDER_THAN_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[TxStatus]
    kind: TxKind
    xid_prefix: str
    created_from_unix_ms: int
    created_to_unix_ms: int
    updated_from_unix_ms: int
    updated_to_unix_ms: int
    needs_attention: bool
    older_than_ms: int
    limit: int
    page_token: str
    def __init__(self, statuses: _Optional[_Iterable[_Union[TxStatus, str]]] = ..., kind: _Optional[_Union[TxKind, str]] = ..., xid_prefix: _Optional[str] = ..., created_from_unix_ms: _Optional[int] = ..., created_to_unix_ms: _Optional[int] = ..., updated_from_unix_ms: _Optional[int] = ..., updated_to_unix_ms: _Optional[int] = ..., needs_attention: _Optional[bool] = ..., older_than_ms: _Optional[int] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTransactionsResponse(_message.Message):
    __slots__ = ("transactions", "next_page_token")
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[Transaction]
    next_page_token: str
    def __init__(self, transactions: _Optional[_Iterable[_Union[Transaction, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DescribeTransactionRequest(_message.Message):
    __slots__ = ("xid",)
    XID_FIELD_NUMBER: _ClassVar[int]
    xid: str
    def __init__(self, xid: _Optional[str] = ...) -> None: ...

class AdminActionRequest(_message.Message):
    __slots__ = ("xid", "reason")
    XID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    xid: str
    reason: str
    def __init__(self, xid: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class TransactionDetail(_message.Message):
    __slots__ = ("transaction", "owner", "due_unix_ms", "history")
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    DUE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    transaction: Transaction
    owner: str
    due_unix_ms: int
    history: _containers.RepeatedCompositeFieldContainer[HistoryEvent]
    def __init__(self, transaction: _Optional[_Union[Transaction, _Mapping]] = ..., owner: _Optional[str] = ..., due_unix_ms: _Optional[int] = ..., history: _Optional[_Iterable[_Union[HistoryEvent, _Mapping]]] = ...) -> None: ...

class HistoryEvent(_message.Message):
    __slots__ = ("at_unix_ms", "kind", "branch_id", "status", "attempt", "detail", "actor")
    AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BRANCH_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    at_unix_ms: int
    kind: HistoryKind
    branch_id: str
    status: str
    attempt: int
    detail: str
    actor: str
    def __init__(self, at_unix_ms: _Optional[int] = ..., kind: _Optional[_Union[HistoryKind, str]] = ..., branch_id: _Optional[str] = ..., status: _Optional[str] = ..., attempt: _Optional[int] = ..., detail: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("counts", "needs_attention", "oldest_open_age_ms")
    class Count(_message.Message):
        __slots__ = ("kind", "status", "count")
        KIND_FIELD_NUMBER: _ClassVar[int]
        STATUS_FIELD_NUMBER: _ClassVar[int]
        COUNT_FIELD_NUMBER: _ClassVar[int]
        kind: TxKind
        status: TxStatus
        count: int
        def __init__(self, kind: _Optional[_Union[TxKind, str]] = ..., status: _Optional[_Union[TxStatus, str]] = ..., count: _Optional[int] = ...) -> None: ...
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    NEEDS_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    OLDEST_OPEN_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    counts: _containers.RepeatedCompositeFieldContainer[StatsResponse.Count]
    needs_attention: int
    oldest_open_age_ms: int
    def __init__(self, counts: _Optional[_Iterable[_Union[StatsResponse.Count, _Mapping]]] = ..., needs_attention: _Optional[int] = ..., oldest_open_age_ms: _Optional[int] = ...) -> None: ...
