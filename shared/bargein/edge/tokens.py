"""Session tokens: signed (HMAC, via itsdangerous), bound to a session and a role, expiring.

A caller token may also be used to listen; a listener token can only listen. Nothing in a token is
secret, only unforgeable: it carries the session id and the role, and the signature.
"""

from __future__ import annotations

from typing import Literal

from itsdangerous import BadSignature, URLSafeTimedSerializer

Role = Literal["caller", "listener"]
ROLES: tuple[Role, ...] = ("caller", "listener")
_SALT = "bargein-session-token"


class TokenError(Exception):
    """The token cannot be used for this session and role."""


class Tokens:
    def __init__(self, secret: str, ttl_s: int) -> None:
        self._serializer = URLSafeTimedSerializer(secret, salt=_SALT)
        self.ttl_s = ttl_s

    def issue(self, session_id: str, role: Role) -> str:
        token: str = self._serializer.dumps({"s": session_id, "r": role})
        return token

    def check(self, token: str | None, session_id: str, role: Role) -> None:
        if not token:
            raise TokenError("a token is required")
        try:
            claims = self._serializer.loads(token, max_age=self.ttl_s)
        except BadSignature as exc:  # also SignatureExpired, a subclass
            raise TokenError(f"invalid token: {type(exc).__name__}") from None
        if not isinstance(claims, dict) or claims.get("s") != session_id:
            raise TokenError("the token is for another session")
        granted = claims.get("r")
        if granted not in ROLES or (role == "caller" and granted != "caller"):
            raise TokenError(f"a {granted} token cannot join as {role}")
