"""The initiator client: TCC transactions and sagas through a dtx coordinator.

TCC, as the Rust SDK's ``Coordinator::tcc``::

    coordinator = Coordinator("http://127.0.0.1:50070")
    with coordinator.tcc(timeout_s=30) as tx:          # commits when the block ends,
        tx.call("http://inventory:50051", "reserve", b"sku-1")   # rolls back if it raises
        tx.call("http://payments:50052", "charge", b"42")

Each ``call`` registers the branch durably *before* sending its Try (so a rollback Cancels it
even if the Try never arrives) and then sends the Try itself. Only an explicit FAILURE proves
the Try had no effect (:class:`BranchRefused`); a status or RETRY is retried, a timeout is left
in doubt (:class:`BranchInDoubt`) for the rollback's Cancel and the barrier to settle.

Sagas::

    outcome = (coordinator.saga(xid="order-7")
               .step("reserve", "http://inventory:50051", "stock", b"sku-1")
               .step("charge", "http://payments:50052", "card", b"42")
               .run(timeout_s=30))

Two-phase messages ("commit my local transaction and have these calls delivered", both or
neither), the check-backs served by ``ParticipantServer.message_check_back`` on the same
database::

    def place_order(tx):
        tx.execute("INSERT INTO orders (id) VALUES (?)", ("42",))

    (coordinator.message("http://orders:50051", "orders.check_back", xid="order-42")
     .branch("reserve", "http://inventory:50051", "reserve", b"sku-1:2")
     .branch("notify", "http://notifications:50051", "order_placed", b"42")
     .do_and_submit(database, place_order))
"""

import json
import logging
import os
import socket
import time
import urllib.error
import urllib.request

import grpc
from google.protobuf import json_format

from . import reasons
from .auth import CALL_TOKEN
from .barrier import MessageDropped, Prepared, prepare_message
from .v1 import dtx_pb2 as wire
from .v1 import dtx_pb2_grpc

TRACEPARENT = "traceparent"


class DtxError(Exception):
    """A coordinator or branch call failed."""


class BranchRefused(DtxError):
    """The Try answered FAILURE: it had no effect; the transaction rolls back."""


class BranchInDoubt(DtxError):
    """The Try's outcome is unknown; the transaction rolls back and the Cancel settles it."""


class CoordinatorError(DtxError):
    """A coordinator RPC answered a gRPC error (``code``: its ``grpc.StatusCode``; ``reason``:
    why, one of ``dtx.reasons.REASONS``, or ``None``)."""

    def __init__(self, code, message, reason=None):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.reason = reason


def _address(target):
    """``host:port`` of a gRPC target given as ``http://host:port`` or ``host:port``."""
    for scheme in ("http://", "https://"):
        if target.startswith(scheme):
            target = target[len(scheme) :]
    if _is_http(target):
        raise ValueError(f"target {target!r} has a path: that is an HTTP/JSON participant")
    return target.rstrip("/")


def _is_http(target):
    """A target with a path is an HTTP/JSON participant, as the coordinator decides it."""
    rest = target.split("://", 1)[-1]
    return "/" in rest.rstrip("/")


class _Unknown(Exception):
    """An answer that proves nothing about the effect: retry. Every status (gRPC) or problem
    body (HTTP) is one, whatever its code: it may come from a proxy, or from a replica that
    lacks the handler while another ran it (``dtx_proto::answer``, the coordinator's rule)."""


def new_traceparent():
    """A fresh W3C ``traceparent`` (sampled)."""
    return f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"


def _child(traceparent):
    version, trace_id, _parent, flags = traceparent.split("-")
    return f"{version}-{trace_id}-{os.urandom(8).hex()}-{flags}"


class ClientTls:
    """Whom a TLS client trusts and how it identifies itself (PEM bytes): ``https://`` URLs are
    TLS with these, ``http://`` ones plain text (TLS settings for them are an error)."""

    def __init__(self, ca_pem=None, cert_pem=None, key_pem=None):
        if (cert_pem is None) != (key_pem is None):
            raise ValueError("a client certificate and its key go together")
        self.ca_pem, self.cert_pem, self.key_pem = ca_pem, cert_pem, key_pem

    @classmethod
    def from_files(cls, ca=None, cert=None, key=None):
        def read(path):
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        return cls(read(ca), read(cert), read(key))

    def credentials(self):
        # Without a CA, grpc trusts the system's roots.
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem, private_key=self.key_pem, certificate_chain=self.cert_pem
        )


