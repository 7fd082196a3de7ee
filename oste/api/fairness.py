"""The API shared fairly between companies, in one API process.

Three kinds of request cost a process more than their count says, and one company could otherwise
take the process from every other with them:

- **Event streams** (``GET …/events``) and **long-polls** (``GET …/activities/{id}?wait=``) are held
  open: a company may hold ``OSTE_MAX_STREAMS_PER_COMPANY`` streams and
  ``OSTE_MAX_LONG_POLLS_PER_COMPANY`` long-polls at once; one more is a 429.
- **Heavy requests** (batch creates, bulk changes, backfills) spend tens of milliseconds of the one
  event loop each. A company may have ``OSTE_MAX_HEAVY_REQUESTS_PER_COMPANY`` of them running or
  waiting (one more is a 429), and the process runs ``OSTE_MAX_HEAVY_REQUESTS`` at once, whatever the
  company: the others wait their turn, companies taking turns (round robin), and one that waits
  longer than ``HEAVY_WAIT`` is a 429 too.
- **Light requests first.** Every other request counts as light while it runs (``LightRequests``).
  Heavy work calls ``ApiShares.checkpoint`` between chunks of ``CHUNK`` items: while light requests
  are being served it pauses (``MAX_PAUSE`` at most per checkpoint), so another company's single
  create is not queued behind a thousand validations. Streams, long-polls and heavy requests
  ``step_aside``: they do not count as light while they wait or work.
- **Light writes first.** A heavy request's write is the one step of its work that cannot pause: on
  SQLite its transaction holds the process's one connection, and a light request arriving meanwhile
  waits for all of it; on PostgreSQL its COPY and commit take a core of the database and a share of
  the machine from the light requests beside it (measured on two cores: another company's create p99
  beside a batch flood went from 1.75-2.67 times its baseline to 1.09-1.31 with the wait below). So
  before it opens, the heavy request waits for a pause in *other* companies' light requests (and in
  those whose path names no company): ``write_turn``, none in flight and none ended for ``QUIET``,
  ``WRITE_WAIT`` at most. Their requests coming back to back are delayed by a heavy write at most
  once per ``WRITE_WAIT``, and while they keep coming a process writes about one batch a
  ``WRITE_WAIT``; a company's own single creates never hold back its own batches.

Every 429 is an RFC 9457 problem naming the cap (``cap``: its setting) and its value (``limit``),
with ``Retry-After``. The caps count per API process: behind several ``oste api`` processes a company
may hold that many on each.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from oste.domain import records as r
from oste.errors import TooMany
from oste.eventloop import PAUSE, WRITE_TURN

CHUNK = 25
"""Items a heavy request handles between two checkpoints."""
MAX_PAUSE = 0.05
"""Seconds a checkpoint waits at most for light requests to finish: a constant flow of light
requests slows heavy work, never stops it."""
QUIET = 0.01
"""Seconds with no light request in flight that count as a pause in them, for ``write_turn``."""
WRITE_WAIT = 1.0
"""Seconds a heavy request's write transaction waits at most for a pause in light requests
(``write_turn``): while light requests come back to back, a heavy write delays them at most once
a second."""
HEAVY_WAIT = 30.0
"""Seconds a heavy request waits at most for its turn before it answers 429."""
RETRY_HELD = 5
"""Retry-After (seconds) of a refused stream or long-poll: one of the company's must end first."""
RETRY_HEAVY = 1
"""Retry-After (seconds) of a refused heavy request."""
CAPS = (
    "OSTE_MAX_STREAMS_PER_COMPANY",
    "OSTE_MAX_LONG_POLLS_PER_COMPANY",
    "OSTE_MAX_HEAVY_REQUESTS_PER_COMPANY",
    "OSTE_MAX_HEAVY_REQUESTS",
)
REFUSED = Counter(
    "oste_api_refused",
    "Requests this API process refused (429) past a company's fair share, by the cap's setting.",
    ["cap"],
)
for _cap in CAPS:
    REFUSED.labels(cap=_cap)  # every series exists from the start, at 0
_LIGHT = "oste.light"
"""The scope key of a request's light mark: a one-item list, True while it counts as light."""


@dataclass(frozen=True)
class Caps:
    """What the shares are held to (the settings of the same names)."""

    max_streams_per_company: int = 10
    max_long_polls_per_company: int = 100
    max_heavy_requests_per_company: int = 2
    max_heavy_requests: int = 1


