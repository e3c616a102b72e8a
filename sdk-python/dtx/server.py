"""The participant server helper: a ``dtx.v1.Participant`` gRPC service from named handlers.

For every call it opens a local transaction on the service's database, runs the handler through
the :mod:`dtx.barrier`, commits, and maps the answer to the wire, exactly as the Rust SDK's
``ParticipantServer``:

==========================================  =====================================
what happened                               wire answer
==========================================  =====================================
handler replied success / refusal           SUCCESS / FAILURE (EXECUTED)
repeat                                      stored first answer (DUPLICATE)
cancel/compensate first                     SUCCESS (EMPTY_ROLLBACK)
try/action after its cancel/compensate      FAILURE (SUSPENDED)
cancel after confirm, confirm after cancel  FAILURE (CONFLICT)
try/action repeated with another request    FAILURE (CONFLICT)
handler raised, database error              RETRY (rolled back; safe to retry)
unknown action kind, limits exceeded        gRPC INVALID_ARGUMENT
unknown handler                             gRPC NOT_FOUND
action kind the handler does not have       gRPC FAILED_PRECONDITION
==========================================  =====================================

``BranchBatch`` (several second-phase calls the coordinator sends together) runs its items in
one local transaction, each behind its own barrier row, and commits once; each item gets the
answer it would get alone (if any item raises, the transaction rolls back and every item runs
alone). See :meth:`ParticipantServer.handle_batch`.

Over HTTP/JSON instead of gRPC, :meth:`ParticipantServer.wsgi_app` (mount it in any WSGI
framework) or :meth:`ParticipantServer.serve_http` answers a step target with a path, such as
``http://billing:8000/dtx/branch``, with the same rules; a rejection is a problem+json body whose
``code`` is the gRPC code's name, as the coordinator reads it.

A handler is ``handler(conn, call) -> Reply``: ``conn`` is the driver's connection inside the
open transaction (write the business change on it), ``call`` a :class:`BranchCall`.
"""

import json
import logging
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import grpc
from google.protobuf import json_format

from . import barrier, limits
from .auth import CALL_TOKEN, CallRefused
from .barrier import Action, BranchKey
from .v1 import dtx_pb2 as wire
from .v1 import dtx_pb2_grpc

log = logging.getLogger("dtx.server")

TRACEPARENT = "traceparent"

_WIRE_ACTIONS = {
    wire.BRANCH_ACTION_TRY: Action.TRY,
    wire.BRANCH_ACTION_CONFIRM: Action.CONFIRM,
    wire.BRANCH_ACTION_CANCEL: Action.CANCEL,
    wire.BRANCH_ACTION_ACTION: Action.ACTION,
    wire.BRANCH_ACTION_COMPENSATE: Action.COMPENSATE,
    wire.BRANCH_ACTION_CHECK_BACK: Action.CHECK_BACK,
}

#: The registration of a message check-back handler (:meth:`ParticipantServer.message_check_back`).
_CHECK_BACK = object()

#: The largest request the Rust servers decode (``dtx_proto::limits::MAX_REQUEST_BYTES``).
MAX_REQUEST_BYTES = 64 * (64 + 512 + 128 + 2 * 65536 + 64 * 64 + 32 * (64 + 1024)) + (
    32 * (64 + 1024) + 128 + (1 << 20)
)


@dataclass
class BranchCall:
    """One branch call as a handler sees it."""

    xid: str
    branch_id: str
    handler: str
    action: Action
    payload: bytes
    headers: dict = field(default_factory=dict)

    @property
    def traceparent(self):
        """The W3C trace context of this call: its trace id is the transaction's."""
        return self.headers.get(TRACEPARENT)


