"""The routes of every create, edit and delete form (``forms.py`` holds what they share).

A form's GET shows it; its POST saves and redirects (POST-redirect-GET), or answers the form again
with what was typed kept and the failing fields marked. Deleting, revoking and pausing a company go
through a confirmation page that says what will happen (GET), whose button makes it happen (POST).
Paths use words a resource's name cannot clash with (``new-solution`` beside ``solutions/{name}``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.ui import activity_forms, company_forms, schedules, solution_forms, type_forms

COMPANY = "/companies/{company}"
SOLUTION = COMPANY + "/solutions/{solution}"
TYPE = SOLUTION + "/types/{type}"
RECURRING = SOLUTION + "/recurring/{id}"
KEY = COMPANY + "/api-keys/{key_id}"


Endpoint = Callable[[Request], Awaitable[Response]]


def _both(path: str, show: Endpoint, submit: Endpoint) -> list[Route]:
    return [Route(path, show), Route(path, submit, methods=["POST"])]


def routes() -> list[Route]:
    """Every form's GET and POST."""
    return [
        *_both("/new-company", company_forms.new_company, company_forms.create_company),
        *_both(COMPANY + "/edit", company_forms.edit_company, company_forms.update_company),
        *_both(COMPANY + "/pause", company_forms.pause_confirm, company_forms.pause),
        *_both(COMPANY + "/delete", company_forms.delete_confirm, company_forms.delete),
        *_both(COMPANY + "/api-keys", company_forms.api_keys, company_forms.create_api_key),
        *_both(KEY + "/revoke", company_forms.revoke_confirm, company_forms.revoke),
        *_both(COMPANY + "/new-solution", solution_forms.new_solution, solution_forms.create_solution),
        *_both(SOLUTION + "/edit", solution_forms.edit_solution, solution_forms.update_solution),
        *_both(SOLUTION + "/rotate-secret", solution_forms.rotate_form, solution_forms.rotate),
        *_both(SOLUTION + "/delete", solution_forms.delete_confirm, solution_forms.delete),
        *_both(SOLUTION + "/new-type", type_forms.new_type, type_forms.create_type),
        *_both(TYPE + "/edit", type_forms.edit_type, type_forms.update_type),
        *_both(TYPE + "/delete", type_forms.delete_confirm, type_forms.delete),
        *_both(SOLUTION + "/new-activity", activity_forms.new_activity_form, activity_forms.create),
        *_both(RECURRING + "/delete", schedules.delete_confirm, schedules.delete),
    ]