def _channel(target, tls):
    """The channel of a gRPC target: TLS for ``https://`` (the system's roots without ``tls``),
    plain text for ``http://`` or a bare ``host:port``."""
    address = _address(target)
    if target.startswith("https://"):
        return grpc.secure_channel(address, (tls or ClientTls()).credentials())
    if tls is not None:
        raise ValueError(f"{target!r} is plain text (http://): TLS settings are for https://")
    return grpc.insecure_channel(address)


# Waits between repeats of a coordinator RPC answered UNAVAILABLE (the Rust SDK's too).
_UNAVAILABLE_WAITS_S = (0.05, 0.1, 0.2, 0.4)


class Coordinator:
    """A client of the coordinator's gRPC API; ``tls`` (a :class:`ClientTls`) for an
    ``https://`` coordinator, also used for the direct Trys to ``https://`` participants."""

    def __init__(self, target, channel=None, tls=None, token=None):
        self.channel = channel or _channel(target, tls)
        self.tls = tls
        # Sent as `authorization: Bearer <token>` with every call (auth on at the coordinator).
        self._auth = [("authorization", f"Bearer {token}")] if token else []
        self.stub = dtx_pb2_grpc.CoordinatorStub(self.channel)
        self._participants = {}

    def close(self):
        self.channel.close()
        for channel, _ in self._participants.values():
            channel.close()

    def _rpc(self, method, request, traceparent=None, timeout_s=30.0):
        """Calls a coordinator RPC. Every one is safe to repeat, so an UNAVAILABLE answer (the
        store down for a moment, an instance shutting down) is repeated after 50, 100, 200 and
        400 ms, as the Rust SDK does, before it is raised."""
        metadata = list(self._auth)
        if traceparent:
            metadata.append((TRACEPARENT, traceparent))
        for wait_s in _UNAVAILABLE_WAITS_S + (None,):
            try:
                return getattr(self.stub, method)(request, timeout=timeout_s, metadata=metadata)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE and wait_s is not None:
                    time.sleep(wait_s)
                    continue
                raise CoordinatorError(e.code(), e.details(), reasons.reason_of(e)) from None

    def participant(self, target):
        if target not in self._participants:
            tls = self.tls if target.startswith("https://") else None
            channel = _channel(target, tls)
            self._participants[target] = (channel, dtx_pb2_grpc.ParticipantStub(channel))
        return self._participants[target][1]

    def tcc(self, xid="", timeout_s=60.0, call_timeout_s=10.0, try_retries=3, wait=True):
        """A TCC transaction; use it as a context manager (commit on success, rollback on an
        exception) or call ``commit`` / ``rollback`` yourself."""
        return TccTransaction(self, xid or f"py-{os.urandom(12).hex()}", timeout_s,
                              call_timeout_s, try_retries, wait)

    def saga(self, xid="", timeout_s=60.0):
        return SagaBuilder(self, xid, timeout_s)

    def message(self, check_back_target, check_back_handler, xid="", check_back_after_s=0.0):
        """A two-phase message whose check-backs go to ``check_back_handler`` of this
        service's participant server at ``check_back_target``; checked back
        ``check_back_after_s`` after it was prepared (0: the coordinator's default)."""
        return MessageBuilder(self, check_back_target, check_back_handler, xid,
                              check_back_after_s)

    def get(self, xid):
        return self._rpc("Get", wire.GetRequest(xid=xid))

    def wait(self, xid, timeout_s=30.0):
        request = wire.WaitRequest(xid=xid, timeout_ms=int(timeout_s * 1000))
        return self._rpc("Wait", request, timeout_s=timeout_s + 5)

    def resume(self, xid):
        return self._rpc("Resume", wire.ResumeRequest(xid=xid))


