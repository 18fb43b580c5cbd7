"""The model an engine runs, as its hello's free-form `model` reports it (`GET /engines/{id}`,
read as `client.types.ModelCard`): `junction serve` and `junction replay` send their model card
(the name, the architecture, where the weights come from: `engine/setup/model_card.py`); a bridged
vLLM or SGLang engine sends a name and its kind; an engine that sent nothing has nothing to
show."""

from __future__ import annotations

from client.types import EngineOut, ModelCard


def card_of(engine: EngineOut | None) -> ModelCard:
    """The engine's model card; an empty one for no engine."""
    return engine.card if engine is not None else ModelCard()


def model_text(engine: EngineOut | None) -> str:
    """One line: `model NAME · ARCHITECTURE · from SOURCE`, with what the hello gave."""
    card = card_of(engine)
    if not card.name:
        return "model: not reported by this engine's hello"
    parts = [f"model **{card.name}**"]
    if card.architecture:
        parts.append(f"architecture `{card.architecture}`")
    if card.source:
        parts.append(f"from `{card.source}`")
    return " · ".join(parts)


def engine_label(engine: EngineOut) -> str:
    """An engine as the pickers list it: its id, its model's name, whether it is connected."""
    name = engine.card.name
    return (
        engine.engine_id
        + (f" · {name}" if name else "")
        + ("" if engine.connected else " (disconnected)")
    )
