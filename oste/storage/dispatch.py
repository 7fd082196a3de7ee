"""The engine's half of the Store contract: nodes, partition leases, claims, completions, rescue.

``DispatchStore`` is what the dispatch engine talks to. Its methods:

- return plain frozen records from ``oste.domain.claims`` (never ORM objects or raw rows);
- never block on another node: claims and partition acquisition skip rows another transaction has
  locked (PostgreSQL), or run as one single-writer statement (SQLite);
- guard every write to a claimed activity with its claim token, so a node whose lease expired (and
  whose work was handed to another node) can never overwrite the newer claim's result;
- raise ``Unavailable`` when the database cannot be reached; nothing else on purpose.

SQL that differs per dialect is a member of the ``Dialect`` (``oste.storage.dialects``), the open database's.
"""

from __future__ import annotations

import hmac
import random
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from tortoise import connections
from tortoise.exceptions import IntegrityError
from tortoise.expressions import F
from tortoise.transactions import in_transaction

from oste.domain.bound_credentials import credential_fields
from oste.domain.claims import (
    Claim,
    Completion,
    CompletionResult,
    Deferral,
    DispatchTarget,
    ExpiredClaim,
    NodeInfo,
)
from oste.domain.clock import Clock
from oste.domain.delivery import (
    StatusPolicy,
    applied_digest,
    callback_report,
    conclude,
    conclude_expired,
    token_digest,
)
from oste.domain.ids import new_id
from oste.domain.partitions import ALL_PARTITIONS
from oste.domain.receiver_auth import auth_from_document
from oste.domain.records import ActivityState, Header, Outcome
from oste.errors import Unavailable
from oste.metrics import count_delivery
from oste.storage import models as m
from oste.storage.chains import write_follow_ons
from oste.storage.database import outages_unavailable
from oste.storage.dialects import EXECUTION_COLUMNS, Dialect, FollowOnWriter, Params, dialect_of
from oste.storage.events import Change, completion_changes, record, record_changes, subscribed_solutions
from oste.storage.flows import ANY_FLOW_TYPE, FLOW_TYPES, flow_pick, trim_sql
from oste.storage.notices import publish
from oste.storage.stats import SettledOutcomes

TYPES_CHECKED = 1000
"""Activity types whose stored versions one statement reads at most.

After each claim the store reads the stored versions (``updated_at`` of the type and its solution) of
the claimed activities' types: a loaded type (verb, URI, headers, auth, signing secret…) is reused
while it is of that version and read again, URI and credentials together in one statement, as soon
as it changed. A change is thus seen by every claim made after it committed, on every node."""
WRITE_CHUNK = 500
_UNCLAIMED = "state = 'scheduled', claimed_by = NULL, claim_token = NULL, lease_expires_at = NULL"
"""The assignments that hand a claimed activity back to the queue."""
"""Completions written per statement."""
_CLAIM_COLUMNS = (
    "id",
    "activity_type_id",
    "parameter",
    "attempts",
    "retries",
    "partition",
    "scheduled_for",
    "next_attempt_at",
    "recurring_activity_id",
    "occurrence_at",
    "priority",
    "uri_override",
    "expires_at",
    "snoozes",
    "traceparent",
    "tracestate",
)
_NODE_ID_CHARS = re.compile(r"[^a-z0-9-]+")
FLOW_CHECK_INTERVAL = 1.0
"""Seconds between two looks for types with per-object flow control: a type that gains ``per_object``
leaves the ordinary claim at once (in its statement) and is claimed by the flow claim (``oste.storage
.flows``) from the next look on; while no type has it, the flow claim costs nothing."""


