"""Participants that obey only the coordinator: the check of the ``x-dtx-call-token`` a
coordinator started with ``--call-signing-key`` sends with every branch call (the Rust SDK's
``dtx_proto::auth::CallVerifier``, same rules and messages).

The token is a JWT signed with Ed25519 (``alg`` EdDSA), its key id the first 16 hex digits of
the SHA-256 of the raw public key, bound to the target URL (``aud``), xid, branch, action and
handler, and valid at most 60 s. Needs the ``cryptography`` package (``pip install
dtx-sdk[auth]``).
"""

import base64
import hashlib
import json
import re
import time

CALL_TOKEN = "x-dtx-call-token"
CALL_ISSUER = "dtx-coordinator"
CALL_TOKEN_LIFETIME_S = 60
_LEEWAY_S = 30

_PEM = re.compile(r"-----BEGIN PUBLIC KEY-----.*?-----END PUBLIC KEY-----", re.S)


class CallRefused(Exception):
    """The call token is missing, forged, expired or for another call; nothing may run."""


def _b64(part):
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def key_id(raw_public_key):
    return hashlib.sha256(raw_public_key).hexdigest()[:16]


def action_claim(action):
    """The ``action`` claim of a ``dtx.v1.BranchAction`` value: TRY, CONFIRM, ..."""
    return {1: "TRY", 2: "CONFIRM", 3: "CANCEL", 4: "ACTION", 5: "COMPENSATE"}.get(
        action, "UNSPECIFIED"
    )


class CallVerifier:
    """The coordinator's public keys (every ``PUBLIC KEY`` PEM block of ``public_pem``: old and
    new while they rotate) and the URLs (``targets``) the coordinator calls this participant
    by."""

    def __init__(self, public_pem, targets):
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        if isinstance(public_pem, bytes):
            public_pem = public_pem.decode()
        if not targets:
            raise ValueError("no target: name the URLs the coordinator calls this participant by")
        self.targets = list(targets)
        self._keys = {}
        for block in _PEM.findall(public_pem):
            key = serialization.load_pem_public_key(block.encode())
            if not isinstance(key, Ed25519PublicKey):
                raise ValueError("not an Ed25519 public key")
            raw = key.public_bytes(
                serialization.Encoding.Raw, serialization.PublicFormat.Raw
            )
            self._keys[key_id(raw)] = key
        if not self._keys:
            raise ValueError(
                "no PUBLIC KEY block: give the coordinator's public key "
                "(`openssl pkey -in signing.pem -pubout`)"
            )

    @classmethod
    def from_file(cls, path, targets):
        with open(path) as f:
            return cls(f.read(), targets)

    def verify_request(self, token, request):
        """Checks ``token`` (``None`` when the call carried none) against ``request``, a
        ``dtx.v1.BranchRequest``; raises :class:`CallRefused` saying why."""
        if not token:
            raise CallRefused(
                f"branch call refused: no {CALL_TOKEN} (this participant obeys only the "
                "coordinator, which signs every call)"
            )
        self.verify(
            token,
            xid=request.xid,
            branch=request.branch_id,
            action=action_claim(request.action),
            handler=request.handler,
        )

    def verify(self, token, xid, branch, action, handler):
        def refuse(why):
            raise CallRefused(f"branch call refused: {why}")

        try:
            head_b64, body_b64, sig_b64 = token.split(".")
            header = json.loads(_b64(head_b64))
            claims = json.loads(_b64(body_b64))
            signature = _b64(sig_b64)
        except (ValueError, TypeError):
            refuse("malformed call token")
        key = self._keys.get(header.get("kid"))
        if key is None:
            refuse(
                f"the call token's key {header.get('kid', '')!r} is not one of the coordinator "
                "keys this participant trusts"
            )
        if header.get("alg") != "EdDSA":
            refuse(f"the call token's algorithm {header.get('alg')!r} is not EdDSA")
        from cryptography.exceptions import InvalidSignature

        try:
            key.verify(signature, f"{head_b64}.{body_b64}".encode())
        except InvalidSignature:
            refuse("the call token's signature does not verify")
        now = time.time()
        if claims.get("iss") != CALL_ISSUER:
            refuse(f"the call token's issuer {claims.get('iss')!r} is not {CALL_ISSUER}")
        if claims.get("aud") not in self.targets:
            refuse(
                f"call token not valid for {' or '.join(self.targets)}: it names "
                f"{claims.get('aud')!r}"
            )
        exp, iat = claims.get("exp"), claims.get("iat")
        if not isinstance(exp, int) or not isinstance(iat, int):
            refuse("the call token has no exp or iat")
        if exp + _LEEWAY_S < now:
            refuse("the call token expired")
        if exp - iat > CALL_TOKEN_LIFETIME_S:
            refuse(f"the call token lives longer than {CALL_TOKEN_LIFETIME_S} s")
        for what, called in (("xid", xid), ("branch", branch), ("action", action),
                             ("handler", handler)):
            if claims.get(what) != called:
                refuse(f"the call token was signed for {what} {claims.get(what)!r}, not {called!r}")
