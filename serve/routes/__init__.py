"""One `APIRouter` per resource: completions, chat, models, and the operational endpoints."""