class DispatchStore:
    """The dispatch engine's storage contract over Tortoise (SQLite or PostgreSQL).

    Create it after the database is open: it takes the open database's ``Dialect``.
    """

    def __init__(self, clock: Clock, connection: str = "default") -> None:
        self.clock = clock
        self.connection = connection
        self.strategy: Dialect = dialect_of(connections.get(connection))
        self._targets: dict[uuid.UUID, DispatchTarget] = {}
        self._flows_checked_at = -FLOW_CHECK_INTERVAL
        self._flows = False
        self._flows_first = False
        self.settled = SettledOutcomes(connection)
        """The outcomes of callback waits settled here, counted in the statistics after their commit."""

    @property
    def writes_concurrently(self) -> bool:
        """Whether several completion batches may be written at once (each on its own pooled
        connection); False where one connection serves the process."""
        return self.strategy.pooled

    # --- nodes ----------------------------------------------------------------------------------

    async def register_node(self, name: str, role: str) -> NodeInfo:
        """Register a new node under an id unique in this store (``<name>-<random>``) and return it.

        Also makes sure every partition has its lease row. Never reuses the id of another node.
        """
        await self.ensure_partitions()
        now = self.clock.now()
        stem = _NODE_ID_CHARS.sub("-", name.lower()).strip("-")[:40] or "node"
        async with self._db():
            for _ in range(8):
                row = m.Node(
                    id=f"{stem}-{secrets.token_hex(6)}",
                    name=name[:255],
                    role=role,
                    started_at=now,
                    heartbeat_at=now,
                )
                try:
                    await row.save(force_create=True)
                except IntegrityError:
                    continue
                return _node(row)
        raise Unavailable("could not register a unique node id; is the node table writable?")

    async def heartbeat(self, node: NodeInfo) -> NodeInfo:
        """Record that ``node`` is alive now; re-inserts its row if it was pruned meanwhile."""
        now = self.clock.now()
        async with self._db():
            if await m.Node.filter(id=node.id).update(heartbeat_at=now) == 0:
                await m.Node.create(
                    id=node.id, name=node.name, role=node.role, started_at=node.started_at, heartbeat_at=now
                )
        return NodeInfo(node.id, node.name, node.role, node.started_at, now)

    async def live_nodes(self, since: datetime) -> list[NodeInfo]:
        """Nodes whose last heartbeat is at or after ``since``, in id order."""
        async with self._db():
            rows = await m.Node.filter(heartbeat_at__gte=since).order_by("id")
        return [_node(row) for row in rows]

    async def deregister_node(self, node_id: str) -> None:
        """Forget a stopping node and give up its partitions, so others rebalance at once."""
        async with self._db():
            await self.release_partitions(node_id)
            await m.Node.filter(id=node_id).delete()

    async def prune_nodes(self, before: datetime) -> int:
        """Delete nodes silent since before ``before``; returns how many."""
        async with self._db():
            return await m.Node.filter(heartbeat_at__lt=before).delete()

    async def database_time(self) -> datetime:
        """The database server's current time (what due times and leases are measured against)."""
        async with self._db():
            rows = await self._conn().execute_query_dict(self.strategy.now_sql)
        return self.strategy.time_of(rows[0]["now"])

    # --- partitions -----------------------------------------------------------------------------

    async def ensure_partitions(self) -> None:
        """Create the lease row of every partition that has none (idempotent, concurrency-safe)."""
        params = Params(self.strategy)
        rows = ", ".join(f"({params.add(p)}, NULL, NULL)" for p in ALL_PARTITIONS)
        sql = (
            f"INSERT INTO partition_lease (partition, owner, expires_at) VALUES {rows} ON CONFLICT DO NOTHING"
        )
        async with self._db():
            await self._conn().execute_query_dict(sql, params.values)

    async def renew_partitions(self, owner: str, until: datetime) -> tuple[int, ...]:
        """Extend every partition lease ``owner`` holds to ``until``; returns those partitions."""
        params = Params(self.strategy)
        sql = (
            f"UPDATE partition_lease SET expires_at = {params.add(until)} "
            f"WHERE owner = {params.add(owner)} RETURNING partition"
        )
        async with self._db():
            rows = await self._conn().execute_query_dict(sql, params.values)
        return tuple(sorted(int(row["partition"]) for row in rows))

    async def acquire_partitions(self, owner: str, count: int, until: datetime) -> tuple[int, ...]:
        """Take up to ``count`` partitions that are free or whose lease expired; returns those taken.

        Safe when several nodes acquire at once: a partition goes to exactly one of them.
        """
        if count <= 0:
            return ()
        params = Params(self.strategy)
        taken = f"owner = {params.add(owner)}, expires_at = {params.add(until)}"
        pick = (
            f"WHERE owner IS NULL OR expires_at < {params.add(self.clock.now())} "
            f"ORDER BY partition LIMIT {params.add(count)}"
        )
        sql = self.strategy.update_picked("partition_lease", "partition", taken, pick, ["partition"])
        async with self._db():
            rows = await self._conn().execute_query_dict(sql, params.values)
        return tuple(sorted(int(row["partition"]) for row in rows))

    async def release_partitions(self, owner: str, partitions: Iterable[int] | None = None) -> int:
        """Give up ``partitions`` (all when None) held by ``owner``; returns how many were released."""
        query = m.PartitionLease.filter(owner=owner)
        if partitions is not None:
            query = query.filter(partition__in=list(partitions))
        async with self._db():
            return await query.update(owner=None, expires_at=None)

    async def partition_owners(self) -> dict[int, str | None]:
        """Every partition's current owner (None when free), ignoring lease expiry."""
        async with self._db():
            rows = await m.PartitionLease.all().values_list("partition", "owner")
        return {int(p): owner for p, owner in rows}

    # --- claims ---------------------------------------------------------------------------------

    async def claim_due(
        self,
        owner: str,
        partitions: Sequence[int],
        limit: int,
        lease_seconds: float,
        horizon: datetime,
        skip_types: Iterable[uuid.UUID] = (),
        skip_companies: Iterable[uuid.UUID] = (),
    ) -> list[Claim]:
        """Claim up to ``limit`` scheduled activities due at or before ``horizon`` in ``partitions``.

        Activities of ``skip_types`` and of ``skip_companies`` are left for later (the node has enough
        of them waiting, or as many waiting as the company's share of its slots can start).

        Each claimed activity becomes ``running`` under one new claim token, owned by ``owner`` until
        ``now + lease_seconds``. Concurrent claimers get disjoint activities. Activities of paused
        companies, solutions or types are left alone. Returns claims ordered by due time, each carrying
        its activity type and solution secret (loaded in one query per batch, then cached).
        """
        if limit <= 0 or not partitions:
            return []
        skip = (skip_types, skip_companies)
        if not await self._any_flows():
            return await self._claim_picked(owner, partitions, limit, lease_seconds, horizon, skip, False)
        # Per-object types by their own statement; which goes first alternates, so neither starves.
        self._flows_first = not self._flows_first
        claims: list[Claim] = []
        for flows in (True, False) if self._flows_first else (False, True):
            if len(claims) < limit:
                more = await self._claim_picked(
                    owner, partitions, limit - len(claims), lease_seconds, horizon, skip, False, flows
                )
                claims += more
        return sorted(claims, key=lambda c: c.due_at)

    async def _any_flows(self) -> bool:
        """Whether some type has per-object flow control (looked up every ``FLOW_CHECK_INTERVAL``)."""
        now = time.monotonic()
        if now - self._flows_checked_at >= FLOW_CHECK_INTERVAL:
            async with self._db():
                self._flows = bool(await self._conn().execute_query_dict(ANY_FLOW_TYPE))
            self._flows_checked_at = now
        return self._flows

    async def claim_overdue_elsewhere(
        self,
        owner: str,
        held: Sequence[int],
        limit: int,
        lease_seconds: float,
        before: datetime,
        skip_types: Iterable[uuid.UUID] = (),
        skip_companies: Iterable[uuid.UUID] = (),
    ) -> list[Claim]:
        """Help a node that is behind: claim up to ``limit`` activities due before ``before`` in the
        partitions this node does *not* hold, of types without ``max_concurrency`` or ``rate_limit``.

        Their owner would have claimed them ahead of time if it could keep up, so they are its backlog
        (or a dead node's). A type with limits is left to its owner, which alone enforces them. The
        claims are ordinary claims: leased, exclusive, completed and rescued like any other.
        """
        if limit <= 0 or len(set(held)) >= len(ALL_PARTITIONS):
            return []
        skip = (skip_types, skip_companies)
        return await self._claim_picked(owner, held, limit, lease_seconds, before, skip, True)

    async def claim_expired(self, owner: str, limit: int, lease_seconds: float) -> list[Claim]:
        """Claim up to ``limit`` scheduled activities past their deadline, wherever they are: their
        ``expires_at`` passed, or their type's ``max_lateness`` after ``scheduled_for`` did. Paused
        companies, solutions and types, open breakers and partitions held elsewhere do not keep them:
        an expired activity is ended ``expired`` unsent (``oste.engine.maintenance.Expirer``). The
        claims are ordinary claims, completed like any other."""
        if limit <= 0:
            return []
        now = self.clock.now()
        async with self._db():
            late = await m.ActivityType.filter(max_lateness__isnull=False).values_list("id", "max_lateness")
        token = new_id()
        lease_until = now + timedelta(seconds=lease_seconds)
        claims: list[Claim] = []
        groups = [late[start : start + TYPES_CHECKED] for start in range(0, len(late), TYPES_CHECKED)]
        for group in groups or [[]]:
            sql, values = self._expiry_statement(owner, token, lease_until, now, group, limit - len(claims))
            async with self._db():
                rows = await self._conn().execute_query_dict(sql, values)
            if rows:
                claims += await self._claims_of(rows, owner, token, lease_until, now)
            if len(claims) >= limit:
                break
        return claims

    def _expiry_statement(
        self,
        owner: str,
        token: uuid.UUID,
        lease_until: datetime,
        now: datetime,
        late_types: Sequence[tuple[uuid.UUID, float]],
        limit: int,
    ) -> tuple[str, list[Any]]:
        """The expiry sweep's claim: scheduled activities whose ``expires_at`` passed (the expiry
        index's rows), or of ``late_types`` (id, max lateness in seconds) due longer ago than that."""
        p = Params(self.strategy)
        lease = (
            f"state = 'running', claimed_by = {p.add(owner)}, claim_token = {p.uid(token)}, "
            f"lease_expires_at = {p.add(lease_until)}, updated_at = {p.add(now)}"
        )
        past = [f"expires_at <= {p.add(now)}"]
        for type_id, lateness in late_types:
            cutoff = now - timedelta(seconds=float(lateness))
            past.append(f"(activity_type_id = {p.uid(type_id)} AND scheduled_for <= {p.add(cutoff)})")
        pick = f"WHERE state = 'scheduled' AND ({' OR '.join(past)}) LIMIT {p.add(limit)}"
        return self.strategy.update_picked("activity", "id", lease, pick, _CLAIM_COLUMNS), p.values

    async def _claims_of(
        self, rows: list[dict[str, Any]], owner: str, token: uuid.UUID, lease_until: datetime, now: datetime
    ) -> list[Claim]:
        """The claims of claimed rows (their types read or reused), their ``running`` events recorded."""
        await publish(self.connection, (self.strategy.uuid_of(row["id"]) for row in rows))
        versions = await self._versions({self.strategy.uuid_of(row["activity_type_id"]) for row in rows})
        targets = await self._targets_of(versions)
        claims = [self._claim(row, owner, token, lease_until, targets) for row in rows]
        running = [(c.target.solution_id, Change(c.activity_id, "running", c.attempt)) for c in claims if c]
        await record_changes(running, now, self.connection)
        return sorted((c for c in claims if c is not None), key=lambda c: c.due_at)

    async def _claim_picked(
        self,
        owner: str,
        partitions: Sequence[int],
        limit: int,
        lease_seconds: float,
        horizon: datetime,
        skip: tuple[Iterable[uuid.UUID], Iterable[uuid.UUID]],
        elsewhere: bool,
        flows: bool = False,
    ) -> list[Claim]:
        now = self.clock.now()
        token = new_id()
        lease_until = now + timedelta(seconds=lease_seconds)
        types, companies = sorted(set(skip[0])), sorted(set(skip[1]))
        sql, values = self._claim_statement(
            owner, token, lease_until, now, partitions, limit, horizon, types, elsewhere, companies, flows
        )
        async with self._db():
            if flows:
                rows = await self._claim_flows(sql, values, token, now)
            elif self.strategy.due_in_order_sql:
                async with in_transaction(self.connection) as conn:
                    await conn.execute_script(self.strategy.due_in_order_sql)
                    rows = await conn.execute_query_dict(sql, values)
            else:
                rows = await self._conn().execute_query_dict(sql, values)
        if not rows:
            return []
        return await self._claims_of(rows, owner, token, lease_until, now)

    def _claim_statement(
        self,
        owner: str,
        token: uuid.UUID,
        lease_until: datetime,
        now: datetime,
        partitions: Sequence[int],
        limit: int,
        horizon: datetime,
        skip_types: Sequence[uuid.UUID],
        elsewhere: bool = False,
        skip_companies: Sequence[uuid.UUID] = (),
        flows: bool = False,
    ) -> tuple[str, list[Any]]:
        """The claim of due activities in ``partitions``; with ``elsewhere``, in all *other*
        partitions and only of types without limits. Without ``flows`` types with per-object flow
        control are left out; with it only theirs are claimed, those whose object's rule lets them
        start (``oste.storage.flows``)."""
        p = Params(self.strategy)
        lease = (
            f"state = 'running', claimed_by = {p.add(owner)}, claim_token = {p.uid(token)}, "
            f"lease_expires_at = {p.add(lease_until)}, updated_at = {p.add(now)}"
        )
        where = f"state = 'scheduled' AND next_attempt_at <= {p.add(horizon)}"
        if len(set(partitions)) < len(ALL_PARTITIONS):
            held = self.strategy.in_list("partition", sorted(set(partitions)), p, "smallint")
            where += f" AND NOT {held}" if elsewhere else f" AND {held}"
        if skip_types:
            where += " AND NOT " + self._in_uuids("activity_type_id", skip_types, p)
        if skip_companies:
            where += " AND NOT " + self._in_uuids("company_id", skip_companies, p)
        left_alone = "t.paused OR s.paused OR c.paused"
        if flows:
            flow_type = self.strategy.walked_past("activity_type_id")
            where += f" AND {flow_type} IN ({FLOW_TYPES}) AND {flow_pick(self.strategy)}"
        else:
            left_alone += " OR t.per_object_scope IS NOT NULL"
        if elsewhere:
            left_alone += " OR t.max_concurrency IS NOT NULL OR t.rate_limit IS NOT NULL"
        paused = (
            "activity_type_id NOT IN (SELECT t.id FROM activity_type t "
            "JOIN solution s ON s.id = t.solution_id JOIN company c ON c.id = s.company_id "
            f"WHERE {left_alone})"
        )
        pick = f"WHERE {where} AND {paused} ORDER BY next_attempt_at LIMIT {p.add(limit)}"
        columns = (*_CLAIM_COLUMNS, "object_id") if flows else _CLAIM_COLUMNS
        return self.strategy.update_picked("activity", "id", lease, pick, columns), p.values

    async def _claim_flows(
        self, sql: str, values: list[Any], token: uuid.UUID, now: datetime
    ) -> list[dict[str, Any]]:
        """Run a flow claim in a transaction: the claim (taking each object's turn), then the check of
        its claims against the store as it is now, handing back those that break their object's rule
        (``oste.storage.flows``). Returns the rows kept."""
        async with in_transaction(self.connection) as conn:
            if self.strategy.due_in_order_sql:
                await conn.execute_script(self.strategy.due_in_order_sql)
            rows = await conn.execute_query_dict(sql, values)
            with_object = [row["id"] for row in rows if row.get("object_id") is not None]
            if not with_object:
                return list(rows)
            p = Params(self.strategy)
            ids = self.strategy.in_list("a.id", with_object, p, "uuid")
            broken = await conn.execute_query_dict(trim_sql(ids, lambda: p.uid(token)), p.values)
            if not broken:
                return list(rows)
            back = Params(self.strategy)
            assign = f"{_UNCLAIMED}, updated_at = {back.add(now)}"
            where = self.strategy.in_list("id", [row["id"] for row in broken], back, "uuid")
            await conn.execute_query_dict(self.strategy.update_locked("activity", assign, where), back.values)
        handed_back = {self.strategy.uuid_of(row["id"]) for row in broken}
        return [row for row in rows if self.strategy.uuid_of(row["id"]) not in handed_back]

    def _claim(
        self,
        row: dict[str, Any],
        owner: str,
        token: uuid.UUID,
        lease_until: datetime,
        targets: dict[uuid.UUID, DispatchTarget],
    ) -> Claim | None:
        s = self.strategy
        target = targets.get(s.uuid_of(row["activity_type_id"]))
        if target is None:  # the type was deleted meanwhile (its activities go with it)
            return None
        return Claim(
            activity_id=s.uuid_of(row["id"]),
            claim_token=token,
            owner=owner,
            attempt=int(row["attempts"]) + 1,
            retries=int(row["retries"]),
            partition=int(row["partition"]),
            scheduled_for=s.time_of(row["scheduled_for"]),
            due_at=s.time_of(row["next_attempt_at"]),
            parameter=s.json_of(row["parameter"]),
            recurring_activity_id=s.optional_uuid_of(row["recurring_activity_id"]),
            occurrence_at=s.optional_time_of(row["occurrence_at"]),
            lease_expires_at=lease_until,
            target=target,
            priority=int(row["priority"]),
            uri_override=row["uri_override"],
            expires_at=s.optional_time_of(row["expires_at"]),
            snoozes=int(row["snoozes"] or 0),
            traceparent=row["traceparent"],
            tracestate=row["tracestate"],
        )

    async def _targets_of(
        self, versions: dict[uuid.UUID, tuple[datetime, datetime]]
    ) -> dict[uuid.UUID, DispatchTarget]:
        """The dispatch targets of these activity types at (at least) these versions: the cached one
        while it is of the same version, else read again in one statement (URI, headers, auth and
        signing secret from one consistent row)."""
        found: dict[uuid.UUID, DispatchTarget] = {}
        for type_id, version in versions.items():
            cached = self._targets.get(type_id)
            if cached is not None and cached.version == version:
                found[type_id] = cached
        missing = versions.keys() - found.keys()
        if missing:
            async with self._db():
                rows = await m.ActivityType.filter(id__in=list(missing)).select_related("solution__company")
            for row in rows:
                target = _target(row)
                self._targets[row.id] = target
                found[row.id] = target
        return found

    async def refresh_targets(self, type_ids: Iterable[uuid.UUID]) -> int:
        """Read again those of ``type_ids`` (types of claims the node holds) whose stored version
        changed since they were read: one query for the versions, one for what changed. Claims
        already held then fire with the new version (``latest_target``). Returns how many changed."""
        known = {i for i in set(type_ids) if i in self._targets}
        if not known:
            return 0
        changed = {i: v for i, v in (await self._versions(known)).items() if self._targets[i].version != v}
        if changed:
            await self._targets_of(changed)
        return len(changed)

    async def _versions(self, type_ids: set[uuid.UUID]) -> dict[uuid.UUID, tuple[datetime, datetime]]:
        """The stored versions (``updated_at`` of the type and of its solution) of these types; a
        deleted type is missing. One statement per ``TYPES_CHECKED`` types."""
        ordered = sorted(type_ids)
        versions: dict[uuid.UUID, tuple[datetime, datetime]] = {}
        s = self.strategy
        for start in range(0, len(ordered), TYPES_CHECKED):
            p = Params(s)
            which = self._in_uuids("t.id", ordered[start : start + TYPES_CHECKED], p)
            sql = (
                "SELECT t.id, t.updated_at AS type_version, s.updated_at AS solution_version "
                f"FROM activity_type t JOIN solution s ON s.id = t.solution_id WHERE {which}"
            )
            async with self._db():
                rows = await self._conn().execute_query_dict(sql, p.values)
            for row in rows:
                versions[s.uuid_of(row["id"])] = (
                    s.time_of(row["type_version"]),
                    s.time_of(row["solution_version"]),
                )
        return versions

    def latest_target(self, target: DispatchTarget) -> DispatchTarget:
        """The newest version of ``target``'s type this store has read (``target`` itself when none
        is newer): a claim that waited fires with what a later claim found stored."""
        newest = self._targets.get(target.activity_type_id)
        return newest if newest is not None else target

    def forget_targets(self) -> None:
        """Drop cached activity types (the next claims read them again)."""
        self._targets.clear()

    async def complete(self, completions: Sequence[Completion]) -> CompletionResult:
        """Record finished attempts in batches: each activity's next state and one execution row.

        A completion is applied only if its activity is still ``running`` under the same claim token;
        otherwise (the lease expired and the activity was rescued, re-claimed or cancelled) it is
        ignored entirely and counted as stale. Each chunk is written in one transaction.
        """
        applied = stale = 0
        waiting = [c for c in completions if c.state == ActivityState.RUNNING]
        if waiting:
            done = await self._await_callbacks(waiting)
            applied, stale = done, len(waiting) - done
            completions = [c for c in completions if c.state != ActivityState.RUNNING]
        for start in range(0, len(completions), WRITE_CHUNK):
            chunk = completions[start : start + WRITE_CHUNK]
            done = await self._complete_chunk(chunk)
            applied += done
            stale += len(chunk) - done
        return CompletionResult(applied, stale)

    async def _await_callbacks(self, waiting: Sequence[Completion]) -> int:
        """Leave 202s of callback types ``running``, waiting for their callbacks until their deadline
        (``lease_expires_at``; the rescuer ends them past it). Returns how many were still current."""
        now = self.clock.now()
        done = 0
        async with self._db():
            for c in waiting:
                current = m.Activity.filter(
                    id=c.activity_id, state=ActivityState.RUNNING, claim_token=c.claim_token
                )
                first = await current.filter(completion_heartbeats__isnull=True).update(
                    lease_expires_at=c.next_attempt_at,
                    completion_heartbeats=0,
                    claimed_by=None,  # no node holds it: its lease is the callback's deadline
                    updated_at=now,
                )  # else a heartbeat came before this write: its count stands
                done += first or await current.update(
                    lease_expires_at=c.next_attempt_at, claimed_by=None, updated_at=now
                )
        return done

    async def arm_completion(self, claim: Claim, digest: str) -> bool:
        """Keep the digest of the completion token the claim's attempt is about to carry (before the
        request goes out: its receiver may call back before the answer is written). False when the
        claim is no longer current."""
        async with self._db():
            changed = await m.Activity.filter(
                id=claim.activity_id, state=ActivityState.RUNNING, claim_token=claim.claim_token
            ).update(completion_hash=digest, completion_heartbeats=None)
        return changed > 0

    async def _callback_row(self, activity_id: uuid.UUID, token: str) -> m.Activity | None:
        """The activity a completion token names, when it exists (its token may no longer match)."""
        async with self._db():
            row = await m.Activity.filter(id=activity_id).first()
            if row is not None:  # its type read whole, as a claim reads it (URI, secrets, chaining)
                activity_types = await m.ActivityType.filter(id=row.activity_type_id).select_related(
                    "solution__company"
                )
                row.activity_type = activity_types[0]
            return row

    @staticmethod
    def _current(row: m.Activity, token: str) -> bool:
        """True when ``token`` is the completion token of the activity's current, running attempt."""
        if row.state != ActivityState.RUNNING or row.claim_token is None or row.completion_hash is None:
            return False
        return hmac.compare_digest(row.completion_hash, token_digest(token, row.claim_token))

    async def complete_by_callback(
        self,
        activity_id: uuid.UUID,
        token: str,
        outcome: str,
        result: Any,
        error: str | None,
        rng: random.Random | None = None,
    ) -> str:
        """Apply a receiver's callback once: ``ok`` succeeds the activity (``result`` feeds a success
        follow-on like a response body), ``failed`` dead-letters it, ``retry`` retries it. Returns
        ``applied``, ``unknown`` (no such activity), ``already_applied`` (this very callback was applied
        before: its caller retried) or ``conflict`` (not its current attempt's token, already completed
        otherwise, cancelled, requeued)."""
        row = await self._callback_row(activity_id, token)
        if row is None:
            return "unknown"
        if not self._current(row, token):
            applied = row.completion_hash is not None and hmac.compare_digest(
                row.completion_hash, applied_digest(token)
            )
            return "already_applied" if applied else "conflict"
        now = self.clock.now()
        assert row.claim_token is not None and row.lease_expires_at is not None
        claim = Claim(
            row.id,
            row.claim_token,
            row.claimed_by or "callback",
            row.attempts + 1,
            row.retries,
            row.partition,
            row.scheduled_for,
            row.next_attempt_at,
            row.parameter or {},
            row.recurring_activity_id,
            row.occurrence_at,
            row.lease_expires_at,
            _target(row.activity_type),
            row.priority,
            row.uri_override,
            row.expires_at,
            row.snoozes,
        )
        started = row.updated_at if row.claimed_by is None else now
        completion = conclude(claim, callback_report(outcome, started, now, result, error), "callback", rng)
        async with self._db():
            after = _after_completions([completion], await subscribed_solutions(now, self.connection))

            async def hook(conn: Any, strategy: Dialect, written: Sequence[Completion], at: datetime) -> int:
                created = await after(conn, strategy, written, at) if after is not None else 0
                if written:  # what a repeat of this callback is told (``applied_digest``)
                    p = Params(strategy)
                    mark = f"completion_hash = {p.add(applied_digest(token))}"
                    where = f"id = {p.add(strategy.encode_uuid(row.id))}"
                    await conn.execute_query(f"UPDATE activity SET {mark} WHERE {where}", p.values)
                return created

            ids = await self.strategy.record_completions(self.connection, [completion], now, hook)
        await publish(self.connection, ids)
        if not ids:
            return "conflict"
        outcome = completion.report.outcome
        self.settled.add(now, row.company_id, row.solution_id, row.activity_type_id, outcome)
        count_delivery(str(outcome), _names_of(row.activity_type))
        return "applied"

    async def heartbeat_completion(self, activity_id: uuid.UUID, token: str) -> tuple[str, datetime | None]:
        """Move a waiting callback's deadline to now plus its type's ``completion_timeout``. Returns
        (``applied``, the new deadline), or (``unknown``/``conflict``, None) as ``complete_by_callback``."""
        row = await self._callback_row(activity_id, token)
        if row is None:
            return "unknown", None
        if not self._current(row, token):  # a heartbeat may come before the 202 is written
            return "conflict", None
        now = self.clock.now()
        deadline = now + timedelta(seconds=row.activity_type.completion_timeout)
        beats = F("completion_heartbeats") + 1 if row.completion_heartbeats is not None else 1
        async with self._db():  # a beat past the deadline is too late: the rescuer may be timing it out
            changed = await m.Activity.filter(
                id=row.id, state=ActivityState.RUNNING, claim_token=row.claim_token, lease_expires_at__gt=now
            ).update(lease_expires_at=deadline, completion_heartbeats=beats)
        return ("applied", deadline) if changed else ("conflict", None)

    async def _complete_chunk(self, chunk: Sequence[Completion]) -> int:
        now = self.clock.now()
        async with self._db():
            hook = _after_completions(chunk, await subscribed_solutions(now, self.connection))
            ids = await self.strategy.record_completions(self.connection, chunk, now, hook)
        await publish(self.connection, ids)
        return len(ids)

    async def extend_leases(self, tokens: Iterable[uuid.UUID], until: datetime) -> int:
        """Extend the lease of every running activity claimed under ``tokens`` to ``until``."""
        token_list = sorted(set(tokens))
        if not token_list:
            return 0
        p = Params(self.strategy)
        assign = f"lease_expires_at = {p.add(until)}"
        where = "state = 'running' AND claimed_by IS NOT NULL AND " + self._in_uuids(
            "claim_token", token_list, p
        )
        async with self._db():
            rows = await self._conn().execute_query_dict(
                self.strategy.update_locked("activity", assign, where), p.values
            )
        return len(rows)

    async def extend_claims(self, claims: Iterable[Claim], until: datetime) -> set[uuid.UUID]:
        """Extend to ``until`` the lease of each of ``claims`` still running under its own token."""
        pairs = sorted({(c.activity_id, c.claim_token) for c in claims})
        extended: set[uuid.UUID] = set()
        for start in range(0, len(pairs), WRITE_CHUNK):
            chunk = pairs[start : start + WRITE_CHUNK]
            p = Params(self.strategy)
            assign = f"lease_expires_at = {p.add(until)}"
            where = self._still_held(chunk, p)
            async with self._db():
                rows = await self._conn().execute_query_dict(
                    self.strategy.update_locked("activity", assign, where), p.values
                )
            ids = {self.strategy.uuid_of(row["id"]) for row in rows}
            extended |= {i for i, token in chunk if i in ids}
        return extended

    def _still_held(self, pairs: Sequence[tuple[uuid.UUID, uuid.UUID]], p: Params) -> str:
        """The condition of the rows among ``pairs`` (activity id, claim token) still ``running``
        under those claims."""
        ids = self._in_uuids("id", [i for i, _ in pairs], p)
        tokens = self._in_uuids("claim_token", sorted({t for _, t in pairs}), p)
        return f"state = 'running' AND {ids} AND {tokens}"

    async def release_claims(self, claims: Iterable[Claim]) -> int:
        """Hand unstarted claims back: ``scheduled`` again, due as before, the attempt not counted."""
        pairs = sorted((c.activity_id, c.claim_token) for c in claims)
        released = 0
        for start in range(0, len(pairs), WRITE_CHUNK):
            chunk = pairs[start : start + WRITE_CHUNK]
            p = Params(self.strategy)
            assign = f"{_UNCLAIMED}, updated_at = {p.add(self.clock.now())}"
            sql = self.strategy.update_locked("activity", assign, self._still_held(chunk, p))
            async with self._db():
                released += len(await self._conn().execute_query_dict(sql, p.values))
        return released

    async def defer(self, deferrals: Sequence[Deferral], node: str) -> int:
        """Put claims back without sending them, due again at each deferral's ``until``: the attempt is
        not counted, no retry is spent, and a ``deferred`` execution (``reason`` as its error) says why
        the activity waited. A claim whose token is no longer current is left alone. Returns how many
        were written."""
        now = self.clock.now()
        written = 0
        for start in range(0, len(deferrals), WRITE_CHUNK):
            chunk = sorted(deferrals[start : start + WRITE_CHUNK], key=lambda d: d.claim.activity_id)
            async with self._db(), in_transaction(self.connection) as conn:
                rows = []
                for item in chunk:
                    p, encode = Params(self.strategy), self.strategy.encode_uuid
                    assign = (  # last_outcome 'deferred': what an operator's close releases
                        f"{_UNCLAIMED}, next_attempt_at = {p.add(self.strategy.encode_time(item.until))}, "
                        f"updated_at = {p.add(self.strategy.encode_time(now))}, last_outcome = 'deferred'"
                    )
                    where = (
                        f"state = 'running' AND id = {p.add(encode(item.claim.activity_id))} "
                        f"AND claim_token = {p.add(encode(item.claim.claim_token))}"
                    )
                    sql = self.strategy.update_locked("activity", assign, where)
                    if await conn.execute_query_dict(sql, p.values):
                        report = (
                            item.claim.attempt,
                            now,
                            now,
                            0.0,
                            "deferred",
                            None,
                            item.reason,
                            None,
                            node,
                        )
                        rows.append((new_id(), item.claim.activity_id, *report))
                if rows:
                    await self.strategy.insert_rows(conn, "execution", EXECUTION_COLUMNS, rows)
            written += len(rows)
        return written

    def _in_uuids(self, column: str, values: Sequence[uuid.UUID], p: Params) -> str:
        encoded = [self.strategy.encode_uuid(v) for v in values]
        return self.strategy.in_list(column, encoded, p, "uuid")

    # --- rescue ---------------------------------------------------------------------------------

    async def expired_claims(self, now: datetime, limit: int) -> list[ExpiredClaim]:
        """Up to ``limit`` running activities whose lease expired before ``now``."""
        async with self._db():
            rows = await (
                m.Activity.filter(state=ActivityState.RUNNING, lease_expires_at__lt=now)
                .order_by("lease_expires_at")
                .limit(limit)
                .select_related("activity_type__solution__company")
            )
        return [
            ExpiredClaim(
                row.id,
                row.claim_token,
                row.claimed_by or ("callback" if row.completion_hash else "?"),
                row.attempts + 1,
                row.retries,
                row.lease_expires_at,
                row.activity_type.backoff_base,
                row.activity_type.backoff_max,
                row.activity_type.on_dead_letter,
                row.solution_id,
                row.updated_at if row.claimed_by is None and row.completion_hash else None,
                row.company_id,
                row.activity_type_id,
                _names_of(row.activity_type),
            )
            for row in rows
            if row.claim_token is not None and row.lease_expires_at is not None
        ]

    async def reap_expired(self, limit: int, rng: random.Random | None = None) -> tuple[int, int]:
        """Return expired claims to the queue, counting the lost attempt (an ``error`` execution).

        Each becomes ``scheduled`` after the type's backoff, or ``dead`` when no retries are left.
        A claim completed or rescued meanwhile by someone else is skipped (its token is stale).
        Returns (rescheduled, dead).
        """
        now = self.clock.now()
        expired = await self.expired_claims(now, limit)
        completions = [conclude_expired(e, now, rng) for e in expired]
        if not completions:
            return 0, 0
        waits = [e for e in expired if e.awaiting_since is not None]
        async with self._db():
            hook = _after_completions(completions, await subscribed_solutions(now, self.connection))
            ids = await self.strategy.record_completions(self.connection, completions, now, hook)
        await publish(self.connection, ids)
        for wait in waits:  # the completion timeouts: the 202's outcome, known now
            if wait.activity_id not in ids or wait.names is None:
                continue
            if wait.company_id and wait.solution_id and wait.activity_type_id:
                self.settled.add(now, wait.company_id, wait.solution_id, wait.activity_type_id, Outcome.ERROR)
            count_delivery(Outcome.ERROR, wait.names)
        dead = sum(1 for c in completions if c.activity_id in ids and c.state == ActivityState.DEAD)
        return len(ids) - dead, dead

    # --- helpers --------------------------------------------------------------------------------

    def _conn(self) -> Any:
        return connections.get(self.connection)

    @asynccontextmanager
    async def _db(self) -> AsyncIterator[None]:
        async with outages_unavailable():  # an outage becomes Unavailable (see storage.database.outage)
            yield


