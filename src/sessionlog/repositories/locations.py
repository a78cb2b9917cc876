"""A repository's location as it may be shown: in messages, reprs, the CLI's output, logs.

A PostgreSQL location holds a password in one of three shapes, and a message may meet any of
them, well-formed or not: a URL's userinfo (`postgresql://user:PW@host/db`, also when the rest
of the URL is malformed, as `postgresql://u:PW@[host`), a URL's query (`?password=PW`), or a
keyword DSN (`host=h password=PW`, `password='P W'`). `masked` replaces each with `***` without
parsing the location the way libpq would (a parser that gives up on a malformed URL is exactly
how a password got printed): it works on the text, and masks too much rather than too little.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

_KEYWORD = re.compile(r"""(password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&#]+)""", re.IGNORECASE)


def masked(location: str) -> str:
    """`location` with every password replaced by `***`; the rest unchanged."""
    text = _KEYWORD.sub(r"\1***", location)
    scheme, separator, rest = text.partition("://")
    if separator and "@" in rest:
        at = rest.rfind("@")  # a password may hold '@' unencoded: the last one ends the userinfo
        user, colon, _ = rest[:at].partition(":")
        if colon:
            rest = f"{user}:***{rest[at:]}"
    return f"{scheme}{separator}{rest}"


def mask_in(text: str, location: str) -> str:
    """`text` (a driver's message, say) with the location's password, in whatever form it
    appears there (as written, percent-decoded, unquoted and unescaped), replaced by `***`, and
    every password-shaped part of `text` masked too."""
    for secret in sorted(_secrets(location), key=len, reverse=True):
        text = text.replace(secret, "***")
    return masked(text)


def passwords(location: str) -> set[str]:
    """Every form in which the password of `location` may be quoted back (for output that is
    not a message, where `mask_in`'s masking of password-shaped text would change data)."""
    return _secrets(location)


def _secrets(location: str) -> set[str]:
    """Every form in which the password of `location` may be quoted back."""
    found = []
    for match in _KEYWORD.finditer(location):
        value = match.group(2)
        if value.startswith("'"):
            value = value[1:-1] if len(value) > 1 and value.endswith("'") else value[1:]
            found.append(re.sub(r"\\(.)", r"\1", value))  # a keyword DSN's escapes
        found.append(value)
    _, separator, rest = location.partition("://")
    if separator and "@" in rest:
        # up to the last '@' (a password holding '@' unencoded) and up to the first (libpq's reading)
        for userinfo in {rest[: rest.rfind("@")], rest[: rest.find("@")]}:
            _, colon, password = userinfo.partition(":")
            if colon:
                found.append(password)
    return {form for value in found for form in (value, unquote(value)) if form}
