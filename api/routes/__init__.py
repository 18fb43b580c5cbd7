"""One `APIRouter` per resource; `api.main` mounts them."""
