"""The management UI: server-rendered Jinja2 pages under /ui, on the same Store the API uses.

``ui_app`` builds the Starlette app the server mounts at ``/ui``. Pages work without JavaScript (every
action is a form answered by a redirect); a small static script refreshes the dashboard and previews
schedules as they are typed.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from oste.errors import NotFound, OsteError
from oste.ui import (
    actions,
    auth,
    browse,
    bulk,
    calendar_forms,
    dashboard,
    destinations,
    editing,
    queues,
    schedules,
)
from oste.ui.context import Forbidden403, Refused, UiContext, render
from oste.ui.sessions import Sessions, cookie_key

__all__ = ["Sessions", "UiContext", "cookie_key", "mount", "ui_app"]

STATIC = Path(__file__).parent / "static"
COMPANY = "/companies/{company}"
SOLUTION = COMPANY + "/solutions/{solution}"
ACTIVITY = SOLUTION + "/activities/{id}"
RECURRING = SOLUTION + "/recurring/{id}"


def routes() -> list[Route | Mount]:
    post = ["POST"]
    return [
        Route("/", dashboard.dashboard),
        Route("/sign-in", auth.sign_in_form),
        Route("/sign-in", auth.sign_in, methods=post),
        Route("/sign-out", auth.sign_out, methods=post),
        Route("/schedule-preview", schedules.preview_fragment),
        Route("/companies", browse.companies),
        Route(COMPANY, browse.company),
        Route(COMPANY + "/settings", actions.company_settings, methods=post),
        Route(SOLUTION, browse.solution),
        Route(SOLUTION + "/settings", actions.solution_settings, methods=post),
        Route(SOLUTION + "/types/{type}/settings", actions.type_settings, methods=post),
        Route(SOLUTION + "/activities", browse.activities),
        Route(SOLUTION + "/bulk", bulk.bulk_confirm),
        Route(SOLUTION + "/bulk", bulk.bulk_apply, methods=post),
        Route(SOLUTION + "/requeue", bulk.requeue_confirm),
        Route(SOLUTION + "/requeue", bulk.requeue_apply, methods=post),
        Route(ACTIVITY, browse.activity),
        Route(ACTIVITY + "/requeue", actions.requeue_one, methods=post),
        Route(ACTIVITY + "/cancel", actions.cancel_one, methods=post),
        Route(ACTIVITY + "/priority", actions.activity_priority, methods=post),
        Route(ACTIVITY + "/run-now", actions.run_now_one, methods=post),
        Route(SOLUTION + "/recurring/new", schedules.new_form),
        Route(SOLUTION + "/recurring/new", schedules.create, methods=post),
        Route(RECURRING, browse.recurring),
        Route(RECURRING + "/edit", schedules.edit_form),
        Route(RECURRING + "/edit", schedules.update, methods=post),
        Route(RECURRING + "/pause", actions.recurring_pause, methods=post),
        Route(RECURRING + "/run-now", actions.recurring_run_now, methods=post),
        Route("/live", dashboard.live),
        Route(SOLUTION + "/types/{type}", queues.activity_type),  # after any /types/<word> page
        Route(SOLUTION + "/types/{type}/limits", queues.type_limits, methods=post),
        Route(COMPANY + "/calendars", calendar_forms.calendars),
        Route(COMPANY + "/calendars", calendar_forms.create, methods=post),
        Route(COMPANY + "/calendars/{calendar}", calendar_forms.edit_form),
        Route(COMPANY + "/calendars/{calendar}", calendar_forms.update, methods=post),
        Route(COMPANY + "/calendars/{calendar}/delete", calendar_forms.delete_confirm),
        Route(COMPANY + "/calendars/{calendar}/delete", calendar_forms.delete, methods=post),
        *editing.routes(),
        *(Route(path, endpoint, methods=methods) for path, endpoint, methods in destinations.routes()),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]


async def _not_found(request: Request, exc: Exception) -> Response:
    return await render(request, "error.html", 404, title="Not found", message=str(exc) or "Nothing is here.")


async def _forbidden(request: Request, exc: Exception) -> Response:
    return await render(request, "error.html", 403, title="Refused", message=str(exc))


async def _refused(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status", 400)
    return await render(request, "error.html", status, title="Cannot do that", message=str(exc))


async def _http(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    title = "Not found" if status == 404 else "Cannot do that"
    return await render(request, "error.html", status, title=title, message=str(getattr(exc, "detail", "")))


def ui_app(context: UiContext) -> Starlette:
    """The UI as an app of its own, to be mounted at ``/ui`` (its errors are pages, not problem+json)."""
    from starlette.exceptions import HTTPException

    app = Starlette(
        routes=routes(),
        exception_handlers={
            NotFound: _not_found,
            Forbidden403: _forbidden,
            Refused: _refused,
            OsteError: _refused,
            HTTPException: _http,
        },
    )
    app.state.ui = context
    return app


def mount(context: UiContext) -> list[Route | Mount]:
    """The routes the server adds beside the API's: ``/ui`` (redirecting to ``/ui/``) and the app."""

    async def to_slash(request: Request) -> Response:
        return RedirectResponse("/ui/", status_code=307)

    return [Route("/ui", to_slash), Mount("/ui", app=ui_app(context))]
