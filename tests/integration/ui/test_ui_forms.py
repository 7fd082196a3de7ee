"""The UI's create and edit forms over a real server (no browser): a failing submission answers 422 with
every value typed kept and the failing field marked; the forms go through the API's checks and
operations (what they save is what the API then reports); secrets are shown once and never echoed;
a key's scopes bound what its forms may do (403); deleting, revoking and pausing are confirmed first."""

from __future__ import annotations

import html
import re
import sqlite3
from typing import Any

import orjson
import pytest

from tests.integration.api.conftest import Tenant
from tests.integration.ui.conftest import Browser, UiWorld

pytestmark = pytest.mark.asyncio(loop_scope="module")

FIELD = re.compile(r'<(input|textarea|select)\b[^>]*\bname="([^"]+)"[^>]*>', re.S)


def ui_path(tenant: Tenant) -> str:
    return f"/ui/companies/{tenant.company}/solutions/{tenant.solution}"


def marked(page: str) -> set[str]:
    """The names of the fields a page marks as invalid."""
    return {m.group(2) for m in FIELD.finditer(page) if 'aria-invalid="true"' in m.group(0)}


def shown_value(page: str, name: str) -> str | None:
    """What a page's field ``name`` holds (an input's value, a textarea's text, a select's choice)."""
    for m in FIELD.finditer(page):
        if m.group(2) != name:
            continue
        tag = m.group(0)
        if m.group(1) == "input":
            if 'type="checkbox"' in tag:
                return "on" if " checked" in tag else ""
            value = re.search(r'\bvalue="([^"]*)"', tag)
            return html.unescape(value.group(1)) if value else ""
        rest = page[m.end() :]
        if m.group(1) == "textarea":
            return html.unescape(rest[: rest.index("</textarea>")])
        chosen = re.search(r'<option value="([^"]*)" selected>', rest[: rest.index("</select>")])
        return html.unescape(chosen.group(1)) if chosen else ""
    return None


def stored_headers(world: UiWorld, solution: str, name: str) -> dict[str, Any]:
    """A type's headers as the database holds them (secret values included), read with sqlite3."""
    path = world.api.database_url.removeprefix("sqlite://")
    with sqlite3.connect(path) as db:
        (raw,) = db.execute(
            "SELECT t.headers FROM activity_type t JOIN solution s ON s.id = t.solution_id "
            "WHERE s.name = ? AND t.name = ?",
            (solution, name),
        ).fetchone()
    return orjson.loads(raw) if isinstance(raw, str | bytes) else raw


async def test_a_type_form_that_fails_keeps_every_value_and_marks_the_field(
    world: UiWorld, admin: Browser
) -> None:
    tenant, api = world.one, world.api
    base = ui_path(tenant)
    await admin.get(f"{base}/new-type")
    form = {
        "name": "republish",
        "verb": "PUT",
        "uri_pattern": "https://receiver.example/song/{SongId}/republish",
        "parameter_schema": '{"type": "object", "properties": {"SongId": {"type": "integer"}}, '
        '"required": ["SongId"]}',
        "object_id_ref": "SongId",
        "retries": "7",
        "timeout": "PT45S",
        "backoff_base": "PT2S",
        "backoff_max": "PT10M",
        "success_statuses": "200, 202",
        "max_concurrency": "4",
        "rate_limit": "2.5",
        "on_success": "",
        "on_success_delay": "",
        "on_dead_letter": "",
        "header_rows": "2",
        "header-0-name": "X-Tenant",
        "header-0-value": 'acme <&> "quoted"',
        "header-1-name": "X-Api-Key",
        "header-1-value": "s3cret-value",
        "header-1-secret": "on",
    }
    typed = {**form, "timeout": "thirty seconds"}
    refused = await admin.post(f"{base}/new-type", typed, expect=422)
    page = refused.text
    assert marked(page) == {"timeout"}, marked(page)
    assert "ISO 8601" in page
    for name, value in typed.items():
        if name in ("header_rows", "header-1-value"):
            continue
        assert shown_value(page, name) == value, (name, shown_value(page, name), value)
    assert (await api.get(f"{tenant.types}/republish")).status_code == 404  # nothing stored
    # a parameter schema that is not JSON, a rate limit that is not a number: both marked at once
    twice = await admin.post(
        f"{base}/new-type", {**form, "parameter_schema": "{nope", "rate_limit": "fast"}, expect=422
    )
    assert marked(twice.text) == {"parameter_schema", "rate_limit"}
    await admin.post(f"{base}/new-type", form)
    stored = (await api.get(f"{tenant.types}/republish", expect=200)).json()
    assert stored["verb"] == "PUT" and stored["retries"] == 7 and stored["timeout"] == "PT45S"
    assert stored["success_statuses"] == [200, 202] and stored["max_concurrency"] == 4
    assert stored["rate_limit"] == 2.5 and stored["object_id_ref"] == ["SongId"]
    assert stored["headers"] == {
        "X-Tenant": {"secret": False, "value": 'acme <&> "quoted"'},
        "X-Api-Key": {"secret": True},
    }
    # the edit form shows the secret as "secret, unchanged", never its value, and keeps it
    edit = (await admin.get(f"{base}/types/republish/edit")).text
    assert "s3cret-value" not in edit and "secret, unchanged" in edit
    await admin.post(
        f"{base}/types/republish/edit",
        {
            **{k: v for k, v in form.items() if k != "name"},
            "header-1-value": "",
            "header-1-was": "X-Api-Key",
            "retries": "2",
        },
    )
    kept = stored_headers(world, tenant.solution, "republish")
    assert kept["X-Api-Key"] == {"value": "s3cret-value", "secret": True}, kept
    assert (await api.get(f"{tenant.types}/republish", expect=200)).json()["retries"] == 2
    # a header OSTE sets itself is refused on its own row, as the API refuses it
    bad = await admin.post(
        f"{base}/types/republish/edit", {**form, "header-0-name": "Webhook-Id"}, expect=422
    )
    assert marked(bad.text) == {"header-0-name"} and "set by OSTE itself" in bad.text


