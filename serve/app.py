"""`create_app`: the engine's OpenAI-compatible server around an `AsyncEngine`.

The app owns the engine loop's lifetime: it starts the loop when the server starts and shuts
it down when the server stops; then, with a disk tier, the engine's cache goes to disk for the
next start (`Engine.close`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from engine.feed import FeedHub
from engine.model.tokenizer import Tokenizer
from engine.setup.model_card import model_card
from protocol.body_limit import BodyLimit
from protocol.body_size import DEFAULT_MAX_BODY_BYTES, MAX_BODY_SETTING
from publish.publisher import EventPublisher
from serve.async_engine import AsyncEngine
from serve.deps import ServerState
from serve.diagnosis import DiagnosisOracle
from serve.errors import install_error_handlers
from serve.metrics import ServerMetrics
from serve.routes import chat, completions, messages, models, ops
from serve.routes import feed as feed_routes
from serve.send_timeout import DEFAULT_FEED_SEND_TIMEOUT_S, SendTimeout

logger = logging.getLogger("junction.serve")


def create_app(
    async_engine: AsyncEngine,
    model_name: str | None = None,
    publisher: EventPublisher | None = None,
    tokenizer: Tokenizer | None = None,
    card: dict | None = None,
    feed: FeedHub | None = None,
    feed_token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    feed_send_timeout_s: float = DEFAULT_FEED_SEND_TIMEOUT_S,
    diagnosis: DiagnosisOracle | None = None,
) -> FastAPI:
    """`model_name` is the name clients must send (default: the engine's model config);
    `publisher`, the engine's stream to a control plane, if any, shows in `/metrics`;
    `tokenizer` and `card` (`/v1/models`' details) default to the engine's model's; `feed`, the
    engine's cache feed (`engine.feed`), is served to routers holding `feed_token`; a request
    body over `max_body_bytes` is refused before it is held (`protocol.body_limit`); a feed
    reader that takes no data for `feed_send_timeout_s` is dropped (`serve.send_timeout`);
    `diagnosis`, the oracle following the engine's events (`serve.diagnosis`, attached to it),
    answers the requests that ask why they missed."""
    engine = async_engine.engine
    model_name = model_name or engine.model_config.name
    if tokenizer is None:
        from engine.model.hf.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(engine.model_config.model_dir)
    card = card or model_card(engine.model_config, engine.cache_config)
    metrics = ServerMetrics(
        num_in_flight=lambda: async_engine.num_in_flight,
        publisher_stats=publisher.stats if publisher is not None else None,
    )
    async_engine.add_finish_listener(metrics.observe_finished)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async_engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(async_engine.shutdown)
            if not async_engine.is_running:  # its loop is gone: nothing steps the engine now
                written = await asyncio.to_thread(engine.close)
                if written:
                    logger.info("wrote %d cache units to the disk tier for a restart", written)

    app = FastAPI(
        title="Junction engine",
        summary="OpenAI-compatible server of a hybrid attention + Mamba prefix-cache engine",
        lifespan=lifespan,
    )
    app.state.server = ServerState(
        async_engine,
        model_name,
        metrics,
        tokenizer,
        {**card, "name": model_name},
        feed=feed,
        feed_token=feed_token,
        diagnosis=diagnosis,
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, setting=MAX_BODY_SETTING)
    app.add_middleware(SendTimeout, timeout_s=feed_send_timeout_s)
    for module in (completions, chat, messages, models, ops, feed_routes):
        app.include_router(module.router)
    return app
