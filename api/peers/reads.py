"""Reads of an engine's hash-keyed cache (`api.peers.blocks` writes it): its blocks paged, the
summary of its groups, churn, metrics and resyncs, its usage. These reads change nothing."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.peers.blocks import kind
from api.store.models import Engine, PeerBlock, PeerChurnBucket, PeerMetricSample, PeerResyncRecord
from api.store.paging import fetch_page
from engine.events import tier_of_medium

MAX_SERIES_ROWS = 10_000  # churn buckets and metric samples a summary lists (the newest)
MAX_RESYNCS = 1000
MAX_USAGE_SAMPLES = 1000  # the newest samples read for each rank's latest usage


def block_page(
    session: Session,
    engine_id: str,
    rank: int | None,
    group: str | None,
    medium: str | None,
    offset: int,
    limit: int,
) -> tuple[int, Sequence[PeerBlock]]:
    """(how many of the engine's blocks match, the `limit` of them after `offset`), ordered by
    rank, group, medium, then hash; `rank`, `group` and `medium` (None: any) filter them."""
    where = [PeerBlock.engine_id == engine_id]
    for column, value in ((PeerBlock.rank, rank), (PeerBlock.group, group)):
        if value is not None:
            where.append(column == value)
    if medium is not None:
        where.append(PeerBlock.medium == medium)
    order = (PeerBlock.rank, PeerBlock.group, PeerBlock.medium, PeerBlock.block_hash)
    return fetch_page(session, PeerBlock, where, order, offset, limit)


def block_counts(session: Session, engine_id: str) -> dict[tuple[int, str, str], int]:
    """The engine's blocks counted by (rank, group, medium)."""
    rows = session.execute(
        select(PeerBlock.rank, PeerBlock.group, PeerBlock.medium, func.count())
        .where(PeerBlock.engine_id == engine_id)
        .group_by(PeerBlock.rank, PeerBlock.group, PeerBlock.medium)
    ).all()
    return {(rank, group, medium): count for rank, group, medium, count in rows}


def group_counts(session: Session, engine_id: str) -> dict[str, int]:
    """The engine's blocks counted by group (every rank and medium)."""
    counts: dict[str, int] = defaultdict(int)
    for (_, group, _), count in block_counts(session, engine_id).items():
        counts[group] += count
    return dict(sorted(counts.items()))


def latest_usage(session: Session, engine_id: str) -> float | None:
    """The mean of each rank's latest reported cache usage (0..1), or None when none was."""
    rows = session.execute(
        select(PeerMetricSample.rank, PeerMetricSample.usage)
        .where(PeerMetricSample.engine_id == engine_id, PeerMetricSample.usage.is_not(None))
        .order_by(PeerMetricSample.ts.desc(), PeerMetricSample.id.desc())
        .limit(MAX_USAGE_SAMPLES)
    ).all()
    latest: dict[int, float] = {}
    for rank, usage in rows:
        latest.setdefault(rank, usage)
    return sum(latest.values()) / len(latest) if latest else None


def summary(session: Session, engine: Engine, since: float) -> dict:
    """The body of `api.schemas.PeerSummary` for the engine, its series from `since` on."""
    if not engine.geometry.is_peer:
        return {
            "kind": kind(engine),
            "groups": {},
            "tiers": {},
            "ranks": [],
            "churn": [],
            "metrics": [],
            "hit_rate": None,
            "resyncs": [],
        }
    groups, ranks = _layout(session, engine)
    metrics = _metric_samples(session, engine.engine_id, since)
    return {
        "kind": kind(engine),
        "groups": groups,
        "tiers": by_tier(groups),
        "ranks": ranks,
        "churn": _churn(session, engine.engine_id, since),
        "metrics": [
            {
                "ts": row.ts,
                "rank": row.rank,
                "queries_tokens": row.queries_tokens,
                "hits_tokens": row.hits_tokens,
                "usage": row.usage,
            }
            for row in metrics
        ],
        "hit_rate": hit_rate(metrics),
        "resyncs": _resyncs(session, engine.engine_id, since),
    }


def by_tier(groups: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Blocks by group then by the tier their medium names (`engine.events.tier_of_medium`:
    vLLM's "GPU" the device, "CPU" host memory, a storage medium the disk); a medium no tier
    word names keeps its own name."""
    tiers: dict[str, dict[str, int]] = {}
    for group, media in groups.items():
        into = tiers.setdefault(group, {})
        for medium, count in media.items():
            tier = tier_of_medium(medium) or medium
            into[tier] = into.get(tier, 0) + count
    return tiers


def _layout(session: Session, engine: Engine) -> tuple[dict[str, dict[str, int]], list[int]]:
    """(the engine's blocks counted by group then medium, its ranks: those its hello named and
    those holding blocks), each sorted."""
    groups: dict[str, dict[str, int]] = defaultdict(dict)
    ranks = set(engine.geometry.ranks or ())
    for (rank, group, medium), count in block_counts(session, engine.engine_id).items():
        groups[group][medium] = groups[group].get(medium, 0) + count
        ranks.add(rank)
    layout = {group: dict(sorted(media.items())) for group, media in sorted(groups.items())}
    return layout, sorted(ranks)


def _metric_samples(session: Session, engine_id: str, since: float) -> list[PeerMetricSample]:
    """The engine's newest metric samples from `since` on, oldest first."""
    return _newest(
        session,
        engine_id,
        PeerMetricSample,
        PeerMetricSample.ts >= since,
        (PeerMetricSample.ts, PeerMetricSample.id),
        MAX_SERIES_ROWS,
    )


def _churn(session: Session, engine_id: str, since: float) -> list[dict]:
    """The engine's newest churn buckets ending after `since`, oldest first."""
    buckets = _newest(
        session,
        engine_id,
        PeerChurnBucket,
        PeerChurnBucket.bucket_start + PeerChurnBucket.bucket_s > since,
        (
            PeerChurnBucket.bucket_start,
            PeerChurnBucket.rank,
            PeerChurnBucket.group,
            PeerChurnBucket.medium,
        ),
        MAX_SERIES_ROWS,
    )
    return [
        {
            "ts": float(row.bucket_start),
            "rank": row.rank,
            "group": row.group,
            "medium": row.medium,
            "stored": row.num_stored,
            "removed": row.num_removed,
        }
        for row in buckets
    ]


def _resyncs(session: Session, engine_id: str, since: float) -> list[dict]:
    """The engine's newest resyncs from `since` on, oldest first."""
    records = _newest(
        session,
        engine_id,
        PeerResyncRecord,
        PeerResyncRecord.ts >= since,
        (PeerResyncRecord.ts, PeerResyncRecord.id),
        MAX_RESYNCS,
    )
    return [
        {
            "ts": row.ts,
            "rank": row.rank,
            "first_missing_seq": row.first_missing_seq,
            "resumed_seq": row.resumed_seq,
            "reason": row.reason,
        }
        for row in records
    ]


def hit_rate(samples: Sequence[PeerMetricSample]) -> float | None:
    """Hits over queries that the samples' counters added (oldest first): each rank's last
    sample minus its first, summed over ranks; a counter that went down (the peer restarted)
    counts from zero again. None when they added no query."""
    last: dict[int, tuple[float, float]] = {}
    queries = hits = 0.0
    for sample in samples:
        now = (sample.queries_tokens, sample.hits_tokens)
        before = last.get(sample.rank)
        if before is not None:
            is_reset = now[0] < before[0] or now[1] < before[1]
            queries += now[0] if is_reset else now[0] - before[0]
            hits += now[1] if is_reset else now[1] - before[1]
        last[sample.rank] = now
    return hits / queries if queries > 0 else None


def _newest(session: Session, engine_id: str, model: type, since, order: tuple, limit: int) -> list:
    """The engine's newest `limit` rows of `model` matching `since`, oldest first."""
    stmt = (
        select(model)
        .where(model.engine_id == engine_id, since)
        .order_by(*(column.desc() for column in order))
        .limit(limit)
    )
    return list(reversed(session.scalars(stmt).all()))