class TccTransaction:
    def __init__(self, coordinator, xid, timeout_s, call_timeout_s, try_retries, wait):
        self.coordinator = coordinator
        self.xid = xid
        self.timeout_s = timeout_s
        self.call_timeout_s = call_timeout_s
        self.try_retries = try_retries
        self.wait = wait
        self.traceparent = new_traceparent()
        self._branches = 0
        self._begun = False
        self._try_token = ""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if kind is None:
            self.commit()
        else:
            self.rollback()
        return False

    def call(self, target, handler, payload=b"", branch_id=None, headers=None):
        """Registers the branch, then sends its Try; returns the Try's result."""
        self._branches += 1
        branch_id = branch_id or f"b{self._branches}"
        headers = dict(headers or {})
        headers.setdefault(TRACEPARENT, self.traceparent)
        registered = self.coordinator._rpc(
            "RegisterBranch",
            wire.RegisterBranchRequest(
                xid=self.xid,
                branch_id=branch_id,
                target=target,
                handler=handler,
                payload=payload,
                headers=headers,
                call_timeout_ms=int(self.call_timeout_s * 1000),
                begin_timeout_ms=0 if self._begun else max(1, int(self.timeout_s * 1000)),
            ),
            self.traceparent,
        )
        self._begun = True
        # The xid the participant's barrier keys on (scoped by the caller's tenant) and the
        # coordinator's signature on this Try (for participants that obey only it).
        self._try_token = registered.try_token
        request = wire.BranchRequest(
            xid=registered.branch_xid or self.xid,
            branch_id=branch_id,
            action=wire.BRANCH_ACTION_TRY,
            handler=handler,
            payload=payload,
            headers=headers,
        )
        send = self._http if _is_http(target) else self._grpc
        last = ""
        for attempt in range(self.try_retries + 1):
            if attempt:
                time.sleep(0.05 * (1 << min(attempt, 6)))
            try:
                response = send(target, request)
            except TimeoutError:
                # It may still commit; a retry would race it. The Cancel settles it.
                raise BranchInDoubt(
                    f"{self.xid}/{branch_id}: no answer within {self.call_timeout_s} s"
                ) from None
            except _Unknown as e:
                last = f"{e} (proves nothing about the effect)"
                continue
            if response.outcome == wire.OUTCOME_SUCCESS:
                return bytes(response.result)
            if response.outcome == wire.OUTCOME_FAILURE:
                raise BranchRefused(
                    f"{self.xid}/{branch_id}: "
                    f"{response.message or response.result.decode('utf-8', 'replace')}"
                )
            last = f"RETRY: {response.message}"
        raise BranchInDoubt(f"{self.xid}/{branch_id}: {last}")

    def _call_token(self):
        return [(CALL_TOKEN, self._try_token)] if self._try_token else []

    def _grpc(self, target, request):
        try:
            return self.coordinator.participant(target).Branch(
                request,
                timeout=self.call_timeout_s,
                metadata=[(TRACEPARENT, _child(self.traceparent))] + self._call_token(),
            )
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError from None
            raise _Unknown(f"{e.code().name}: {e.details()}") from None

    def _http(self, target, request):
        post = urllib.request.Request(
            target,
            data=json_format.MessageToJson(request, indent=None).encode(),
            headers={
                "content-type": "application/json",
                "accept": "application/json",
                TRACEPARENT: _child(self.traceparent),
                **dict(self._call_token()),
            },
        )
        try:
            with urllib.request.urlopen(post, timeout=self.call_timeout_s) as answer:
                body = answer.read()
            return json_format.Parse(body, wire.BranchResponse(), ignore_unknown_fields=True)
        except urllib.error.HTTPError as e:
            try:
                code = json.loads(e.read()).get("code", "")
            except ValueError:
                code = ""
            raise _Unknown(f"HTTP {e.code} {code}".rstrip()) from None
        except (TimeoutError, socket.timeout):
            raise TimeoutError from None
        except (urllib.error.URLError, OSError, json_format.ParseError, ValueError) as e:
            raise _Unknown(f"HTTP call failed: {e}") from None

    def _decide(self, method):
        if not self._begun:
            # Nothing registered: the coordinator has no such transaction to decide.
            return wire.TX_STATUS_ROLLED_BACK if method == "Rollback" else wire.TX_STATUS_COMMITTED
        request = wire.DecideRequest(
            xid=self.xid, wait=self.wait, wait_timeout_ms=int(self.timeout_s * 1000)
        )
        response = self.coordinator._rpc(method, request, self.traceparent, self.timeout_s + 5)
        return response.status

    def commit(self):
        """Decides Commit (durable when it returns); with ``wait``, after every Confirm."""
        return self._decide("Commit")

    def rollback(self):
        return self._decide("Rollback")


class SagaBuilder:
    def __init__(self, coordinator, xid, timeout_s):
        self.coordinator = coordinator
        self.request = wire.SubmitSagaRequest(xid=xid, timeout_ms=int(timeout_s * 1000))
        self.traceparent = new_traceparent()
        self.request.headers[TRACEPARENT] = self.traceparent

    def step(self, name, target, handler, payload=b"", compensate_payload=b"", after=()):
        self.request.steps.add(
            name=name,
            target=target,
            handler=handler,
            action_payload=payload,
            compensate_payload=compensate_payload,
            depends_on=list(after),
        )
        return self

    def retry(self, max_attempts=0, initial_backoff_ms=0, max_backoff_ms=0, call_timeout_ms=0):
        self.request.retry.CopyFrom(
            wire.RetryPolicy(
                max_attempts=max_attempts,
                initial_backoff_ms=initial_backoff_ms,
                max_backoff_ms=max_backoff_ms,
                call_timeout_ms=call_timeout_ms,
            )
        )
        return self

    def submit(self):
        """Submits the saga (durable when it returns); returns its ``SubmitSagaResponse``."""
        return self.coordinator._rpc("SubmitSaga", self.request, self.traceparent)

    def run(self, timeout_s=30.0):
        """Submits and waits until the saga settles; returns the ``Transaction``."""
        self.request.wait_timeout_ms = int(timeout_s * 1000)
        response = self.coordinator._rpc(
            "SubmitSaga", self.request, self.traceparent, timeout_s + 5
        )
        return response.transaction


