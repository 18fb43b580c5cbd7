"""A cached prefix tree (`GET .../peer-tree`) laid out along the token axis: a row per node,
each in a lane (a row of the figure), so that a prefix and its first extension read as one
line and each further branch opens a lane below."""

from __future__ import annotations

import pandas as pd

from client.types import PeerTreeOut, TreeNodeOut

TREE_COLUMNS = [
    "node_id",
    "parent_id",
    "start",
    "end",
    "lane",
    "num_blocks",
    "num_leaves",
    "num_hidden_children",
    "states",
    "mediums",
    "first_tokens",
]


def tree_frame(tree: PeerTreeOut) -> pd.DataFrame:
    """One row per node, laid out as a tree along the token axis: a node's `lane` (its row)
    is its first child's, so a prefix and its longest-listed extension read as one line, and
    each further child opens a lane below."""
    nodes = sorted(tree.nodes, key=lambda n: n.node_id)
    kids: dict[int | None, list[TreeNodeOut]] = {}
    for node in nodes:
        kids.setdefault(node.parent_id, []).append(node)
    lanes: dict[int, int] = {}
    next_lane = 0
    stack = [(node, None) for node in reversed(kids.get(None, []))]
    while stack:  # depth first; a first child inherits its parent's lane
        node, lane = stack.pop()
        if lane is None:
            lane, next_lane = next_lane, next_lane + 1
        lanes[node.node_id] = lane
        children = kids.get(node.node_id, [])
        stack += [(child, None) for child in reversed(children[1:])]
        if children:
            stack.append((children[0], lane))
    rows = [
        {**{c: getattr(node, c, None) for c in TREE_COLUMNS}, "lane": lanes[node.node_id]}
        for node in nodes
    ]
    return pd.DataFrame(rows, columns=TREE_COLUMNS)
