"""`/docs` and `/redoc` load their assets from the control plane itself, not from a CDN, and
need no token."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient


def _asset_urls(html: str) -> list[str]:
    return re.findall(r"""(?:src|href)=["']([^"']+)["']""", html) + re.findall(
        r"""url: ?["']([^"']+)["']""", html
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_use_only_local_assets(anonymous: TestClient, page: str) -> None:
    answer = anonymous.get(page)
    assert answer.status_code == 200
    html = answer.text
    assert "cdn" not in html.lower() and "http://" not in html and "https://" not in html
    urls = _asset_urls(html)
    assert any(url.endswith(".js") for url in urls), urls
    for url in urls:
        assert url.startswith("/"), f"{page} loads {url} from elsewhere"
        assert anonymous.get(url).status_code == 200, url
