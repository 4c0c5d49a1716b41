"""The shipped JSON Schema as a test helper: every end-to-end test that produces snapshot JSON
passes it through :func:`assert_valid_snapshot`, so a field that goes missing, changes type or
appears without being added to the schema fails there."""

from __future__ import annotations

import functools
from typing import Any

from jsonschema import Draft202012Validator

from flowtop.monitor.snapshot_json import json_schema


@functools.lru_cache(maxsize=1)
def validator() -> Draft202012Validator:
    """A validator of flowtop/schema/snapshot.schema.json (itself checked against draft 2020-12)."""
    schema = json_schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def snapshot_errors(obj: Any) -> list[str]:
    """Every violation, as "path: message" (empty when ``obj`` is a valid snapshot)."""
    errors = sorted(validator().iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    return ["/".join(map(str, e.absolute_path)) + ": " + e.message for e in errors]


def assert_valid_snapshot(obj: Any) -> None:
    """Fail with the list of violations unless ``obj`` is a valid JSON snapshot."""
    errors = snapshot_errors(obj)
    assert not errors, "snapshot JSON does not match the schema:\n" + "\n".join(errors[:20])