class ApiShares:
    """Per company: open streams, waiting long-polls, heavy requests; light requests in flight."""

    def __init__(self, caps: Caps | None = None) -> None:
        self.caps = caps or Caps()
        self.light = 0
        """Light requests being served now."""
        self._light_of: dict[str | None, int] = {}
        """Light requests being served now, by the company their path names (None: no company's)."""
        self._quiet: asyncio.Event | None = None
        self._ended: list[tuple[float, str | None]] = []
        """When the last light requests ended (still light), the event loop's time, by the company
        their path names: the latest, and the latest of another company than its (``_other_ended``)."""
        self._streams: dict[uuid.UUID, int] = {}
        self._long_polls: dict[uuid.UUID, int] = {}
        self._heavy: dict[uuid.UUID, int] = {}
        self._running = 0
        self._turns: OrderedDict[uuid.UUID, deque[asyncio.Future[None]]] = OrderedDict()

    # --- light requests ----------------------------------------------------------------------------

    def began(self, scope: Scope) -> None:
        """A request began: it counts as light until it ends or steps aside."""
        owner = company_in_path(scope.get("path", ""))
        scope[_LIGHT] = [True, owner]
        self.light += 1
        self._light_of[owner] = self._light_of.get(owner, 0) + 1
        if self._quiet is not None:
            self._quiet.clear()

    def ended(self, scope: Scope) -> None:
        """A request ended (noted for ``write_turn`` when it was light to its end)."""
        mark = scope.get(_LIGHT)
        if mark and mark[0]:
            self._note_ended(asyncio.get_running_loop().time(), mark[1])
        self.step_aside(scope)

    def step_aside(self, scope: Scope) -> None:
        """The request no longer counts as light (it waits, streams, or is heavy itself)."""
        mark = scope.get(_LIGHT)
        if mark and mark[0]:
            mark[0] = False
            self.light -= 1
            left = self._light_of[mark[1]] - 1
            if left:
                self._light_of[mark[1]] = left
            else:
                del self._light_of[mark[1]]
            if self.light == 0 and self._quiet is not None:
                self._quiet.set()

    def _note_ended(self, when: float, owner: str | None) -> None:
        """Keep the latest end, and the latest of another company than the latest's."""
        kept = [(when, owner)] + [entry for entry in self._ended if entry[1] != owner]
        self._ended = kept[:2]

    def _other_ended(self, company: str | None) -> float:
        """When the last light request not of ``company`` ended (-inf: none yet)."""
        return next((when for when, owner in self._ended if owner != company or owner is None), -math.inf)

    async def checkpoint(self) -> None:
        """Between chunks of heavy work: let everything else run, and wait (a little) while light
        requests are being served."""
        await asyncio.sleep(0)
        if self.light <= 0:
            return
        if self._quiet is None:
            self._quiet = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._quiet.wait(), MAX_PAUSE)

    async def write_turn(self, company: str | None = None) -> None:
        """Before a heavy request's write transaction (on SQLite a light request arriving meanwhile
        waits for the whole transaction; on PostgreSQL it shares the machine with it): wait until the
        light requests of everyone but ``company`` (the heavy request's own, whose requests are its
        own affair) pause: none in flight and none ended for ``QUIET`` (back-to-back requests leave
        shorter gaps), ``WRITE_WAIT`` at most. Requests whose path names no company (the console,
        ``/healthz``) are everyone's."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WRITE_WAIT
        while True:
            now = loop.time()
            if now >= deadline:
                return
            since = now - self._other_ended(company)
            others = self.light - (self._light_of.get(company, 0) if company is not None else 0)
            if others <= 0 and since >= QUIET:
                return
            await asyncio.sleep(min(max(QUIET - since, 0.001), deadline - now))

    async def chunked(self, items: list[Any]) -> AsyncIterator[Any]:
        """``items`` one by one, with a ``checkpoint`` every ``CHUNK``."""
        for index, item in enumerate(items):
            if index and index % CHUNK == 0:
                await self.checkpoint()
            yield item

    # --- held requests -----------------------------------------------------------------------------

    def open_stream(self, request: Request, company: r.Company) -> contextlib.AbstractContextManager[None]:
        """One of the company's stream places, held while the stream is open (429 when all are held)."""
        cap = self.caps.max_streams_per_company
        return self._held(
            request, company, self._streams, cap, "event streams", "OSTE_MAX_STREAMS_PER_COMPANY"
        )

    def long_poll(self, request: Request, company: r.Company) -> contextlib.AbstractContextManager[None]:
        """One of the company's long-poll places, held while it waits (429 when all are held)."""
        cap = self.caps.max_long_polls_per_company
        return self._held(
            request, company, self._long_polls, cap, "long-polls", "OSTE_MAX_LONG_POLLS_PER_COMPANY"
        )

    def streams_of(self, company_id: uuid.UUID) -> int:
        return self._streams.get(company_id, 0)

    def long_polls_of(self, company_id: uuid.UUID) -> int:
        return self._long_polls.get(company_id, 0)

    @contextlib.contextmanager
    def _held(
        self,
        request: Request,
        company: r.Company,
        counts: dict[uuid.UUID, int],
        cap: int,
        what: str,
        setting: str,
    ) -> Iterator[None]:
        held = counts.get(company.id, 0)
        if held >= cap:
            REFUSED.labels(cap=setting).inc()
            raise TooMany(
                f"company {company.name!r} already holds {held} {what} open on this API process, its "
                f"cap ({setting}={cap}); close one, or retry after {RETRY_HELD} s",
                {"cap": setting, "limit": cap, "in_use": held},
                retry_after=RETRY_HELD,
            )
        counts[company.id] = held + 1
        self.step_aside(request.scope)
        try:
            yield
        finally:
            left = counts[company.id] - 1
            if left:
                counts[company.id] = left
            else:
                del counts[company.id]

    # --- heavy requests ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def heavy(self, request: Request, company: r.Company) -> AsyncIterator[None]:
        """Run a heavy request: within the company's cap (429 past it), when its turn comes."""
        self.step_aside(request.scope)
        held = self._heavy.get(company.id, 0)
        cap = self.caps.max_heavy_requests_per_company
        if held >= cap:
            REFUSED.labels(cap="OSTE_MAX_HEAVY_REQUESTS_PER_COMPANY").inc()
            raise TooMany(
                f"company {company.name!r} already has {held} heavy requests (batch creates, bulk changes, "
                f"backfills) running or waiting on this API process, its cap "
                f"(OSTE_MAX_HEAVY_REQUESTS_PER_COMPANY={cap}); send them one after another, or retry "
                f"after {RETRY_HEAVY} s",
                {"cap": "OSTE_MAX_HEAVY_REQUESTS_PER_COMPANY", "limit": cap, "in_use": held},
                retry_after=RETRY_HEAVY,
            )
        self._heavy[company.id] = held + 1
        try:
            await self._turn(company.id)
            pausing = PAUSE.set(self.checkpoint)  # the store's chunked work pauses as ours does
            # and its writes wait for a pause in other companies' light requests
            writing = WRITE_TURN.set(functools.partial(self.write_turn, company.name))
            try:
                yield
            finally:
                WRITE_TURN.reset(writing)
                PAUSE.reset(pausing)
                self._pass_turn()
        finally:
            left = self._heavy[company.id] - 1
            if left:
                self._heavy[company.id] = left
            else:
                del self._heavy[company.id]

    async def _turn(self, company_id: uuid.UUID) -> None:
        """Return once this request may run (a slot of ``max_heavy_requests`` is its own)."""
        if self._running < self.caps.max_heavy_requests and not self._turns:
            self._running += 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._turns.setdefault(company_id, deque()).append(turn)
        try:
            done, _ = await asyncio.wait({turn}, timeout=HEAVY_WAIT)
        except asyncio.CancelledError:
            self._give_up(company_id, turn)
            raise
        if not done:
            self._give_up(company_id, turn)
            cap = self.caps.max_heavy_requests
            REFUSED.labels(cap="OSTE_MAX_HEAVY_REQUESTS").inc()
            raise TooMany(
                f"this API process runs {cap} heavy requests at once (OSTE_MAX_HEAVY_REQUESTS={cap}) and "
                f"this one waited {HEAVY_WAIT:g} s for its turn; retry after {RETRY_HEAVY} s",
                {"cap": "OSTE_MAX_HEAVY_REQUESTS", "limit": cap, "in_use": self._running},
                retry_after=RETRY_HEAVY,
            )

    def _give_up(self, company_id: uuid.UUID, turn: asyncio.Future[None]) -> None:
        """A waiter leaves: a turn already given to it passes on, else it leaves the queue."""
        if turn.done() and not turn.cancelled():
            self._pass_turn()
            return
        turn.cancel()
        waiting = self._turns.get(company_id)
        if waiting is not None:
            with contextlib.suppress(ValueError):
                waiting.remove(turn)
            if not waiting:
                del self._turns[company_id]

    def _pass_turn(self) -> None:
        """A heavy request ended: its slot goes to the next company in turn (round robin)."""
        self._running -= 1
        while self._turns and self._running < self.caps.max_heavy_requests:
            company_id, waiting = self._turns.popitem(last=False)
            turn = waiting.popleft()
            if waiting:
                self._turns[company_id] = waiting  # to the back of the line
            if not turn.done():
                turn.set_result(None)
                self._running += 1


def company_in_path(path: str) -> str | None:
    """The company an API path (ASGI's, percent-decoded) names: ``/v1/companies/{name}/…``; else None."""
    if not path.startswith(_COMPANIES):
        return None
    name = path[len(_COMPANIES) :].split("/", 1)[0]
    return name or None


_COMPANIES = "/v1/companies/"


class LightRequests:
    """ASGI middleware: every HTTP request counts as light in ``shares`` while it runs, unless it
    steps aside (``ApiShares.step_aside``)."""

    def __init__(self, app: ASGIApp, shares: ApiShares) -> None:
        self.app = app
        self.shares = shares

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.shares.began(scope)
        try:
            await self.app(scope, receive, send)
        finally:
            self.shares.ended(scope)