def _names_of(row: m.ActivityType) -> tuple[str, str, str]:
    """A type's (company, solution, type) names, as metrics label it (its solution and company read)."""
    return (row.solution.company.name, row.solution.name, row.name)


def _node(row: m.Node) -> NodeInfo:
    return NodeInfo(row.id, row.name, row.role, row.started_at, row.heartbeat_at)


def _target(row: m.ActivityType) -> DispatchTarget:
    auth = auth_from_document(row.auth)
    headers = {name: str(h["value"]) for name, h in (row.headers or {}).items()}
    statuses = tuple(int(s) for s in row.success_statuses) if row.success_statuses else None
    return DispatchTarget(
        activity_type_id=row.id,
        company_id=row.company_id,
        solution_id=row.solution.id,
        name=row.name,
        verb=row.verb,
        uri_pattern=row.uri_pattern,
        headers=headers,
        timeout=row.timeout,
        backoff_base=row.backoff_base,
        backoff_max=row.backoff_max,
        success_statuses=statuses,
        signing_secret=row.solution.signing_secret,
        company_qos=row.solution.company.qos_level,
        solution_qos=row.solution.qos_level,
        max_concurrency=row.max_concurrency,
        rate_limit=row.rate_limit,
        on_success=row.on_success,
        on_success_delay=row.on_success_delay,
        on_dead_letter=row.on_dead_letter,
        previous_signing_secret=row.solution.previous_signing_secret,
        previous_signing_secret_expires_at=row.solution.previous_signing_secret_expires_at,
        breaker_failures=row.breaker_failures,
        auth=auth,
        credentials=credential_fields(_headers(row.headers), auth),
        version=(row.updated_at.astimezone(UTC), row.solution.updated_at.astimezone(UTC)),
        secret_headers=tuple(str(h["value"]) for h in (row.headers or {}).values() if h.get("secret")),
        status_policy=StatusPolicy.of(row.retry_statuses, row.fail_statuses),
        max_snoozes=row.max_snoozes,
        max_lateness=row.max_lateness,
        completion=row.completion,
        completion_timeout=row.completion_timeout,
        per_object=row.per_object_scope is not None,
    )


def _headers(document: dict[str, Any] | None) -> dict[str, Header]:
    return {name: Header(str(h["value"]), bool(h.get("secret"))) for name, h in (document or {}).items()}


def _after_completions(
    completions: Sequence[Completion], subscribed: frozenset[uuid.UUID]
) -> FollowOnWriter | None:
    """What a completion batch must also write in its transaction: follow-ons when some completion
    chains, events when some activity's solution is streamed; None (the batch costs nothing more)
    when neither."""
    chains = any(c.follow_on is not None for c in completions)
    streamed = bool(subscribed) and any(c.solution_id in subscribed for c in completions)
    if not chains and not streamed:
        return None

    async def after(conn: Any, strategy: Dialect, written: Sequence[Completion], now: datetime) -> int:
        created = await write_follow_ons(conn, strategy, written, now, subscribed) if chains else 0
        if streamed:
            await record(conn, strategy, completion_changes(written, subscribed), now)
        return created

    return after
