"""Who is calling the API, checked once, in one place, in the order a request meets the checks.

    handler -> solution_scope -> solution_in_path -> company_in_path -> principal -> authenticate

``authenticate`` reads the bearer token (429 first while the address sent too many wrong ones; then the
admin token, else a company API key: 401 when neither); ``principal`` adds what a company key must pass
(the company in the path is its own, else 404; the scope the request needs, else 403; its company's
request rate, else 429) and notes the key's use; ``company_in_path`` and ``solution_in_path`` resolve
the path's names with isolation, and ``solution_scope`` hands the operations their ``Actor``.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from starlette.requests import Request

from oste.api.callers import Principal
from oste.api.context import ApiContext, ctx
from oste.api.requests import SLUG, slug_in_path
from oste.domain import records as r
from oste.domain.records import Company
from oste.domain.tenancy import KEYS, READ, WRITE
from oste.errors import Forbidden, NotFound, TooMany, Unauthorized
from oste.operations import Actor
from oste.operations.throttle import SignInThrottle


async def authenticate(request: Request, c: ApiContext) -> Principal:
    """Resolve the bearer token to a Principal; 401 when missing or unknown, 429 (before the token is
    checked) when the client's address sent too many wrong ones (``c.throttle`` counts them)."""
    token = bearer_token(request)
    if not token:
        raise Unauthorized("send 'Authorization: Bearer <token>' with the admin token or a company API key")
    address = client_address(request)
    refuse_if_throttled(c.throttle, address)
    if hmac.compare_digest(token.encode(), c.admin_token.encode()):
        return Principal()
    found = await _key_of(request, c, token) if token.startswith("oste_") else None
    if found is None:
        c.throttle.failed(address)
        raise Unauthorized("the bearer token is not the admin token nor a valid (unrevoked) API key")
    company, key = found
    return Principal(company, key.id, key.name, key.scopes, key.last_used_at)


async def _key_of(request: Request, c: ApiContext, token: str) -> tuple[r.Company, r.ApiKey] | None:
    """The company and key of ``token``. A path naming a solution (a valid slug) has it read in the
    same query; ``solution_in_path`` uses it once every check of the key has passed. So is the activity
    type a single create names (``request.state.type_named``, set by its handler): ``read_type``."""
    named = request.path_params.get("solution")
    if named is None or not SLUG.fullmatch(named):
        return await c.store.api_key_of(token)
    type_named = getattr(request.state, "type_named", None)
    if type_named is not None:
        with_type = await c.store.api_key_solution_and_type(token, named, type_named)
        if with_type is None:
            return None
        company, key, solution, activity_type = with_type
        if solution is not None:
            request.state.read_type = (solution.id, type_named, activity_type)
    else:
        found = await c.store.api_key_and_solution(token, named)
        if found is None:
            return None
        company, key, solution = found
    request.state.read_solution = (company.id, named, solution)
    return company, key


def type_read(request: Request, solution: r.Solution) -> tuple[str, r.ActivityType | None] | None:
    """The activity type (name, record or None when the solution has none such) read with the caller's
    key for this solution (``_key_of``), if it was."""
    read = getattr(request.state, "read_type", None)
    if read is None or read[0] != solution.id:
        return None
    return read[1], read[2]


def bearer_token(request: Request) -> str:
    """The token of ``Authorization: Bearer <token>``; "" when there is none."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def client_address(request: Request) -> str | None:
    """The caller's address, as the connection (or a trusted proxy's header, if configured) gives it."""
    return request.client.host if request.client else None


def refuse_if_throttled(throttle: SignInThrottle | None, address: str | None) -> None:
    """429 with Retry-After while ``address`` has sent too many wrong tokens: checked before its token."""
    seconds = throttle.retry_after(address) if throttle is not None else 0
    if seconds and throttle is not None:
        raise TooMany(
            f"too many wrong tokens from {address or 'this address'} (it may send {throttle.burst}, then "
            f"one every {throttle.refill_seconds:g} s): every token it sends, a valid one too, is refused "
            f"without being checked for {seconds} s; retry after {seconds} s",
            retry_after=seconds,
        )


async def principal(request: Request) -> Principal:
    """The caller, checked: its token, the scope the request needs, its company's request rate."""
    c = ctx(request)
    who = await authenticate(request, c)
    if who.company is not None:
        named = request.path_params.get("company")
        if named is not None and named != who.company.name:  # before the scope: 404, as if missing
            raise NotFound(f"company {named!r} not found")
        needed = scope_needed(request)
        if needed not in who.scopes:
            raise Forbidden(
                f"this API key lacks the {needed!r} scope this request needs (it has "
                f"{', '.join(who.scopes)}); use a key with that scope"
            )
        c.company_rates.take(who.company, c.operations.context.quotas.of(who.company))
        await _note_use(c, who)
    request.state.principal = who  # streams and long-polls ask whether its key is still alive
    return who


