"""How guessable a token is: a cheap, conservative estimate of its randomness. Pure.

The admin token reaches every tenant, so a process refuses one that is easy to guess even when it is
long: forty times the same letter, ``abcd…`` or ``0123…`` runs, a short part repeated. The estimate is
the number of pieces the token is to a simple LZ77 parse (a repeat of earlier text is one piece: random
text is one piece per character) times the smaller of two per-character Shannon entropies: of its
characters, and of the steps between neighbouring characters (a run like ``abcdef…`` has many distinct
characters but one step). A token that is a shorter part repeated counts as that part alone.

It only ever underestimates what a random generator gives: in 50,000 draws each, 32 hex digits (128
random bits) estimate 81 bits at the least, 32 decimal digits 64, ``secrets.token_urlsafe(32)`` 180;
forty ``x`` estimate 0, ``oste_admin_`` and 43 ``A`` 18, ``abcd`` ten times 0 (a repeated part),
``abcdefghijklmnopqrstuvwxyzABCDEF`` 7.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence

MIN_TOKEN_BITS = 56
"""Estimated bits of randomness an admin token has at least."""
MIN_MATCH = 3
"""Characters of a repeat of earlier text that count as one piece (``_pieces``)."""
MAX_EXAMINED = 512
"""Characters of a token examined (a longer one is judged by its start)."""


def estimated_bits(token: str) -> float:
    """A conservative estimate of the random bits in ``token`` (see the module's docstring)."""
    unit = _repeated_unit(token[:MAX_EXAMINED])
    if len(unit) < 2:
        return 0.0
    steps = [ord(b) - ord(a) for a, b in itertools.pairwise(unit)]
    return max(0.0, _pieces(unit) * min(_entropy(unit), _entropy(steps)))


def _pieces(text: str) -> int:
    """How many pieces ``text`` is to a simple LZ77 parse: a character, or a run of at least
    ``MIN_MATCH`` that repeats earlier text (overlapping it), counts as one. Random text is nearly all
    single characters; ``prefix_AAAA…`` or ``…ABABAB`` is a few pieces whatever its length."""
    pieces = position = 0
    while position < len(text):
        longest = 0
        for start in range(position):
            length = 0
            while position + length < len(text) and text[start + length] == text[position + length]:
                length += 1
            longest = max(longest, length)
        position += longest if longest >= MIN_MATCH else 1
        pieces += 1
    return pieces


def weakness(token: str) -> str | None:
    """Why ``token`` is too easy to guess, or None."""
    unit = _repeated_unit(token[:MAX_EXAMINED])
    if len(unit) < min(len(token), MAX_EXAMINED):
        return (
            "it is one character repeated"
            if len(unit) == 1
            else f"it repeats its first {len(unit)} characters"
        )
    bits = estimated_bits(token)
    if bits < MIN_TOKEN_BITS:
        distinct = len(set(token))
        return (
            f"it has about {bits:.0f} bits of randomness ({distinct} distinct characters, in a guessable "
            f"order or proportion); at least {MIN_TOKEN_BITS} are needed"
        )
    return None


def _repeated_unit(token: str) -> str:
    """The shortest prefix that ``token`` repeats (with a partial last copy), if at most half its length;
    else the token itself."""
    size = len(token)
    for period in range(1, size // 2 + 1):
        if all(token[i] == token[i - period] for i in range(period, size)):
            return token[:period]
    return token


def _entropy(values: Sequence[object]) -> float:
    """Shannon entropy, in bits per item, of the items' observed frequencies."""
    total = len(values)
    if not total:
        return 0.0
    return -sum(n / total * math.log2(n / total) for n in Counter(values).values())
