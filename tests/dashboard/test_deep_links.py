"""Item 16 of issue 47: a deep link (`/checkpoints`, `/peer_cache`) opened first on a fresh
dashboard renders under the app's own navigation, as `/` does. A folder named `pages/` beside
`app.py` made Streamlit run such a link as its old file-name multipage app: the page script
alone, without `app.py`'s wide layout or titled menu, until `/` was opened once."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.figures.remedies import CHECKPOINTS_PAGE
from dashboard.peers import PEER_PAGE

APP = Path(__file__).parents[2] / "dashboard" / "app.py"
TITLES = {"Overview", "Fleet", "Block tables", "Requests", "Checkpoints", "Peer cache"}


@pytest.mark.parametrize("page", [CHECKPOINTS_PAGE, PEER_PAGE])
def test_a_deep_link_first_runs_under_the_apps_navigation(
    page: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # nothing listens here: the page says so, which is all this test needs it to render
    monkeypatch.setenv("JUNCTION_CONTROL_PLANE_URL", "http://127.0.0.1:9")
    at = AppTest.from_file(APP, default_timeout=30)
    at.switch_page(page).run()  # the first run of the session is the deep link, not `/`
    assert not at.exception, [e.value for e in at.exception]
    names = {info.get("page_name") for info in at._registered_pages.values()}
    assert TITLES <= names, f"a deep link ran without app.py's navigation: the menu was {names}"
