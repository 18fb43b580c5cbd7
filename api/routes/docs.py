"""`/docs` (Swagger UI) and `/redoc`, from assets served here, not from a CDN: the pages work
without internet access. The assets are `fastapi-offline`'s copies of swagger-ui's and
ReDoc's dist files; like the OpenAPI schema, the pages need no token."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs-assets"
ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"

router = APIRouter(include_in_schema=False)


def _asset(request: Request, name: str) -> str:
    return f"{request.scope.get('root_path', '')}{ASSETS_URL}/{name}"


@router.get("/docs")
def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI over the app's OpenAPI schema."""
    return get_swagger_ui_html(
        openapi_url=request.scope.get("root_path", "") + request.app.openapi_url,
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=_asset(request, "swagger-ui-bundle.js"),
        swagger_css_url=_asset(request, "swagger-ui.css"),
        swagger_favicon_url=_asset(request, "favicon.png"),
    )


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    """ReDoc over the app's OpenAPI schema."""
    return get_redoc_html(
        openapi_url=request.scope.get("root_path", "") + request.app.openapi_url,
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=_asset(request, "redoc.standalone.js"),
        redoc_favicon_url=_asset(request, "favicon.png"),
        with_google_fonts=False,
    )


def install_docs(app: FastAPI) -> None:
    """The two pages and their assets (build the app with `docs_url=None, redoc_url=None`)."""
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")
    app.include_router(router)
