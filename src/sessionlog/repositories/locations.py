"""A repository's location as it may be shown: in messages, reprs, the CLI's output, logs.

A PostgreSQL location holds a password in one of three shapes, and a message may meet any of
them, well-formed or not: a URL's userinfo (`postgresql://user:PW@host/db`, also when the rest
of the URL is malformed, as `postgresql://u:PW@[host`), a URL's query (`?password=PW`, also
with the keyword percent-encoded, `?pass%77ord=PW`, which libpq decodes), or a keyword DSN
(`host=h password=PW`, `password='P W'`); `sslpassword` is a secret too. `masked` replaces each
with `***` without parsing the location the way libpq would (a parser that gives up on a
malformed URL is exactly how a password got printed): it works on the text, and masks too much
rather than too little.

`masked` may be given a sentence that holds a location: each URL-shaped token in it (`scheme://`
up to the next whitespace) is masked in place, and nothing else of the sentence changes.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

# A keyword DSN's password (also `sslpassword`, and any keyword ending in "password").
_KEYWORD = re.compile(r"""(password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&#]+)""", re.IGNORECASE)
# A URL-shaped token: a scheme, '://', everything up to the next whitespace.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*")
# A URL query's parameter: its key (maybe percent-encoded) and its value.
_PARAMETER = re.compile(r"([?&])([^=&#\s]*)(=)([^&#\s]*)")
_SECRET_KEYS = ("password", "sslpassword")


def masked(location: str) -> str:
    """`location` (or a sentence holding locations) with every password replaced by `***`; the
    rest unchanged."""
    pieces = []
    start = 0
    for match in _URL.finditer(location):
        pieces.append(_KEYWORD.sub(r"\1***", location[start : match.start()]))
        pieces.append(_masked_url(match.group()))
        start = match.end()
    pieces.append(_KEYWORD.sub(r"\1***", location[start:]))
    return "".join(pieces)


def _masked_url(url: str) -> str:
    scheme, separator, rest = url.partition("://")
    at = _userinfo_end(rest)
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        if colon:
            rest = f"{user}:***{rest[at:]}"
    return f"{scheme}{separator}{_PARAMETER.sub(_masked_parameter, rest)}"


def _userinfo_end(rest: str) -> int:
    """Where the userinfo of a URL's part after '://' ends (its '@'), or -1: the LAST '@' before
    the path. libpq splits at the first '@' (so `u:SEC@RET@h` names host `RET@h`), a reader of
    RFC 3986 at the last one; up to the last, every reading of the password is covered. A '@'
    in the query or the fragment (after the first '/') is no userinfo's."""
    slash = rest.find("/", rest.find("@") + 1) if "@" in rest else -1
    return rest.rfind("@", 0, slash if slash >= 0 else len(rest))


def _masked_parameter(match: re.Match[str]) -> str:
    if unquote(match.group(2)).lower() in _SECRET_KEYS:
        return f"{match.group(1)}{match.group(2)}={'***' if match.group(4) else ''}"
    return match.group()


def mask_in(text: str, location: str) -> str:
    """`text` (a driver's message, say) with the location's password, in whatever form it
    appears there (as written, percent-decoded, unquoted and unescaped, each part of it split
    at '@', in any case: libpq lowercases a host it quotes), replaced by `***`, and every
    password-shaped part of `text` masked too. For a message only: never for data."""
    for secret in sorted(_secrets(location), key=len, reverse=True):
        text = re.sub(re.escape(secret), "***", text, flags=re.IGNORECASE)
    return masked(text)


def passwords(location: str) -> set[str]:
    """Every form in which the password of `location` may be quoted back in a message."""
    return _secrets(location)


def _secrets(location: str) -> set[str]:
    found = []
    for match in _KEYWORD.finditer(location):
        value = match.group(2)
        if value.startswith("'"):
            value = value[1:-1] if len(value) > 1 and value.endswith("'") else value[1:]
            found.append(re.sub(r"\\(.)", r"\1", value))  # a keyword DSN's escapes
        found.append(value)
    for url in _URL.findall(location):
        rest = url.partition("://")[2]
        for match in _PARAMETER.finditer(rest):
            if unquote(match.group(2)).lower() in _SECRET_KEYS:
                found.append(match.group(4))
        at = _userinfo_end(rest)
        if at >= 0:
            _, colon, password = rest[:at].partition(":")
            if colon:
                found.append(password)
                # A password holding '@': a driver may quote any part of it (libpq's host).
                found.extend(part for part in password.split("@") if len(part) >= 3)
    return {form for value in found for form in (value, unquote(value)) if form}