def scope_needed(request: Request) -> str:
    """``keys`` for a company's API keys, ``read`` for what changes nothing, else ``write``."""
    path = request.url.path
    if "/api-keys" in path:
        return KEYS
    if request.method in ("GET", "HEAD") or path == "/v1/schedule-preview":
        return READ
    return WRITE


KEY_USE_RESOLUTION = 60.0
"""Seconds ``last_used_at`` may lag: a key's use is written at most once a minute."""


async def _note_use(c: ApiContext, who: Principal) -> None:
    now = c.store.clock.now()
    if who.api_key_id is not None and (
        who.last_used_at is None or (now - who.last_used_at).total_seconds() >= KEY_USE_RESOLUTION
    ):
        await c.store.touch_api_key(who.api_key_id, now)


async def company_in_path(request: Request) -> tuple[Principal, r.Company]:
    """The caller and the company named in the path (404 for a company key reaching another company)."""
    who = await principal(request)
    name = slug_in_path(request, "company", "company")
    if who.company is not None and who.company.name == name:
        company = who.company  # the key was just resolved to this company: no need to read it again
    else:
        company = await ctx(request).store.get_company(name)
    check_company_access(who, company)
    request.state.company = company
    return who, company


async def solution_in_path(request: Request) -> tuple[Principal, r.Solution]:
    who, company = await company_in_path(request)
    name = slug_in_path(request, "solution", "solution")
    read = getattr(request.state, "read_solution", None)  # read with the key (``_key_of``)
    if read is not None and read[:2] == (company.id, name):
        if read[2] is None:
            raise NotFound(f"solution {name!r} not found")
        return who, read[2]
    return who, await ctx(request).store.get_solution(company, name)


def actor_of(who: Principal) -> Actor:
    """The operations' view of an API caller."""
    return Actor(
        company=who.company,
        api_key_id=who.api_key_id,
        api_key_name=who.api_key_name,
        scopes=frozenset(who.scopes),
    )


async def solution_scope(request: Request) -> tuple[Actor, r.Company, r.Solution]:
    """The caller, and the company and solution named in the path (isolation as ``solution_in_path``)."""
    who, solution = await solution_in_path(request)
    return actor_of(who), request.state.company, solution


def require_admin(principal: Principal) -> None:
    if not principal.is_admin:
        raise Forbidden(
            "this operation is reserved to the operator (admin token); company API keys cannot do it"
        )


def check_company_access(principal: Principal, company: Company) -> None:
    """A company key reaches its own company only; others answer 404 as if missing."""
    if principal.company is not None and principal.company.id != company.id:
        raise NotFound(f"company {company.name!r} not found")


def key_alive(request: Request) -> Callable[[], Awaitable[bool]] | None:
    """For a company caller: whether its key is still unrevoked (streams and long-polls ask as they
    go); None for the operator. The answer is shared for ``KeyLiveness.FRESH`` seconds by every
    stream and long-poll of the key, so a hundred of them cost one query, not a hundred."""
    who: Principal | None = getattr(request.state, "principal", None)
    if who is None or who.api_key_id is None:
        return None
    c, key_id = ctx(request), who.api_key_id

    async def alive() -> bool:
        return await c.key_liveness.alive(c.store, key_id)

    return alive
