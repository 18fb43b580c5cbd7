"""The OpenAPI schema says what the routes do: schemathesis with every check it has (the status
code, content type, headers and body of each answer against the schema; schema-valid requests
accepted and schema-invalid ones refused; a missing or wrong token refused; a 405's `Allow`),
over SQLite and PostgreSQL filled with a real ledger engine's events, as `test_fuzz` does.

What the schema cannot say, and so is allowed here, each documented in the route's `responses`:

- `REFUSED_BY_RULE`: the requests the schema allows that a route refuses by a rule across
  fields or over the store's state (a pin's prefix that floors to no boundary on an engine's
  hit grid, `since` after `until`);
- the release semantics of a pin (`RELEASED_PIN_STAYS`): `DELETE /pins/{pin_id}` releases
  the pin and answers it, and the pin stays readable (`state: released`, docs/api.md), so the
  stateful `use_after_free` check, which wants a 404 after a DELETE, is off for
  `GET /pins/{pin_id}`.

The operations are fuzzed one by one, then chained as the schema's inferred links say (a pin
made, read, released; an engine listed, read, deleted), the stateful checks on.

The direct tests at the end pin what the fuzz found, each case on its own: `POST /benchmarks
{}` and a pin with an empty prefix were valid by the schema, yet refused with a 422; so was a
string parameter holding a NUL; a spec's `false` for an integer was accepted though the
schema refuses it; a 405 named one method of a path that takes two.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.config import SchemathesisConfig

from api.main import create_app
from api.settings import Settings
from engine.engine import Engine
from tests.api import factories
from tests.api.conftest import AUTH, TOKEN

#: What positive data may be answered everywhere (schemathesis's default): a success, a
#: refusal of the token, a resource not found, a conflict with the store's state, too busy.
ACCEPTED = ["2xx", "401", "403", "404", "409", "429"]
#: Operation -> the statuses it answers schema-valid requests with, by a rule the schema cannot
#: express (each documented in the operation's `responses`).
REFUSED_BY_RULE = {
    # `epoch` needs `engine_id`
    "GET /api/v1/events": ["400"],
    # `since` after `until`
    "GET /api/v1/engines/{engine_id}/hit-rate": ["400"],
    "GET /api/v1/engines/{engine_id}/attribution": ["400"],
    # a prefix that floors to no boundary on an engine's hit grid, longer than its
    # max_model_len, or over 2^20 tokens once counted (UTF-8 bytes, segments' lengths)
    "POST /api/v1/pins": ["422"],
    # a workload whose longest request does not fit the spec's geometry
    "POST /api/v1/benchmarks": ["422"],
    # a setting `whatif.settings` refuses, or one the engine's memory cannot hold
    "POST /api/v1/engines/{engine_id}/whatif": ["422"],
}


#: A released pin is still read (200, `state: released`), not gone (404).
RELEASED_PIN_STAYS = {
    "include-name": "GET /api/v1/pins/{pin_id}",
    "checks": {"use_after_free": {"enabled": False}},
}


def contract_config() -> SchemathesisConfig:
    """Every check, the write token as the schema's bearer (schemathesis leaves it out itself
    where it tests the token's refusal), `REFUSED_BY_RULE` and `RELEASED_PIN_STAYS`."""
    refused = [
        {
            "include-name": name,
            "checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED + statuses}},
        }
        for name, statuses in REFUSED_BY_RULE.items()
    ]
    return SchemathesisConfig.from_dict(
        {
            "auth": {"openapi": {"HTTPBearer": {"bearer": TOKEN}}},
            "operations": [*refused, RELEASED_PIN_STAYS],
        }
    )


@pytest.fixture
def contract_api(tmp_path: Path, database_url: str, engine_run: Engine):
    app = factories.filled_app(tmp_path, database_url, engine_run, TOKEN)
    return schemathesis.openapi.from_asgi("/openapi.json", app, config=contract_config())


schema = schemathesis.pytest.from_fixture("contract_api")


@schema.parametrize()
@hypothesis_settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_answer_is_the_one_the_schema_promises(case) -> None:
    case.call_and_validate()


