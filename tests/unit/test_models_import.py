"""Importing the models reads no source back: every ``oste`` command (and every process a test starts)
imports them, and Tortoise's search for ``#:`` field comments re-parses ``models.py`` once per model."""

from __future__ import annotations

import inspect
import re

from tortoise.models import Model

from oste.storage import models


def test_every_model_skips_tortoises_comment_search() -> None:
    classes = [
        value
        for value in vars(models).values()
        if inspect.isclass(value) and issubclass(value, Model) and value is not Model
    ]
    assert len(classes) >= 19
    missing = [cls.__name__ for cls in classes if cls.__dict__.get("_no_comments") is not True]
    assert not missing, f"set `_no_comments = True` in these models (see models.py's docstring): {missing}"


def test_no_model_relies_on_comment_descriptions() -> None:
    """``_no_comments`` is only harmless while no field is documented with a ``#:`` comment."""
    assert not re.search(r"^\s*#:", inspect.getsource(models), re.MULTILINE)
