"""One `APIRouter` per resource, the ingest socket's (`ingest`) among them; `api.main` mounts
them. The top of `api/` but for the app itself: a route may use every part below it."""
