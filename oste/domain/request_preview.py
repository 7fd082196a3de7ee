"""The request an activity's next attempt would make, for people to read: built by the same
``build_request`` the engine fires with, with every secret value masked.

Pure: records in, an ``OutboundRequest`` out.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from oste.domain import records as r
from oste.domain.claims import Claim, DispatchTarget
from oste.domain.outbound import OutboundRequest, build_request
from oste.domain.receiver_auth import BearerAuth, OAuth2ClientCredentials, OutboundAuth

MASK = "••••••"
SIGNATURE_NOTE = "v1,•••••• (HMAC-SHA256 with the solution's signing secret, made per attempt)"
PREVIEW_OWNER = "preview"


def preview_request(
    activity: r.Activity, activity_type: r.ActivityType, solution: r.Solution, now: datetime
) -> OutboundRequest:
    """The next attempt's request as the engine would build it at ``now``; the type's secret header
    values, the signature and the ``Authorization`` an ``auth`` adds are masked. Raises what
    ``fill_uri`` raises when the parameter no longer fills the type's URI pattern."""
    target = DispatchTarget(
        activity_type_id=activity_type.id,
        company_id=activity_type.company_id,
        solution_id=activity_type.solution_id,
        name=activity_type.name,
        verb=activity_type.verb,
        uri_pattern=activity_type.uri_pattern,
        headers={name: header.value for name, header in activity_type.headers.items()},
        timeout=activity_type.timeout,
        backoff_base=activity_type.backoff_base,
        backoff_max=activity_type.backoff_max,
        success_statuses=activity_type.success_statuses,
        signing_secret=solution.signing_secret,
    )
    claim = Claim(
        activity_id=activity.id,
        claim_token=uuid.UUID(int=0),
        owner=PREVIEW_OWNER,
        attempt=activity.attempts + 1,
        retries=activity.retries,
        partition=activity.partition,
        scheduled_for=activity.scheduled_for,
        due_at=activity.next_attempt_at,
        parameter=activity.parameter,
        recurring_activity_id=activity.recurring_activity_id,
        occurrence_at=activity.occurrence_at,
        lease_expires_at=now,
        target=target,
        priority=activity.priority,
    )
    built = build_request(claim, now, span_id="0" * 15 + "1")
    secret_names = {name.lower() for name, header in activity_type.headers.items() if header.secret}
    headers = {name: MASK if name.lower() in secret_names else value for name, value in built.headers.items()}
    headers["webhook-signature"] = SIGNATURE_NOTE
    authorization = _authorization_note(activity_type.auth)
    if authorization is not None:  # it replaces a static header of the same name, as the engine does
        headers = {name: value for name, value in headers.items() if name.lower() != "authorization"}
        headers["Authorization"] = authorization
    return OutboundRequest(built.method, built.url, headers, built.body)


def _authorization_note(auth: OutboundAuth | None) -> str | None:
    """The ``Authorization`` the type's ``auth`` adds, masked (None: it adds none)."""
    if isinstance(auth, BearerAuth):
        return f"Bearer {MASK}"
    if isinstance(auth, OAuth2ClientCredentials):
        return f"Bearer {MASK} (an access token from {auth.token_url})"
    return None