async def test_companies_solutions_and_quotas_from_the_forms(world: UiWorld, admin: Browser) -> None:
    api = world.api
    await admin.get("/ui/new-company")
    refused = await admin.post("/ui/new-company", {"name": "Not A Slug", "qos_level": "3"}, expect=422)
    assert marked(refused.text) == {"name"} and shown_value(refused.text, "qos_level") == "3"
    assert shown_value(refused.text, "name") == "Not A Slug"
    name = f"formco-{world.one.company[-6:]}"
    created = await admin.post("/ui/new-company", {"name": name, "qos_level": "3"})
    assert created.headers["location"] == f"/ui/companies/{name}"
    taken = await admin.post("/ui/new-company", {"name": name, "qos_level": "1"}, expect=409)
    assert marked(taken.text) == {"name"} and "already exists" in taken.text
    # quotas: a number, "unlimited" (null), empty (unchanged); a bad one keeps the others
    await admin.get(f"/ui/companies/{name}/edit")
    typed = {"qos_level": "5", "quotas/max_solutions": "2", "quotas/max_api_keys": "unlimited"}
    bad = await admin.post(
        f"/ui/companies/{name}/edit", {**typed, "quotas/max_activity_types": "-1"}, expect=422
    )
    assert marked(bad.text) == {"quotas/max_activity_types"}
    assert all(shown_value(bad.text, k) == v for k, v in typed.items())
    await admin.post(f"/ui/companies/{name}/edit", typed)
    company = (await api.get(f"/v1/companies/{name}", expect=200)).json()
    assert company["qos_level"] == 5 and company["quotas"]["max_solutions"] == 2
    assert company["quotas"]["max_api_keys"] is None
    # a solution with log shipping; a bad period is marked and the URIs kept
    base = f"/ui/companies/{name}"
    await admin.get(f"{base}/new-solution")
    solution = {
        "name": "shop",
        "qos_level": "2",
        "success_uri": "https://logs.example/ok",
        "success_period": "P3D",
        "dead_letter_uri": "https://logs.example/dead",
        "dead_letter_period": "P1Y",
    }
    bad = await admin.post(f"{base}/new-solution", solution, expect=422)
    assert marked(bad.text) == {"dead_letter_period"} and "months and years" in bad.text
    assert all(shown_value(bad.text, k) == v for k, v in solution.items() if k != "dead_letter_period")
    made = await admin.post(f"{base}/new-solution", {**solution, "dead_letter_period": "P40D"})
    assert made.headers["location"] == f"{base}/solutions/shop"
    assert "whsec_" not in (await admin.get(f"{base}/solutions/shop")).text  # the operator sees no secret
    stored = (await api.get(f"/v1/companies/{name}/solutions/shop", expect=200)).json()
    assert stored["success_uri"] == "https://logs.example/ok" and stored["dead_letter_period"] == "P40D"
    await admin.get(f"{base}/solutions/shop/edit")
    await admin.post(
        f"{base}/solutions/shop/edit", {**solution, "success_uri": "", "dead_letter_period": "P9D"}
    )
    stored = (await api.get(f"/v1/companies/{name}/solutions/shop", expect=200)).json()
    assert stored["success_uri"] is None and stored["dead_letter_period"] == "P9D"
    # the quota of 2 solutions: the third is refused with 429, the form kept
    await admin.post(f"{base}/new-solution", {**solution, "name": "two", "dead_letter_period": "P9D"})
    over = await admin.post(
        f"{base}/new-solution", {**solution, "name": "three", "dead_letter_period": "P9D"}, expect=429
    )
    assert "max_solutions" in over.text and shown_value(over.text, "name") == "three"
    # pausing and deleting the company are confirmed first, and say what they do
    confirm = (await admin.get(f"{base}/pause?paused=true")).text
    assert "Nothing of company" in confirm and f'action="{base}/pause"' in confirm
    await admin.post(f"{base}/pause", {"paused": "true"}, expect=400)  # no confirmation: nothing happens
    assert (await api.get(f"/v1/companies/{name}", expect=200)).json()["paused"] is False
    await admin.post(f"{base}/pause", {"paused": "true", "confirm": "yes"})
    assert (await api.get(f"/v1/companies/{name}", expect=200)).json()["paused"] is True
    confirm = (await admin.get(f"{base}/delete")).text
    assert "2 solutions" in confirm and "cannot be undone" in confirm
    await admin.post(f"{base}/delete", {"confirm": "yes"})
    await api.get(f"/v1/companies/{name}", expect=404)


