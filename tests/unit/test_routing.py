"""The app's router (``oste.api.routing.SegmentRouter``) hands every request to the route Starlette's
router would: over the app's own 67 routes, for paths made from their templates (with segments that
hold slashes, are empty, or are missing) and any method, trying only the routes of the path's length
picks what trying them all picks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.routing import Route

from oste.api.routing import MAX_SLASHES, SegmentRouter, pick, slashes_matched
from oste.server import create_app
from oste.settings import Settings


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> SegmentRouter:
    data = tmp_path_factory.mktemp("routing")
    app = create_app(Settings(data_dir=data, database_url=f"sqlite://{Path(data) / 'oste.db'}"), "t" * 32)
    assert isinstance(app.router, SegmentRouter)
    return app.router


def _templates(router: SegmentRouter) -> list[str]:
    return sorted({getattr(r, "path", "/") for r in router.routes})


segment = st.one_of(
    st.sampled_from(["bench", "activities", "bulk", "new", "0190a3b2-0000-7000-8000-000000000000", "42"]),
    st.text(alphabet="ab/-_.%~", max_size=6),
)


@st.composite
def scopes(draw: st.DrawFn, templates: list[str]) -> dict[str, object]:
    template = draw(st.sampled_from(templates))
    path = re.sub(r"\{[^}]+\}", lambda _: draw(segment), template)
    path = draw(st.sampled_from([path, path + "/", path.rstrip("/"), path + "/" + draw(segment)]))
    method = draw(st.sampled_from(["GET", "HEAD", "POST", "PATCH", "PUT", "DELETE", "OPTIONS"]))
    return {"type": "http", "path": path or "/", "root_path": "", "method": method, "path_params": {}}


def test_the_app_has_the_router(router: SegmentRouter) -> None:
    lengths = {slashes_matched(r) for r in router.routes}
    assert None in lengths and len(lengths) > 4  # mounts beside routes of several lengths
    create = "/v1/companies/bench/solutions/bench/activities"
    assert len(router.candidates(create)) < len(router.routes) / 3


@settings(max_examples=3000, deadline=None)
@given(data=st.data())
def test_the_same_route_as_trying_them_all(router: SegmentRouter, data: st.DataObject) -> None:
    scope = data.draw(scopes(_templates(router)))
    expected = pick(router.routes, scope)
    found = pick(router.candidates(str(scope["path"])), scope)
    if expected is None:
        assert found is None
    else:
        assert found is not None and found[0] is expected[0] and found[1] == expected[1]


def test_a_path_of_any_length_is_tried_against_every_route(router: SegmentRouter) -> None:
    long_path = "/" + "/".join(["a"] * (MAX_SLASHES + 1))
    assert list(router.candidates(long_path)) == list(router.routes)
    assert len(router.candidates("/a")) < len(router.routes)


def test_a_route_added_later_is_tried(router: SegmentRouter) -> None:
    path = "/v1/companies/bench/solutions/bench/activities"
    before = len(router.candidates(path))
    extra = Route("/v1/companies/{company}/solutions/{solution}/later", lambda request: None)
    router.routes.append(extra)
    try:
        assert extra in router.candidates(path) and len(router.candidates(path)) == before + 1
    finally:
        router.routes.remove(extra)
