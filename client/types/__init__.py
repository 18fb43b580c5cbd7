"""What the control plane's and the router's REST answers are, as the client returns them: one
msgspec `Struct` per body, named as the API names its model (`api/schemas.py`'s `EngineOut` is
`client.types.EngineOut`), decoded from the answer's JSON by `client.rest` and `client.router`.
A reader reads fields (`engine.connected`), never a body's keys; `tests/client/
test_types_match_schemas.py` fails when a struct here and the API's model disagree on a field,
its type or whether it may be left out. `Body` is every struct's base: unknown fields of a
newer API are ignored."""

from client.types.base import Body
from client.types.blocks import BlockGrid, BlockOut, BlockPage, CellCounts, GridLink
from client.types.engines import EngineDetail, EngineOut, GroupUsage, ModelCard, ReplicaOut
from client.types.events import BatchOut, DeadLetterOut, DeadLetterPage, EventPage
from client.types.fleet import (
    Decision,
    DecisionPage,
    EngineLoad,
    EngineScore,
    FleetEngine,
    FleetView,
)
from client.types.peers import (
    PeerBlockOut,
    PeerBlockPage,
    PeerChurnOut,
    PeerJunctionOut,
    PeerJunctionPage,
    PeerMetricOut,
    PeerRemedyOut,
    PeerResyncOut,
    PeerSummary,
    PeerTreeOut,
    TreeNodeOut,
)
from client.types.pins import (
    JunctionOut,
    JunctionPage,
    JunctionPinRequest,
    PinDetail,
    PinOut,
    PinTargetOut,
)
from client.types.requests import (
    AttributionBucketOut,
    AttributionOut,
    AttributionTotals,
    HitRateBucketOut,
    HitRateOut,
    HitRateTotals,
    MatchStopOut,
    MissReason,
    RequestAttribution,
    RequestOut,
    RequestPage,
)
from client.types.runs import (
    BenchmarkResults,
    BenchmarkRunOut,
    BenchmarkRunPage,
    ModeResult,
    SettingOutcome,
    WhatIfReport,
    WhatIfRunOut,
    WhatIfRunPage,
)

__all__ = [
    "WhatIfReport",
    "SettingOutcome",
    "ModeResult",
    "BenchmarkResults",
    "EventPage",
    "DeadLetterPage",
    "DeadLetterOut",
    "BatchOut",
    "AttributionBucketOut",
    "AttributionOut",
    "AttributionTotals",
    "BenchmarkRunOut",
    "BenchmarkRunPage",
    "BlockGrid",
    "BlockOut",
    "BlockPage",
    "Body",
    "CellCounts",
    "Decision",
    "DecisionPage",
    "EngineDetail",
    "EngineLoad",
    "EngineOut",
    "EngineScore",
    "FleetEngine",
    "FleetView",
    "GridLink",
    "GroupUsage",
    "HitRateBucketOut",
    "HitRateOut",
    "HitRateTotals",
    "JunctionOut",
    "JunctionPage",
    "JunctionPinRequest",
    "MatchStopOut",
    "MissReason",
    "ModelCard",
    "PeerBlockOut",
    "PeerBlockPage",
    "PeerChurnOut",
    "PeerJunctionOut",
    "PeerJunctionPage",
    "PeerMetricOut",
    "PeerRemedyOut",
    "PeerResyncOut",
    "PeerSummary",
    "PeerTreeOut",
    "PinDetail",
    "PinOut",
    "PinTargetOut",
    "ReplicaOut",
    "RequestAttribution",
    "RequestOut",
    "RequestPage",
    "TreeNodeOut",
    "WhatIfRunOut",
    "WhatIfRunPage",
]
