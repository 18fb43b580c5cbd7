"""The control plane's REST client (`client.rest`) against a real `junction api`: the standard
suite's presets, a run's 404, a refused spec named field by field, a wrong token, all in the
API's own words."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from api.runs.specs import standard_suite
from client.rest import ApiClient
from client.transport import ApiError
from tests.api.processes import TOKEN, ApiProcess, free_port


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiClient]:
    root: Path = tmp_path_factory.mktemp("rest-client")
    process = ApiProcess(f"sqlite:///{root / 'junction.db'}", free_port())
    process.start()
    try:
        yield ApiClient(process.url, TOKEN)
    finally:
        process.kill()


def test_the_benchmark_suite_is_the_standard_suite(api: ApiClient) -> None:
    suite = api.benchmark_suite()
    assert suite == standard_suite()
    assert len({spec["name"] for spec in suite}) == len(suite) > 1


def test_an_unknown_run_is_a_404_in_the_apis_words(api: ApiClient) -> None:
    with pytest.raises(ApiError) as caught:
        api.benchmark(999)
    assert (caught.value.status, caught.value.reason) == (404, "benchmark run 999 not found")
    assert str(caught.value) == "GET /benchmarks/999: HTTP 404: benchmark run 999 not found"


def test_a_bad_spec_is_refused_field_by_field(api: ApiClient) -> None:
    spec = {**standard_suite()[0], "modes": ["off", "warp"], "concurrency": 0}
    with pytest.raises(ApiError) as caught:
        api.create_benchmark(spec)
    assert caught.value.status == 422
    fields = [part.split(":")[0] for part in caught.value.reason.split("; ")]
    assert "modes[1]" in fields and "concurrency" in fields  # as the JSON writes it
    assert api.benchmarks().total == 0  # nothing queued


def test_a_wrong_token_is_a_401(api: ApiClient) -> None:
    with pytest.raises(ApiError) as caught:
        ApiClient(api.base_url, "not-the-apis").benchmark_suite()
    assert caught.value.status == 401 and caught.value.url.endswith("/api/v1/benchmarks/suite")