async def test_an_api_key_is_shown_once_works_and_is_revoked_after_a_confirmation(
    world: UiWorld, company: Browser
) -> None:
    api, tenant = world.api, world.one
    keys = f"/ui/companies/{tenant.company}/api-keys"
    await company.get(keys)
    shown = await company.post(keys, {"name": "reader", "scope-read": "on"}, expect=201)
    secret = re.search(r'id="secret-value"[^>]*value="([^"]+)"', shown.text)
    assert secret, shown.text
    key = secret.group(1)
    assert (await api.get(tenant.path, token=key)).status_code == 200
    listing = (await company.get(keys)).text
    assert key not in listing and "reader" in listing  # never shown again
    # no scope ticked: the field is marked, the name kept
    none = await company.post(keys, {"name": "nothing"}, expect=422)
    assert marked(none.text) == {"scopes"} or "scopes" in none.text
    assert shown_value(none.text, "name") == "nothing"
    key_id = next(
        k["id"]
        for k in (await api.get(f"/v1/companies/{tenant.company}/api-keys")).json()["items"]
        if k["name"] == "reader"
    )
    confirm = (await company.get(f"{keys}/{key_id}/revoke")).text
    assert "stops working at once" in confirm
    await company.post(f"{keys}/{key_id}/revoke", {"confirm": "yes"})
    assert (await api.get(tenant.path, token=key)).status_code == 401


async def test_a_read_key_cannot_use_the_forms_and_a_company_key_not_the_operators(
    world: UiWorld, admin: Browser
) -> None:
    api, tenant = world.api, world.other
    key = (
        await api.post(
            f"/v1/companies/{tenant.company}/api-keys", {"name": "ro", "scopes": ["read"]}, expect=201
        )
    ).json()["key"]
    async with world.browser() as http:
        reader = Browser(http)
        await reader.sign_in(key)
        base = ui_path(tenant)
        await reader.get(base)
        for path in ("/new-activity", "/new-type", "/edit", "/rotate-secret", "/delete"):
            await reader.get(base + path, expect=403)
        await reader.post(f"{base}/new-activity", {"activity_type": tenant.activity_type}, expect=403)
        await reader.post(f"{base}/types/{tenant.activity_type}/edit", {"verb": "GET"}, expect=403)
        await reader.post(f"{base}/delete", {"confirm": "yes"}, expect=403)
        await reader.post(f"/ui/companies/{tenant.company}/api-keys", {"scope-read": "on"}, expect=403)
        await reader.get("/ui/new-company", expect=403)
        await reader.get(f"/ui/companies/{tenant.company}/edit", expect=403)
        await reader.post(f"/ui/companies/{tenant.company}/delete", {"confirm": "yes"}, expect=403)
    assert (await api.get(f"{tenant.types}/{tenant.activity_type}", expect=200)).json()["verb"] == "POST"
    await api.get(tenant.path, expect=200)
    async with world.browser() as http:  # a write key is not the operator: companies stay the admin's
        writer = Browser(http)
        await writer.sign_in(tenant.key)
        await writer.get("/ui/new-company", expect=403)
        await writer.get(f"/ui/companies/{tenant.company}/pause", expect=403)
        # another company's forms are not found, as its pages are not
        await writer.get(f"{ui_path(world.one)}/new-activity", expect=404)