class MessageBuilder:
    def __init__(self, coordinator, check_back_target, check_back_handler, xid,
                 check_back_after_s):
        self.coordinator = coordinator
        self.request = wire.PrepareMessageRequest(
            xid=xid or f"py-{os.urandom(12).hex()}",
            check_back=wire.CheckBack(target=check_back_target, handler=check_back_handler),
            check_back_after_ms=int(check_back_after_s * 1000),
        )
        self.traceparent = new_traceparent()
        self.request.headers[TRACEPARENT] = self.traceparent

    def branch(self, name, target, handler, payload=b"", after=()):
        """A delivery: ``handler`` of the participant at ``target`` is called with ACTION until
        it answers SUCCESS, after the branches named in ``after`` (the others at once)."""
        self.request.branches.add(
            name=name, target=target, handler=handler, payload=payload, depends_on=list(after)
        )
        return self

    def retry(self, initial_backoff_ms=0, max_backoff_ms=0, call_timeout_ms=0):
        """Backoff and call timeout of the deliveries and check-backs."""
        self.request.retry.CopyFrom(
            wire.RetryPolicy(
                initial_backoff_ms=initial_backoff_ms,
                max_backoff_ms=max_backoff_ms,
                call_timeout_ms=call_timeout_ms,
            )
        )
        return self

    def prepare(self):
        """Records the message durably in PREPARED; returns a :class:`PreparedMessage`."""
        response = self.coordinator._rpc("PrepareMessage", self.request, self.traceparent)
        return PreparedMessage(self.coordinator, response.xid, response.branch_xid,
                               self.traceparent)

    def do_and_submit(self, database, body):
        """Prepares the message, runs ``body(tx)`` in a local transaction of ``database`` that
        also writes the message's barrier row, commits, and submits. Returns what ``body``
        returned, or ``Prepared.ALREADY_COMMITTED`` when an earlier run of this message
        committed (``body`` does not run again; the message is submitted).

        ``body`` raising rolls back and aborts the message, and the exception propagates.
        :class:`MessageDropped`: a check-back dropped the message first (nothing committed). A
        failed COMMIT is raised without an abort (its outcome may be unknown: the check-back
        decides), and a failed submit after the commit is only logged: the check-back
        delivers."""
        message = self.prepare()
        ran = False
        try:
            with database.transaction() as tx:
                if prepare_message(tx, message.branch_xid) == Prepared.ALREADY_COMMITTED:
                    result = Prepared.ALREADY_COMMITTED
                else:
                    result = body(tx)
                ran = True
        except MessageDropped:
            raise
        except BaseException:
            if not ran:
                message._quietly(message.abort)
            raise
        message._quietly(message.submit)
        return result


class PreparedMessage:
    """A message in PREPARED: submit it after the local commit, abort it after a rollback."""

    def __init__(self, coordinator, xid, branch_xid, traceparent):
        self.coordinator = coordinator
        self.xid = xid
        #: The key of the message's barrier row (the xid with its tenant's scope): pass it to
        #: :func:`dtx.prepare_message` in the local transaction.
        self.branch_xid = branch_xid
        self.traceparent = traceparent

    def submit(self):
        """The local transaction committed: deliver. Returns the status."""
        return self._decide("SubmitMessage")

    def abort(self):
        """The local transaction rolled back: drop the message. Never after a commit, nor when
        the commit's outcome is unknown (leave that to the check-back)."""
        return self._decide("AbortMessage")

    def _decide(self, method):
        request = wire.DecideRequest(xid=self.xid)
        return self.coordinator._rpc(method, request, _child(self.traceparent)).status

    def _quietly(self, decide):
        try:
            decide()
        except CoordinatorError as e:
            logging.getLogger("dtx").warning(
                "message %s: %s failed (%s); its check-back settles it", self.xid,
                decide.__name__, e)