class Rejected(Exception):
    """A call refused before anything ran: a gRPC status code and its message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class ServerTls:
    """A participant's TLS identity (PEM bytes) and, for mTLS, the CA the coordinator's client
    certificate must chain to."""

    def __init__(self, cert_pem, key_pem, client_ca_pem=None):
        self.cert_pem, self.key_pem, self.client_ca_pem = cert_pem, key_pem, client_ca_pem

    @classmethod
    def from_files(cls, cert, key, client_ca=None):
        def read(path):
            with open(path, "rb") as f:
                return f.read()

        return cls(read(cert), read(key), read(client_ca) if client_ca else None)

    def credentials(self):
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)],
            root_certificates=self.client_ca_pem,
            require_client_auth=self.client_ca_pem is not None,
        )


class ParticipantServer(dtx_pb2_grpc.ParticipantServicer):
    """Named TCC trios and saga pairs over one :class:`dtx.db.Database`."""

    def __init__(self, database, conflict_retries=5):
        self.database = database
        self.conflict_retries = conflict_retries
        self._handlers = {}
        self._calls = None

    def verify_calls(self, verifier):
        """Obeys only the coordinator: every call must carry its ``x-dtx-call-token`` for
        exactly that call, checked by ``verifier`` (a :class:`dtx.auth.CallVerifier`) before
        the barrier runs; any other call is UNAUTHENTICATED and nothing is written. The
        initiator's Try carries the token the coordinator issued at registration."""
        self._calls = verifier
        return self

    def tcc(self, name, try_, confirm, cancel):
        """Registers a TCC resource: ``name``'s try, confirm and cancel handlers."""
        self._handlers[name] = {Action.TRY: try_, Action.CONFIRM: confirm, Action.CANCEL: cancel}
        return self

    def saga(self, name, action, compensate):
        """Registers a saga step: ``name``'s action and compensation handlers."""
        self._handlers[name] = {Action.ACTION: action, Action.COMPENSATE: compensate}
        return self

    def message_check_back(self, name):
        """Answers the coordinator's check-backs of two-phase messages sent to handler ``name``
        from this server's barrier table (see :func:`dtx.barrier.check_back`)."""
        self._handlers[name] = {Action.CHECK_BACK: _CHECK_BACK}
        return self

    # -- gRPC ------------------------------------------------------------------------------

    def Branch(self, request, context):  # noqa: N802 (the generated servicer's name)
        metadata = dict(context.invocation_metadata())
        trace = metadata.get(TRACEPARENT)
        try:
            self._admit(request, metadata.get(CALL_TOKEN))
            return self.handle(request, _with_trace(request, trace))
        except Rejected as e:
            context.abort(e.code, str(e))

    def BranchBatch(self, request, context):  # noqa: N802 (the generated servicer's name)
        try:
            return self.handle_batch(request.items)
        except Rejected as e:
            context.abort(e.code, str(e))

    def serve(self, address="127.0.0.1:0", max_workers=16, tls=None):
        """Starts a gRPC server with this service; returns ``(server, port)``. With ``tls``
        (a :class:`ServerTls`) it serves TLS only, and with a client CA it requires the
        caller's (the coordinator's) certificate."""
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers),
            options=[("grpc.max_receive_message_length", MAX_REQUEST_BYTES)],
        )
        dtx_pb2_grpc.add_ParticipantServicer_to_server(self, server)
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, tls.credentials())
        if port == 0:
            raise OSError(f"could not listen on {address}")
        server.start()
        return server, port

    # -- HTTP/JSON -------------------------------------------------------------------------

    def wsgi_app(self):
        """A WSGI application answering the coordinator's HTTP/JSON branch calls: a POST of a
        ``BranchRequest`` in proto3 JSON, answered 200 with the ``BranchResponse``."""

        def app(environ, start_response):
            status, body = self._http_call(environ)
            kind = "application/json" if status == 200 else "application/problem+json"
            start_response(
                f"{status} {_REASONS[status]}",
                [("content-type", kind), ("content-length", str(len(body)))],
            )
            return [body]

        return app

    def serve_http(self, address="127.0.0.1:0"):
        """Serves :meth:`wsgi_app` on a thread per request (the standard library's server);
        returns ``(server, port)``; ``server.shutdown()`` stops it."""
        host, _, port = address.rpartition(":")
        server = make_server(
            host, int(port), self.wsgi_app(), server_class=_ThreadingServer,
            handler_class=_QuietHandler,
        )
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, server.server_port

    def _http_call(self, environ):
        if environ.get("REQUEST_METHOD") != "POST":
            return _problem(grpc.StatusCode.UNIMPLEMENTED, "branch calls are POSTs", 405)
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return _problem(grpc.StatusCode.INVALID_ARGUMENT, "content-length is not a number")
        if length > MAX_REQUEST_BYTES:
            return _problem(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"request of {length} bytes exceeds the limit of {MAX_REQUEST_BYTES} bytes",
            )
        try:
            request = json_format.Parse(environ["wsgi.input"].read(length), wire.BranchRequest())
        except (json_format.ParseError, UnicodeDecodeError) as e:
            return _problem(grpc.StatusCode.INVALID_ARGUMENT, f"not a BranchRequest: {e}")
        try:
            self._admit(request, environ.get("HTTP_X_DTX_CALL_TOKEN"))
            response = self.handle(request, _with_trace(request, environ.get("HTTP_TRACEPARENT")))
        except Rejected as e:
            return _problem(e.code, str(e))
        return 200, json_format.MessageToJson(response, indent=None).encode()

    def _admit(self, request, token):
        if self._calls is None:
            return
        try:
            self._calls.verify_request(token, request)
        except CallRefused as e:
            log.warning("xid=%s branch=%s: %s", request.xid, request.branch_id, e)
            raise Rejected(grpc.StatusCode.UNAUTHENTICATED, str(e)) from None

    # -- without gRPC ----------------------------------------------------------------------

    def handle(self, request, headers=None):
        """Answers one ``BranchRequest`` (what :meth:`Branch` does after decoding)."""
        return self._run_with_retries(*self._prepare(request, headers))

    def handle_batch(self, items):
        """Answers the items of a ``BranchBatchRequest`` (what :meth:`BranchBatch` does after
        decoding), each as :meth:`handle` would answer it alone, in order.

        Each item's call token is checked (when calls are verified) and its limits, before
        anything runs. The items run in one local transaction, each behind its own barrier row
        (a refusal rolls back to the barrier's savepoint, as alone), committed once. If any item
        raises (its handler, the database, a lock conflict) or the commit fails, the whole
        transaction rolls back and every item runs alone instead, with its own retries: an
        answer must never claim an effect that was not committed. Check-backs, which wait for
        other transactions, always run alone.
        """
        if len(items) > limits.MAX_BATCH_ITEMS:
            raise Rejected(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"items: {len(items)} is more than the limit of {limits.MAX_BATCH_ITEMS} per "
                "batch",
            )
        answers = [None] * len(items)
        together, alone = [], []
        for i, item in enumerate(items):
            try:
                self._admit(item.request, item.call_token or None)
                handler, call = self._prepare(item.request)
            except Rejected as e:
                answers[i] = wire.BranchBatchAnswer(code=e.code.value[0], message=str(e))
                continue
            (alone if handler is _CHECK_BACK else together).append((i, handler, call))
        if len(together) == 1:
            alone, together = alone + together, []
        if together:
            try:
                with self.database.transaction() as tx:
                    ran = [(i, _to_wire(_run_in(tx, handler, call))) for i, handler, call in together]
            except Exception as e:
                log.debug("batch of %d rolled back; running its items alone: %s", len(items), e)
                alone += together
            else:
                for i, response in ran:
                    answers[i] = wire.BranchBatchAnswer(response=response)
        for i, handler, call in alone:
            answers[i] = wire.BranchBatchAnswer(response=self._run_with_retries(handler, call))
        return wire.BranchBatchResponse(answers=answers)

    def _prepare(self, request, headers=None):
        """The handler of ``request`` and the call it sees; raises :class:`Rejected` with the
        status the call is answered with."""
        action = _WIRE_ACTIONS.get(request.action)
        if action is None:
            raise Rejected(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"action {request.action} is not one of TRY, CONFIRM, CANCEL, ACTION, COMPENSATE, "
                "CHECK_BACK",
            )
        headers = dict(request.headers) if headers is None else headers
        try:
            limits.check_scoped_xid(request.xid)
            limits.check_branch_id("branch_id", request.branch_id)
            limits.check_handler("handler", request.handler)
            limits.check_payload("payload", request.payload)
            limits.check_headers("headers", dict(request.headers))
        except limits.LimitError as e:
            raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        handlers = self._handlers.get(request.handler)
        if handlers is None:
            raise Rejected(grpc.StatusCode.NOT_FOUND, f"no handler named {request.handler!r}")
        handler = handlers.get(action)
        if handler is None:
            raise Rejected(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"handler {request.handler!r} has no {action.value} (TCC handlers take "
                "try/confirm/cancel, saga handlers action/compensate, message check-backs "
                "check_back)",
            )
        call = BranchCall(
            request.xid, request.branch_id, request.handler, action, bytes(request.payload), headers
        )
        return handler, call

    def _run_with_retries(self, handler, call):
        attempt = 0
        while True:
            try:
                with self.database.transaction() as tx:
                    answer = _run_in(tx, handler, call)
                return _to_wire(answer)
            except Exception as e:
                if self.database.is_lock_conflict(e) and attempt < self.conflict_retries:
                    attempt += 1
                    time.sleep(0.005 * attempt)
                    continue
                log.warning(
                    "branch %s/%s %s rolled back; answering RETRY: %s",
                    call.xid,
                    call.branch_id,
                    call.action.value,
                    e,
                )
                return wire.BranchResponse(outcome=wire.OUTCOME_RETRY, message=str(e))