async def test_a_one_off_activity_with_a_parameter_hint_and_its_errors(
    world: UiWorld, company: Browser
) -> None:
    api, tenant = world.api, world.one
    base = ui_path(tenant)
    page = (await company.get(f"{base}/new-activity?activity_type={tenant.activity_type}")).text
    assert "SongId" in page and "required" in page  # the hint from the type's schema and URI pattern
    form = {
        "activity_type": tenant.activity_type,
        "parameter": '{"Title": "no id"}',
        "scheduled_for": "",
        "delay": "PT2H",
        "priority": "9",
        "retries": "1",
    }
    refused = await company.post(f"{base}/new-activity", form, expect=422)
    assert marked(refused.text) == {"parameter"}
    assert "SongId" in refused.text and "parameter: parameter" not in refused.text
    assert all(shown_value(refused.text, k) == v for k, v in form.items()), refused.text
    both = await company.post(
        f"{base}/new-activity",
        {**form, "parameter": '{"SongId": 4}', "scheduled_for": "2030-01-01T00:00"},
        expect=422,
    )
    assert marked(both.text) == {"delay"}
    made = await company.post(f"{base}/new-activity", {**form, "parameter": '{"SongId": 4}'})
    activity_id = made.headers["location"].rsplit("/", 1)[1]
    stored = (await api.get(f"{tenant.activities}/{activity_id}", expect=200)).json()
    assert (stored["parameter"], stored["priority"], stored["retries"]) == ({"SongId": 4}, 9, 1)
    assert stored["state"] == "scheduled"
    assert stored_trace(world, "activity", activity_id) == (None, None)

    # the form's request carries a trace context (an instrumented browser, a proxy): the activity keeps it
    parent, state = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "rojo=00f067aa0ba902b7"
    company.http.headers.update({"traceparent": parent, "tracestate": state})
    try:
        traced = await company.post(f"{base}/new-activity", {**form, "parameter": '{"SongId": 5}'})
    finally:
        del company.http.headers["traceparent"], company.http.headers["tracestate"]
    assert stored_trace(world, "activity", traced.headers["location"].rsplit("/", 1)[1]) == (parent, state)


def stored_trace(world: UiWorld, table: str, row_id: str) -> tuple[str | None, str | None]:
    """The trace context a row keeps (``traceparent``, ``tracestate``), read with sqlite3."""
    path = world.api.database_url.removeprefix("sqlite://")
    with sqlite3.connect(path) as db:
        sql = f"SELECT traceparent, tracestate FROM {table} WHERE id IN (?, ?)"  # either form of a uuid
        found = db.execute(sql, (row_id, row_id.replace("-", ""))).fetchone()
    assert found is not None, f"no {table} {row_id}"
    return found[0], found[1]


