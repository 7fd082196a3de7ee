"""The UI's schedule editor applies the API's checks to what it stores (the same code): a parameter
with NUL or nested past the API's limit is refused with a message, never stored, never a 500."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.api.conftest import Api, db_rows
from tests.integration.operations.test_one_path import Ui, ui_path


def nested(depth: int) -> str:
    return '{"SongId": 1, "x": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize(
    ("parameter", "reason"),
    [('{"SongId": 1, "x": "a\\u0000b"}', "NUL"), (nested(300), "nests deeper than 64")],
)
async def test_the_schedule_editor_refuses_what_the_api_refuses(
    api: Api, parameter: str, reason: str
) -> None:
    tenant = await api.tenant()
    schedule = '"schedule": {"cron": "0 3 * * *"}'
    sent = f'{{"activity_type": "{tenant.activity_type}", {schedule}, "parameter": {parameter}}}'
    answer = await api.call(
        "POST", tenant.recurring, content=sent.encode(), headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 422 and reason in answer.text, answer.text
    async with httpx.AsyncClient(base_url=str(api.http.base_url), timeout=30.0) as http:
        ui = Ui(http)
        await ui.sign_in(tenant.key)
        form = {
            "activity_type": tenant.activity_type,
            "cron": "0 3 * * *",
            "timezone": "UTC",
            "parameter": parameter,
            "back": "/ui/",
        }
        page = await http.post(f"{ui_path(tenant)}/recurring/new", data={**form, "csrf": ui.csrf})
        # The editor is shown again with the reason beside the field and what was entered kept.
        assert page.status_code == 422, page.text[:3000]
        assert reason in page.text and 'aria-invalid="true"' in page.text, page.text[:3000]
    assert await db_rows(api.database_url, "SELECT id FROM recurring_activity") == []
