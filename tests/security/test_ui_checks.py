"""The UI's forms apply the API's checks to what they store (the same code): a parameter with NUL,
nested past the API's limit or larger than ``OSTE_MAX_PARAMETER_BYTES`` is refused with a message,
never stored, never a 500."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest

from oste.settings import Settings
from tests.integration.api.conftest import Api, api_client, db_rows
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


async def test_the_ui_forms_hold_parameters_to_the_servers_size_setting(
    database_url: str, tmp_path: Path
) -> None:
    """``OSTE_MAX_PARAMETER_BYTES`` binds the UI's create and schedule forms as it binds the API: a
    parameter over it is refused beside the field, naming the setting, and nothing is stored."""
    settings = Settings(data_dir=tmp_path, database_url=database_url, max_parameter_bytes=1024)
    async with api_client(settings) as api:
        tenant = await api.tenant()
        parameter = {"SongId": 1, "x": "a" * 1500}  # over 1,024 bytes, far under the 1 MiB default
        refused = await api.post(tenant.activities, tenant.activity(1, parameter=parameter), token=tenant.key)
        assert refused.status_code == 422 and "OSTE_MAX_PARAMETER_BYTES" in refused.text, refused.text
        async with httpx.AsyncClient(base_url=str(api.http.base_url), timeout=30.0) as http:
            ui = Ui(http)
            await ui.sign_in(tenant.key)
            text = orjson.dumps(parameter).decode()
            forms = {
                "new-activity": {"activity_type": tenant.activity_type, "parameter": text, "delay": "PT1H"},
                "recurring/new": {
                    "activity_type": tenant.activity_type,
                    "cron": "0 3 * * *",
                    "timezone": "UTC",
                    "parameter": text,
                },
            }
            for path, form in forms.items():
                page = await http.post(
                    f"{ui_path(tenant)}/{path}", data={**form, "back": "/ui/", "csrf": ui.csrf}
                )
                assert page.status_code == 422, (path, page.status_code, page.text[:3000])
                assert "OSTE_MAX_PARAMETER_BYTES" in page.text and 'aria-invalid="true"' in page.text, path
            small = {**forms["new-activity"], "parameter": '{"SongId": 1}', "back": "/ui/", "csrf": ui.csrf}
            made = await http.post(f"{ui_path(tenant)}/new-activity", data=small)
            assert made.status_code == 303, made.text[:3000]  # under the cap, the same form stores
        assert len(await db_rows(api.database_url, "SELECT id FROM activity")) == 1
        assert await db_rows(api.database_url, "SELECT id FROM recurring_activity") == []