async def test_the_schedule_editor_keeps_the_input_and_a_schedule_is_deleted_after_a_confirmation(
    world: UiWorld, company: Browser
) -> None:
    api, tenant = world.api, world.one
    base = ui_path(tenant)
    new = (await company.get(f"{base}/recurring/new")).text
    hint = html.unescape(new[new.index('id="f-parameter-hint"') :])
    assert shown_value(new, "parameter") == "" and '{"SongId":' in hint  # a hint, not an empty "{}"
    form = {
        "activity_type": tenant.activity_type,
        "cron": "15 4 * * 1-5",
        "timezone": "America/New_York",
        "parameter": '{"Nope": 1}',
        "priority": "7",
        "dst_nonexistent": "skip",
        "dst_ambiguous": "both",
    }
    refused = await company.post(f"{base}/recurring/new", form, expect=422)
    assert marked(refused.text) == {"parameter"}
    assert "parameter: parameter" not in refused.text and "SongId" in refused.text
    assert all(shown_value(refused.text, k) == v for k, v in form.items()), refused.text
    bad_zone = await company.post(
        f"{base}/recurring/new",
        {**form, "parameter": '{"SongId": 1}', "timezone": "Mars/Olympus"},
        expect=422,
    )
    assert marked(bad_zone.text) == {"timezone"} and shown_value(bad_zone.text, "cron") == "15 4 * * 1-5"
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"  # its occurrences: in this trace
    company.http.headers["traceparent"] = parent
    try:
        made = await company.post(f"{base}/recurring/new", {**form, "parameter": '{"SongId": 1}'})
    finally:
        del company.http.headers["traceparent"]
    recurring_id = made.headers["location"].rsplit("/", 1)[1]
    stored = (await api.get(f"{tenant.recurring}/{recurring_id}", expect=200)).json()
    assert stored["timezone"] == "America/New_York" and stored["dst_ambiguous"] == "both"
    assert stored_trace(world, "recurring_activity", recurring_id) == (parent, None)
    confirm = (await company.get(f"{base}/recurring/{recurring_id}/delete")).text
    assert "fires no more" in confirm
    await company.post(f"{base}/recurring/{recurring_id}/delete", {"confirm": "yes"})
    await api.get(f"{tenant.recurring}/{recurring_id}", expect=404)


async def test_rotating_shows_the_new_secret_once_to_its_company_and_never_to_the_operator(
    world: UiWorld, admin: Browser, company: Browser
) -> None:
    api, tenant = world.api, world.one
    base = ui_path(tenant)
    form = (await company.get(f"{base}/rotate-secret")).text
    assert "P1D" in form and "the default" in form
    shown = await company.post(f"{base}/rotate-secret", {"grace": "PT1H"}, expect=200)
    secret = re.search(r'id="secret-value"[^>]*value="(whsec_[^"]+)"', shown.text)
    assert secret, shown.text
    stored = (await api.get(tenant.path, token=tenant.key, expect=200)).json()
    assert stored["signing_secret"] == secret.group(1) and stored["previous_signing_secret_expires_at"]
    assert secret.group(1) not in (await company.get(base)).text
    bad = await company.post(f"{base}/rotate-secret", {"grace": "P90D"}, expect=422)
    assert marked(bad.text) == {"grace"}
    await admin.get(f"{base}/rotate-secret")
    by_operator = await admin.post(f"{base}/rotate-secret", {"grace": "PT0S"})
    assert by_operator.status_code == 303
    rotated = (await api.get(tenant.path, token=tenant.key, expect=200)).json()["signing_secret"]
    assert rotated != secret.group(1) and rotated not in (await admin.get(base)).text


async def test_deleting_a_type_and_a_solution_is_confirmed_first(world: UiWorld, admin: Browser) -> None:
    api = world.api
    tenant = await api.tenant()
    base = ui_path(tenant)
    confirm = (await admin.get(f"{base}/types/{tenant.activity_type}/delete")).text
    assert "cannot be undone" in confirm
    await admin.post(f"{base}/types/{tenant.activity_type}/delete", {}, expect=400)  # not confirmed
    await api.get(f"{tenant.types}/{tenant.activity_type}", expect=200)
    await admin.post(f"{base}/types/{tenant.activity_type}/delete", {"confirm": "yes"})
    await api.get(f"{tenant.types}/{tenant.activity_type}", expect=404)
    confirm = (await admin.get(f"{base}/delete")).text
    assert "0 activity types" in confirm
    await admin.post(f"{base}/delete", {"confirm": "yes"})
    await api.get(tenant.path, expect=404)


