"""Secrets kept out of what jobd says: which config values may be secrets, and URLs shown with
their credentials masked.

Every config problem (``problems.Problem``), ``RedisConfig``'s repr and description, and the
secret-variable search in ``hardening`` go through here.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import unquote

if TYPE_CHECKING:
    from jobd.config.yamlsrc import Document, Path

# Keys whose values may be secrets: no message echoes them, nor a mapping or list holding one.
SECRET_KEYS = frozenset({"password", "token", "url"})
# A scalar written where one of these sections belongs may well be a URL or a token.
SECRET_SECTIONS = frozenset({("redis",), ("dashboard",)})
NOT_SHOWN = "(the value is not shown: it may be a secret)"

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]*")
_PARAM = re.compile(r"([?&;])([^=&;#?]*)=([^&;]*)")
_SECRET_PARAM = re.compile(r"pass|token|secret|cred|auth", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with its credentials as ``***``: the password of its userinfo (all of a userinfo
    without one: it may be a token), and query parameters such as ``?password=``."""
    url = _PARAM.sub(_mask_param, url)
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at:
        return url
    user, colon, _ = userinfo.partition(":")
    shown = f"{user}:" if colon and not set("/?#") & set(user) else ""
    return f"{scheme}{sep}{shown}***@{host}"


def _mask_param(match: re.Match[str]) -> str:
    sep, name, _ = match.groups()
    return f"{sep}{name}=***" if _SECRET_PARAM.search(unquote(name)) else match.group(0)


def redact_urls(text: str) -> str:
    """``text`` with every URL in it redacted (``redact_url``)."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text)


def is_secret(path: Path) -> bool:
    """Whether the value at ``path`` may be a secret, never to be echoed: a password, token or
    URL, a handler's environment, or a scalar standing where ``redis`` or ``dashboard`` belongs."""
    if path in SECRET_SECTIONS or (path and path[-1] in SECRET_KEYS):
        return True
    return path[:2] == ("defaults", "env") or (path[:1] == ("queues",) and path[2:3] == ("env",))


def holds_secret(doc: Document, path: Path) -> bool:
    """Whether the value at ``path`` is a secret or holds one."""
    n = len(path)
    return is_secret(path) or any(p[:n] == path and is_secret(p) for p in doc.values)
