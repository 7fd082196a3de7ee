"""The one rule for every URI OSTE will send a request to. Pure, no I/O.

Activity types' ``uri_pattern`` (with ``{Name}`` placeholders), solutions' ``success_uri`` and
``dead_letter_uri`` (plain URIs) and any URI override all pass through ``check_target_uri``. It refuses
what different parsers read differently or what hides the real target from a reader: user information
before the host, fragments, IPv4 hosts not written as four decimal numbers, IPv6 zone ids,
percent-encoded slashes and dot segments in the path, backslashes, control characters, and the other
characters RFC 3986 does not allow anywhere in a URI (``"<>^`|``, ``{``/``}`` outside a placeholder,
``[``/``]`` outside an IPv6 host). The SSRF guard still checks the resolved address at fire time: this
is the first line, not the only one.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

from oste.errors import InvalidInput

PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
"""A ``{Name}`` placeholder; the group is the name."""
PLACEHOLDER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:-[A-Za-z0-9_]+)*")
"""A plain name: words of ASCII letters, digits and ``_`` joined by single ``-``, the first word starting
with a letter or ``_`` (``SongId``, ``song-id``, ``_v2``; not ``k-``, ``k--v`` or ``1k``)."""
SCHEMES = ("http", "https")

_CONTROL = re.compile(r"[\x00-\x20\x7f]")
_NOT_IN_URI = re.compile(r'["<>^`|]')
"""ASCII characters RFC 3986 allows nowhere in a URI (spaces, controls, backslash and braces apart)."""
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_ENCODED_SLASH = re.compile(r"%2f", re.IGNORECASE)
_ENCODED_DOT = re.compile(r"%2e", re.IGNORECASE)
_NUMERIC_LABEL = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*")
_DECIMAL_OCTET = re.compile(r"0|[1-9][0-9]{0,2}")
_HOST_LABEL = re.compile(r"(?!-)[\w-]{1,63}(?<!-)")
FOUR_DECIMALS = "write an IPv4 address as four decimal numbers 0-255 without leading zeros, e.g. 192.0.2.7"


def check_target_uri(value: Any, field: str = "uri_pattern", *, placeholders: bool = True) -> tuple[str, ...]:
    """Validate a target URI and return its placeholder names in order of first appearance.

    ``placeholders=False`` for plain URIs (a ``{Name}`` is then refused). Raises InvalidInput naming
    ``field`` with a reason the user can act on.
    """
    example = "https://host/song/{SongId}" if placeholders else "https://host/path"
    if not isinstance(value, str) or not value:
        raise InvalidInput.field(field, f"must be a non-empty string such as {example}")
    names = _placeholder_names(value, field, placeholders)
    if _CONTROL.search(value):
        raise InvalidInput.field(field, "must not contain whitespace or control characters")
    if "\\" in value:
        raise InvalidInput.field(field, "must not contain a backslash ('\\'); write '/' or %5C")
    _check_characters(value, field)
    if "#" in value:
        raise InvalidInput.field(
            field,
            "must not have a fragment ('#…'): it is never sent to the receiver; placeholders belong in the "
            "path or query",
        )
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise InvalidInput.field(field, f"is not a valid URL: {exc}") from None
    if parts.scheme not in SCHEMES or not parts.netloc:
        raise InvalidInput.field(
            field, f"must be an absolute http:// or https:// URL with a host, e.g. {example}"
        )
    if "{" in parts.netloc:
        raise InvalidInput.field(field, "placeholders may appear in the path or query, not in the host")
    if "@" in parts.netloc:
        raise InvalidInput.field(
            field,
            "must not hold user information ('user@' or 'user:password@') before the host: it hides the "
            "real host from a reader; send credentials in a static header instead",
        )
    if port == 0:
        raise InvalidInput.field(field, "port must be 1-65535")
    _check_host(parts.netloc, parts.hostname or "", field)
    _check_brackets(value.partition("://")[2][len(parts.netloc) :], field)
    if _BAD_ESCAPE.search(value):
        raise InvalidInput.field(
            field, "has a '%' not followed by two hex digits; write a literal '%' as %25"
        )
    _check_path(parts.path, field)
    return names


def _check_characters(value: str, field: str) -> None:
    bad = _NOT_IN_URI.search(value)
    if bad:
        raise InvalidInput.field(
            field,
            f"must not contain {bad.group()!r}: it is not allowed in a URI; percent-encode it "
            f"(%{ord(bad.group()):02X})",
        )


def _check_brackets(after_host: str, field: str) -> None:
    if "[" in after_host or "]" in after_host:
        raise InvalidInput.field(
            field, "may hold '[' or ']' only around an IPv6 host; percent-encode them elsewhere (%5B, %5D)"
        )


def _placeholder_names(value: str, field: str, allowed: bool) -> tuple[str, ...]:
    stripped = PLACEHOLDER.sub("x", value)
    if "{" in stripped or "}" in stripped:
        raise InvalidInput.field(field, "has an unbalanced '{' or '}'; placeholders look like {SongId}")
    names = PLACEHOLDER.findall(value)
    if names and not allowed:
        raise InvalidInput.field(field, "must be a plain URL, without {placeholders}")
    for name in names:
        if not PLACEHOLDER_NAME.fullmatch(name):
            raise InvalidInput.field(
                field,
                f"placeholder {{{name}}} must be a name of letters, digits and '_' that starts with a "
                "letter or '_', its words joined by single '-' (not at either end), e.g. {SongId} or "
                "{song-id}",
            )
    return tuple(dict.fromkeys(names))


def _check_host(netloc: str, hostname: str, field: str) -> None:
    """IP literals in their one canonical form; host names made of plain labels."""
    if netloc.startswith("["):
        literal = netloc[1:].partition("]")[0]
        if "%" in literal:
            raise InvalidInput.field(
                field, "must not hold an IPv6 zone id ('%25eth0'): it names an interface of OSTE's own host"
            )
        try:
            ipaddress.IPv6Address(literal)
        except ValueError:
            raise InvalidInput.field(field, f"[{literal}] is not an IPv6 address") from None
        return
    if not hostname:
        raise InvalidInput.field(field, "must name a host, e.g. https://host/path")
    labels = hostname.split(".")
    if labels[-1] == "" and len(labels) > 1:
        labels.pop()  # a fully qualified name's trailing dot
    if _NUMERIC_LABEL.fullmatch(labels[-1]):  # parsers read it as an IPv4 address (WHATWG URL)
        if len(labels) != 4 or not all(_DECIMAL_OCTET.fullmatch(x) and int(x) <= 255 for x in labels):
            raise InvalidInput.field(
                field,
                f"host {hostname!r} is read as an IPv4 address in decimal, octal, hex or shortened form, "
                f"which parsers disagree about; {FOUR_DECIMALS}",
            )
        return
    if "%" in hostname:
        raise InvalidInput.field(field, "the host must not be percent-encoded; write it as it is")
    for label in labels:
        if not _HOST_LABEL.fullmatch(label):
            raise InvalidInput.field(
                field,
                f"host {hostname!r} is not a valid host name: labels of letters, digits and '-' "
                "(1-63 characters) separated by single dots",
            )


def _check_path(path: str, field: str) -> None:
    if _ENCODED_SLASH.search(path):
        raise InvalidInput.field(
            field,
            "the path must not hold a percent-encoded slash (%2F): servers disagree on whether it "
            "separates segments; put such values in the query",
        )
    segment = dot_segment(path)
    if segment is not None:
        raise InvalidInput.field(
            field,
            f"the path must not hold a dot segment ({segment!r}): it would be resolved away and "
            "reach another resource; write the path without it",
        )


def dot_segment(path: str) -> str | None:
    """The first path segment that is ``.`` or ``..`` (also written %2E), or None when there is none."""
    for segment in path.split("/"):
        if segment and _ENCODED_DOT.sub(".", segment) in (".", ".."):
            return segment
    return None