async def test_a_types_receiver_auth_is_write_only_in_the_form(world: UiWorld, admin: Browser) -> None:
    api, tenant = world.api, world.one
    base = ui_path(tenant)
    await admin.get(f"{base}/new-type")
    form = {
        "name": "authed",
        "verb": "POST",
        "uri_pattern": "https://receiver.example/a/{SongId}",
        "header_rows": "1",
        "auth/type": "bearer",
        "auth/token": "",
    }
    refused = await admin.post(f"{base}/new-type", form, expect=422)
    assert marked(refused.text) == {"auth/token"} and shown_value(refused.text, "auth/type") == "bearer"
    await admin.post(f"{base}/new-type", {**form, "auth/token": "tok-secret-1"})
    assert (await api.get(f"{tenant.types}/authed", expect=200)).json()["auth"] == {
        "type": "bearer",
        "token": {"secret": True},
    }
    edit = (await admin.get(f"{base}/types/authed/edit")).text
    assert "tok-secret-1" not in edit and shown_value(edit, "auth/type") == "bearer"
    await admin.post(f"{base}/types/authed/edit", {**form, "retries": "1"})  # token left empty: kept
    path = world.api.database_url.removeprefix("sqlite://")
    with sqlite3.connect(path) as db:
        (raw,) = db.execute(
            "SELECT t.auth FROM activity_type t JOIN solution s ON s.id = t.solution_id "
            "WHERE s.name = ? AND t.name = 'authed'",
            (tenant.solution,),
        ).fetchone()
    assert orjson.loads(raw)["token"] == "tok-secret-1"
    await admin.post(f"{base}/types/authed/edit", {**form, "auth/type": ""})  # none: removed
    assert (await api.get(f"{tenant.types}/authed", expect=200)).json()["auth"] is None


async def test_every_failing_field_of_a_type_form_is_marked_at_once(world: UiWorld, admin: Browser) -> None:
    """A bad URI, a timeout of "10s" and a parameter schema that is not JSON: one submit marks all three,
    each with its own reason (issue 39, O4)."""
    tenant = world.one
    base = ui_path(tenant)
    await admin.get(f"{base}/new-type")
    form = {
        "name": "three-faults",
        "verb": "POST",
        "uri_pattern": "ftp://receiver.example/song/{SongId}",
        "parameter_schema": '{"type": "object",',
        "timeout": "10s",
        "retries": "3",
        "header_rows": "1",
    }
    refused = await admin.post(f"{base}/new-type", form, expect=422)
    assert marked(refused.text) == {"uri_pattern", "parameter_schema", "timeout"}, marked(refused.text)
    assert "is not valid JSON" in refused.text and "ISO 8601" in refused.text and "https://" in refused.text


async def test_every_failing_field_of_an_activity_form_is_marked_at_once(
    world: UiWorld, company: Browser
) -> None:
    tenant = world.one
    base = ui_path(tenant)
    await company.get(f"{base}/new-activity")
    form = {
        "activity_type": tenant.activity_type,
        "parameter": '{"Title": "no id"}',
        "delay": "soon",
        "priority": "high",
        "retries": "1",
    }
    refused = await company.post(f"{base}/new-activity", form, expect=422)
    assert marked(refused.text) == {"parameter", "delay", "priority"}, marked(refused.text)


async def test_the_type_form_sets_what_the_receivers_answers_mean(world: UiWorld, admin: Browser) -> None:
    tenant, api = world.one, world.api
    base = ui_path(tenant)
    form = {
        "name": "steered",
        "verb": "POST",
        "uri_pattern": "https://receiver.example/song/{SongId}",
        "retries": "3",
        "timeout": "PT30S",
        "backoff_base": "PT1S",
        "backoff_max": "PT1H",
        "header_rows": "0",
        "retry_statuses": "5XX, 409",
        "fail_statuses": "503",
        "max_snoozes": "7",
        "max_lateness": "PT2H",
        "completion": "callback",
        "completion_timeout": "PT5M",
    }
    await admin.get(f"{base}/new-type")
    both = await admin.post(f"{base}/new-type", {**form, "fail_statuses": "409"}, expect=422)
    assert marked(both.text) == {"fail_statuses"} and shown_value(both.text, "fail_statuses") == "409"
    await admin.post(f"{base}/new-type", form)
    stored = (await api.get(f"{tenant.types}/steered", expect=200)).json()
    assert (stored["retry_statuses"], stored["fail_statuses"]) == (["5xx", 409], [503])
    assert (stored["max_snoozes"], stored["max_lateness"]) == (7, "PT2H")
    assert (stored["completion"], stored["completion_timeout"]) == ("callback", "PT5M")
    edit = (await admin.get(f"{base}/types/steered/edit")).text
    assert shown_value(edit, "retry_statuses") == "5xx, 409" and shown_value(edit, "max_lateness") == "PT2H"
    cleared = {**{k: v for k, v in form.items() if k != "name"}, "fail_statuses": "", "max_lateness": ""}
    await admin.post(f"{base}/types/steered/edit", cleared)
    stored = (await api.get(f"{tenant.types}/steered", expect=200)).json()
    assert stored["fail_statuses"] is None and stored["max_lateness"] is None and stored["max_snoozes"] == 7
