"""The OpenAPI schema says what the routes do: schemathesis with every check it has (the status
code, content type, headers and body of each answer against the schema; schema-valid requests
accepted and schema-invalid ones refused; a missing or wrong token refused; a 405's `Allow`),
over SQLite and PostgreSQL filled with a real ledger engine's events, as `test_fuzz` does.

What the schema cannot say, and so is allowed here, each documented in the route's `responses`:

- `REFUSED_BY_RULE`: the requests the schema allows that a route refuses by a rule across
  fields or over the store's state (a pin's prefix that floors to no boundary on an engine's
  hit grid, `since` after `until`);
- the release semantics of a pin: `DELETE /pins/{pin_id}` releases the pin and answers it,
  and the pin stays readable (`state: released`); schemathesis's stateful `use_after_free`
  check would call a 200 after the DELETE a use after free. The per-case checks below do not
  chain requests, so that check never fires here; the stateful phase is not run.

The direct tests at the end pin the two contract bugs the fuzz found first: `POST /benchmarks
{}` and a pin with an empty prefix were valid by the schema, yet refused with a 422.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import schemathesis
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.config import SchemathesisConfig

from api.main import create_app
from api.settings import Settings
from api.store.db import make_engine, make_sessionmaker
from engine.engine import Engine
from tests.api import factories
from tests.api.conftest import TOKEN

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
    # a setting `engine.whatif.settings` refuses, or one the engine's memory cannot hold
    "POST /api/v1/engines/{engine_id}/whatif": ["422"],
}


def contract_config() -> SchemathesisConfig:
    """Every check, the write token as the schema's bearer (schemathesis leaves it out itself
    where it tests the token's refusal), and `REFUSED_BY_RULE`."""
    return SchemathesisConfig.from_dict(
        {
            "auth": {"openapi": {"HTTPBearer": {"bearer": TOKEN}}},
            "operations": [
                {
                    "include-name": name,
                    "checks": {
                        "positive_data_acceptance": {"expected-statuses": ACCEPTED + statuses}
                    },
                }
                for name, statuses in REFUSED_BY_RULE.items()
            ],
        }
    )


@pytest.fixture
def contract_api(tmp_path: Path, database_url: str, engine_run: Engine):
    settings = Settings(
        _env_file=None,
        database_url=database_url,
        api_token=TOKEN,
        broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
        result_backend=f"db+sqlite:///{tmp_path / 'results.db'}",
    )
    db = make_engine(settings.database_url)
    with make_sessionmaker(db)() as session:
        factories.ingest(session, engine_run)
    db.dispose()
    app = create_app(settings)
    return schemathesis.openapi.from_asgi("/openapi.json", app, config=contract_config())


schema = schemathesis.pytest.from_fixture("contract_api")


@schema.parametrize()
@hypothesis_settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_answer_is_the_one_the_schema_promises(case) -> None:
    case.call_and_validate()


# ---------------------------------------------------------------------------- the schema itself
@pytest.fixture(scope="module")
def openapi() -> dict:
    settings = Settings(_env_file=None, database_url="sqlite:///:memory:", api_token=TOKEN)
    return create_app(settings).openapi()


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