def test_chained_operations_keep_the_contract(contract_api) -> None:
    """Sequences of calls along the inferred links (what one answer gives the next request),
    each answer checked with every check, the stateful ones included."""
    contract_api.as_state_machine().run(
        settings=hypothesis_settings(
            max_examples=25,
            stateful_step_count=6,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            # fixed draws: replaying a failing sequence, schemathesis's link-fed strategies can
            # draw another type than the first time (hypothesis's FlakyStrategyDefinition, in
            # about half of the random runs), which says nothing about the app
            derandomize=True,
        )
    )


# ---------------------------------------------------------------------------- the schema itself
@pytest.fixture(scope="module")
def bare_app() -> FastAPI:
    """The app, its lifespan never run: what these tests ask needs no store."""
    return create_app(Settings(_env_file=None, database_url="sqlite:///:memory:", api_token=TOKEN))


@pytest.fixture(scope="module")
def openapi(bare_app: FastAPI) -> dict:
    return bare_app.openapi()


def body_schema(openapi: dict, path: str) -> dict:
    return openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


def is_valid(instance: object, schema: dict) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(instance)


def test_a_benchmark_body_without_name_or_workload_is_invalid_by_the_schema(openapi) -> None:
    spec = body_schema(openapi, "/api/v1/benchmarks")
    assert not is_valid({}, spec)
    assert not is_valid({"name": "x"}, spec)
    assert is_valid({"name": "x", "workload": {"kind": "generated_shared_prefix"}}, spec)


@pytest.mark.parametrize(
    "prefix",
    [{"text": ""}, {"token_ids": []}, {"segments": []}, {}, {"text": None}],
    ids=["empty text", "no token ids", "no segments", "no form", "a null form"],
)
def test_an_empty_prefix_is_invalid_by_the_schema(openapi, prefix: dict) -> None:
    assert not is_valid({"prefix": prefix, "label": "x"}, body_schema(openapi, "/api/v1/pins"))


def test_a_prefix_of_one_form_is_valid_by_the_schema(openapi) -> None:
    pins = body_schema(openapi, "/api/v1/pins")
    assert is_valid({"prefix": {"text": "a"}, "label": "x"}, pins)
    assert is_valid({"prefix": {"token_ids": [1], "text": None}, "label": "x"}, pins)
    assert not is_valid({"prefix": {"token_ids": [1], "text": "a"}, "label": "x"}, pins)


def test_every_free_string_parameter_declares_it_holds_no_nul(openapi) -> None:
    """The app refuses a NUL in any parameter (422): the schema says so, or a schema-valid
    request is refused."""
    free = {
        f"{method} {path} {parameter['name']}": parameter["schema"]
        for path, operations in openapi["paths"].items()
        for method, operation in operations.items()
        for parameter in operation.get("parameters", [])
    }
    assert "get /api/v1/pins/{pin_id} pin_id" in free
    for name, schema in free.items():
        for branch in [schema, *schema.get("anyOf", [])]:
            if branch.get("type") == "string" and "enum" not in branch:
                assert not is_valid("a\x00b", branch), name
                assert is_valid("ab", branch) or branch.get("minLength", 0) > 2, name


@pytest.mark.parametrize(
    "path, allow",
    [
        ("/api/v1/pins", "GET, POST"),
        ("/api/v1/pins/pin-1", "DELETE, GET"),
        ("/api/v1/engines/engine-test", "DELETE, GET"),
        ("/api/v1/engines/engine-test/whatif", "GET, POST"),
        ("/api/v1/benchmarks/suite", "GET"),
        ("/healthz", "GET"),
    ],
)
def test_a_405_names_every_method_of_its_path(bare_app: FastAPI, path: str, allow: str) -> None:
    response = TestClient(bare_app).request("OPTIONS", path, headers=AUTH)
    assert response.status_code == 405
    assert response.headers["allow"] == allow


@pytest.mark.parametrize(
    "field, value",
    [("concurrency", "8"), ("model", {"seed": False})],
)
def test_a_spec_value_of_another_json_type_than_the_schemas_is_refused(
    client: TestClient, field: str, value: object
) -> None:
    """The spec is read strictly, as its schema says: pydantic's lax mode took `false` for an
    integer seed (a schema-invalid body, accepted)."""
    spec = {"name": "x", "workload": {"kind": "generated_shared_prefix"}, field: value}
    response = client.post("/api/v1/benchmarks", json=spec)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][:2] == ["body", field]
