"""The model an engine runs, as its hello's free-form `model` reports it (`GET /engines/{id}`):
`junction serve` and `junction replay` send their model card (the name, the architecture, where
the weights come from: `engine/setup/model_card.py`); a bridged vLLM or SGLang engine sends a
name and its kind; an engine that sent nothing has nothing to show."""

from __future__ import annotations


def model_of(engine: dict | None) -> dict:
    """The hello's `model` of the engine's REST JSON; {} when it reported none."""
    model = (engine or {}).get("model")
    return model if isinstance(model, dict) else {}


def model_text(engine: dict | None) -> str:
    """One line: `model NAME · ARCHITECTURE · from SOURCE`, with what the hello gave."""
    model = model_of(engine)
    name = model.get("name")
    if not name:
        return "model: not reported by this engine's hello"
    parts = [f"model **{name}**"]
    if model.get("architecture"):
        parts.append(f"architecture `{model['architecture']}`")
    if model.get("source"):
        parts.append(f"from `{model['source']}`")
    return " · ".join(parts)


def engine_label(engine: dict) -> str:
    """An engine as the pickers list it: its id, its model's name, whether it is connected."""
    name = model_of(engine).get("name")
    return (
        engine["engine_id"]
        + (f" · {name}" if name else "")
        + ("" if engine.get("connected") else " (disconnected)")
    )
