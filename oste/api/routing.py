"""The app's router: Starlette's, each request's path tried only against the routes that can match a
path with as many slashes.

Starlette's ``Router`` tries every route in order until one matches: a single create, the 32nd of 67
routes, paid about 23 µs of regular expressions to be found, a callback or a page of the console more. A
``Route`` whose path has no ``path`` convertor matches only paths with as many slashes as its own (its
other convertors match no slash). ``SegmentRouter`` keeps, per number of slashes, the routes that can
match such a path — those, and every route that may match any path (a ``Mount``, a ``path`` convertor) —
in their order, and tries only them, the first full match winning as before, else the first partial
one (a path served for other methods: 405). When none matches, Starlette's own router answers (its
trailing-slash redirect, its 404): whatever answers a request is what Starlette's router would pick
(``tests/unit/test_routing.py`` checks it over the app's own routes).
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any

from starlette.routing import BaseRoute, Match, Route, Router, get_route_path
from starlette.types import Receive, Scope, Send

MAX_SLASHES = 32
"""Paths with more slashes than this (no route of OSTE's has a tenth of it) are tried against every
route, so a client cannot grow the router's table with paths of new lengths."""


def slashes_matched(route: BaseRoute) -> int | None:
    """The number of slashes of every path ``route`` can match, or None when it may match any."""
    if type(route) is Route and ":path}" not in route.path:
        return route.path.count("/")
    return None


def pick(routes: Sequence[BaseRoute], scope: Scope) -> tuple[BaseRoute, MutableMapping[str, Any]] | None:
    """The route Starlette's router hands ``scope`` to among ``routes`` (the first full match, else the
    first partial one) and the scope it adds, or None when none matches."""
    partial = None
    for route in routes:
        match, child_scope = route.matches(scope)
        if match is Match.FULL:
            return route, child_scope
        if match is Match.PARTIAL and partial is None:
            partial = route, child_scope
    return partial


class SegmentRouter(Router):
    """Starlette's router, trying only the routes that can match a path of the request's length."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._by_slashes: dict[int, tuple[BaseRoute, ...]] = {}
        self._routes_seen = -1

    def candidates(self, path: str) -> Sequence[BaseRoute]:
        """The routes, in order, that may match ``path``."""
        if self._routes_seen != len(self.routes):  # a route added since (``add_route``, ``mount``)
            self._by_slashes, self._routes_seen = {}, len(self.routes)
        slashes = path.count("/")
        found = self._by_slashes.get(slashes)
        if found is None:
            if slashes > MAX_SLASHES:
                return self.routes
            found = tuple(r for r in self.routes if slashes_matched(r) in (None, slashes))
            self._by_slashes[slashes] = found
        return found

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().app(scope, receive, send)
            return
        picked = pick(self.candidates(get_route_path(scope)), scope)
        if picked is None:  # Starlette's own answer: a redirect to the path with(out) its slash, or 404
            await super().app(scope, receive, send)
            return
        route, child_scope = picked
        scope.setdefault("router", self)
        scope["route"] = route
        scope.update(child_scope)
        await route.handle(scope, receive, send)