def _run_in(tx, handler, call):
    """One call's barrier and handler inside ``tx``."""
    if handler is _CHECK_BACK:
        return barrier.check_back(tx, call.xid)
    # The handler name is part of the request: the same ids sent to another handler are a
    # different call. Headers are not (trace ids differ per attempt).
    key = BranchKey(
        call.xid,
        call.branch_id,
        call.action,
        barrier.request_hash(call.handler.encode(), call.payload),
    )
    return barrier.call(tx, key, lambda conn: handler(conn, call))


def _with_trace(request, trace):
    """The request's headers with the transport's trace context (as the Rust server does)."""
    headers = dict(request.headers)
    if trace and (len(headers) < limits.MAX_HEADERS or TRACEPARENT in headers):
        headers[TRACEPARENT] = trace
    return headers


#: HTTP statuses of the codes this server answers (``dtx_proto::http::STATUS_TABLE``).
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
}
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            429: "Too Many Requests", 501: "Not Implemented"}


def _problem(code, detail, status=None):
    status = status or _HTTP_STATUS[code]
    body = {"type": "about:blank", "title": _REASONS[status], "status": status,
            "detail": detail, "code": code.name}
    return status, json.dumps(body).encode()


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        log.debug("http participant: " + format, *args)


def _to_wire(answer):
    reply = answer.reply
    return wire.BranchResponse(
        outcome=wire.OUTCOME_SUCCESS if reply.success else wire.OUTCOME_FAILURE,
        result=reply.result,
        message="" if reply.success else reply.result.decode("utf-8", "replace"),
        detail=answer.detail.value,
    )
