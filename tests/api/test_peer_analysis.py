"""The peer analysis on a hand-built forest whose branch points and Mamba states are known.

Attention blocks of 16 tokens, named by what they hold:
  a0..a34 (560 tokens: a system prompt), then three ways: b0..b4 (to 640), c0..c2 (to 608),
  d0..d9 (to 720), which parts again into e0 (736) and f0..f1 (752);
  g0..g9 (160 tokens), then h0 or i0 (176).
Mamba states (same hashes as the attention blocks, as in vLLM's hybrid models): at a32 (528)
and g9 (160). So 560 parts four prefixes with the nearest state 32 below, 720 parts two with
the nearest 192 below, and 160 parts two with a state right there.
"""

from __future__ import annotations

import zlib

import pytest

from api.peers.analysis import (
    end_positions,
    group_blocks,
    prefix_tree,
    state_marks,
    suggested_junctions,
)
from api.peers.remedies import peer_remedies, vllm_block_size
from engine.geometry import CacheGeometry, GroupShape


def all_tokens(name: str, size: int = 16) -> list[int]:
    return [(zlib.crc32(name.encode()) + i) % 50_000 for i in range(size)]


def tokens(name: str, size: int = 16) -> list[int]:
    """A block's token sample: its first 32 tokens."""
    return all_tokens(name, size)[:32]


def chain(prefix: str, count: int, parent: str | None, group: str = "attention") -> list[dict]:
    rows = []
    for i in range(count):
        name = f"{prefix}{i}"
        rows.append(block(name, parent, group))
        parent = name
    return rows


def block(name: str, parent: str | None, group: str = "attention", num_tokens: int = 16) -> dict:
    return {
        "rank": 0,
        "group": group,
        "group_idx": 0 if group == "attention" else 1,
        "medium": "GPU",
        "hash": name,
        "parent": parent,
        "num_tokens": num_tokens,
        "token_sample": tokens(name, num_tokens),
        "stored_at": 0.0,
    }


def forest() -> list[dict]:
    rows = chain("a", 35, None)
    rows += chain("b", 5, "a34") + chain("c", 3, "a34") + chain("d", 10, "a34")
    rows += chain("e", 1, "d9") + chain("f", 2, "d9")
    rows += chain("g", 10, None) + chain("h", 1, "g9") + chain("i", 1, "g9")
    rows += [block("a32", "a31", "mamba"), block("g9", "g8", "mamba")]
    return rows


def test_positions_follow_the_parent_chain_and_a_broken_chain_has_none():
    rows = forest() + [block("x1", "x0"), block("x2", "x1")]  # x0 was removed
    ends = end_positions(group_blocks(rows, "attention"))
    assert ends["a0"] == 16 and ends["a34"] == 560 and ends["d9"] == 720 and ends["f1"] == 752
    assert ends["i0"] == 176 and "x1" not in ends and "x2" not in ends
    assert prefix_tree(rows).num_unplaced == 2


def test_a_block_in_two_mediums_is_one_block():
    rows = forest() + [{**block("a0", None), "medium": "CPU"}]
    assert group_blocks(rows, "attention")["a0"].mediums == {"GPU", "CPU"}
    assert prefix_tree(rows).nodes[0].mediums == ("CPU", "GPU")


def test_the_radix_tree_compresses_chains_and_counts_the_prefixes_below():
    tree = prefix_tree(forest())
    spans = {(n.start, n.end): n for n in tree.nodes}
    assert (
        set(spans)
        == {
            (0, 560),
            (560, 640),
            (560, 608),
            (560, 720),
            (720, 736),
            (720, 752),
            (0, 160),
            (160, 176),
        }
        and len(tree.nodes) == 9
    )  # h0 and i0 both span (160, 176)
    root = spans[(0, 560)]
    assert root.parent_id is None and root.num_blocks == 35 and root.num_leaves == 4
    assert root.num_children == 3 and root.first_tokens == tuple(tokens("a0"))
    assert spans[(560, 720)].num_leaves == 2 and spans[(560, 720)].parent_id == root.node_id
    assert tree.num_leaves == 6 and tree.num_nodes == 9 and tree.num_hidden_nodes == 0
    assert tree.block_size == 16 and tree.num_blocks == 35 + 5 + 3 + 10 + 1 + 2 + 10 + 2


def test_the_attention_tree_marks_where_mamba_holds_a_state():
    tree = prefix_tree(forest())
    states = {(n.start, n.end): n.states for n in tree.nodes}
    assert states[(0, 560)] == (528,) and states[(0, 160)] == (160,)
    assert all(not s for span, s in states.items() if span not in {(0, 560), (0, 160)})
    assert all(m.is_exact for m in state_marks(forest()))
    mamba = prefix_tree(forest(), group="mamba")  # sparse: placed through the attention tree
    assert mamba.num_blocks == 2 and mamba.num_unplaced == 0 and mamba.num_leaves == 2
    assert sorted((n.start, n.end) for n in mamba.nodes) == [(144, 160), (512, 528)]
    assert all(not n.states for n in mamba.nodes)


def test_a_state_of_another_block_size_is_placed_by_position_and_first_tokens():
    """A 64-token Mamba block chain with hashes of its own: m1 ends at 128, where a7 and g7
    both end; its first tokens are those of the attention block starting at 64 on a's chain."""
    rows = forest()
    first = block("m0", None, "mamba", 64)
    second = {**block("m1", "m0", "mamba", 64), "token_sample": tokens("a4")}
    marks = state_marks([*rows, first, second])
    placed = [m for m in marks if m.hash == "m1"]
    assert placed == [placed[0]] and placed[0].position == 128
    assert placed[0].attention_hash == "a7" and not placed[0].is_exact
    assert not [m for m in marks if m.hash == "m0"]  # its first tokens match no block at 0


# the hello of an engine whose Mamba group has blocks of 528 tokens
STATE_BLOCKS_528 = CacheGeometry(groups={"mamba": GroupShape(block_size=528)})


def test_suggested_junctions_are_the_branch_points_without_a_state_near_below():
    found = suggested_junctions(forest(), STATE_BLOCKS_528)
    assert [(j.position, j.num_branches, j.num_prefixes) for j in found] == [
        (720, 2, 2),
        (560, 3, 4),
    ]
    deep, system = found
    assert (deep.nearest_state, deep.tokens_saved) == (528, 192)
    assert (system.nearest_state, system.tokens_saved) == (528, 32)
    assert system.hash == "a34" and system.first_tokens == tuple(tokens("a34"))
    assert 160 not in [j.position for j in found]  # a state right at it
    # a state just below counts as at it: 560 - 528 < 40
    assert [j.position for j in suggested_junctions(forest(), near_tokens=40)] == [720]


def test_each_suggestion_says_what_would_keep_a_state_there():
    (_, system) = suggested_junctions(forest(), STATE_BLOCKS_528)
    by_flags = {r.flags: r for r in system.remedies}
    junction = by_flags["junction serve --model MODEL"]
    assert (junction.state_at, junction.tokens_saved) == (560, 32)
    block_size = by_flags["vllm serve MODEL --block-size 560"]  # 560 divides 560
    assert (block_size.state_at, block_size.tokens_saved) == (560, 32)
    assert "528" in block_size.text and "exactly" in block_size.text
    shared = next(r for r in system.remedies if "shared-prefix-checkpoint" in r.flags)
    assert shared.state_at == 560 and "EAGLE" in shared.text


def test_an_sglang_engine_gets_junctions_remedy_only():
    found = suggested_junctions(forest(), kind="sglang")
    assert {r.engine for j in found for r in j.remedies} == {"junction"}


def test_remedies_that_save_nothing_are_left_out():
    """A 300-token junction on 64-token blocks: vLLM's grid floors it to 256 at best below
    4 x 64 (a 96 block: 288), Junction keeps 288 (300 floored to U = 16)."""
    remedies = peer_remedies(300, 0, "vllm", 16, 64, None)
    assert [(r.flags, r.state_at) for r in remedies] == [
        ("junction serve --model MODEL", 288),
        ("vllm serve MODEL --block-size 96", 288),
        ("vllm serve MODEL --prefix-match-unit 16 --enable-mamba-shared-prefix-checkpoint", 288),
    ]
    assert peer_remedies(300, 288, "vllm", 16, 64, None) == ()  # nothing closer than 288
    (as_now,) = [r for r in peer_remedies(128, 0, "vllm", 64, 64, None) if "as now" in r.flags]
    assert as_now.state_at == 128 and "none is held now" in as_now.text


@pytest.mark.parametrize(
    ("position", "current", "size"),
    [
        (560, 528, 560),  # a divisor of the junction, just above the current block
        (57_600, 4_416, 4_800),  # the seed's 57,600-token system prompt: 12 blocks of 4,800
        (300, 64, 96),  # no multiple of 16 divides 300: 288 is the closest boundary below
        (560, 2_096, 560),  # below the current block: the largest divisor, with a caveat
        (1_000, 2_096, 992),  # no multiple of 16 divides 1,000: one block to 992
    ],
)
def test_the_vllm_block_size_for_a_junction(position, current, size):
    assert vllm_block_size(position, current) == size


def test_a_big_tree_is_bounded_with_the_rest_summarised():
    rows = chain("s", 4, None)
    for i in range(50):  # 50 branches of 1 to 3 blocks under the shared 64 tokens
        rows += chain(f"t{i}_", 1 + i % 3, "s3")
    tree = prefix_tree(rows, max_nodes=10)
    assert tree.num_nodes == 51 and len(tree.nodes) == 10 and tree.num_hidden_nodes == 41
    shown = {n.node_id for n in tree.nodes}
    assert all(n.parent_id is None or n.parent_id in shown for n in tree.nodes)
    (root,) = [n for n in tree.nodes if n.parent_id is None]
    assert root.num_leaves == 50 and root.num_hidden_children == 41
    assert tree.num_leaves == 50 and tree.num_hidden_leaves == 41
    (junction,) = suggested_junctions(rows)
    assert (junction.position, junction.num_branches, junction.num_prefixes) == (64, 50, 50)


def test_a_long_chain_needs_no_recursion():
    rows = chain("z", 20_000, None)
    tree = prefix_tree(rows)
    assert [(n.start, n.end, n.num_blocks) for n in tree.nodes] == [(0, 320_000, 20_000)]


def test_no_blocks_no_tree():
    tree = prefix_tree([])
    assert tree.nodes == [] and tree.num_leaves == 0 and tree.block_size is None
    assert suggested_junctions([]) == []


# ---------------------------------------------------------------------------- through REST
GEOMETRY = {
    "kind": "vllm",
    "physical_block_ids": False,
    "ranks": [0],
    "groups": {"attention": {"block_size": 16}, "mamba": {"block_size": 528}},
}


def hex_hash(name: str | None) -> str | None:
    return None if name is None else name.encode().hex()


def peer_frames(engine_id: str, rows: list[dict], epoch: int = 1, ts: float = 1e9) -> list[dict]:
    """A vLLM engine's hello and a batch of one `PeerBlockStored` per row (hashes as hex),
    as `junction attach vllm` would send them."""
    events = [
        {
            "type": "PeerBlockStored",
            "rank": row["rank"],
            "group_idx": row["group_idx"],
            "group": row["group"],
            "medium": row["medium"],
            "block_hashes": [hex_hash(row["hash"])],
            "parent_block_hash": hex_hash(row["parent"]),
            "block_size": row["num_tokens"],
            "token_ids": all_tokens(row["hash"], row["num_tokens"]),
        }
        for row in rows
    ]
    hello = {"type": "hello", "engine_id": engine_id, "epoch": epoch, "geometry": GEOMETRY}
    batch = {"type": "batch", "engine_id": engine_id, "epoch": epoch, "seq": 0, "ts": ts}
    return [hello | {"model": {"name": "Qwen/Qwen3.5-35B-A3B"}}, batch | {"events": events}]


def test_the_routes_serve_the_analysis_of_the_stored_blocks(client, session):
    from api.ingest.frames import apply_batch, apply_hello
    from tests.api.factories import parse

    hello, batch = (parse(frame) for frame in peer_frames("vllm-0", forest()))
    apply_hello(session, hello)
    apply_batch(session, hello, batch)
    tree = client.get("/api/v1/engines/vllm-0/peer-tree", params={"max_nodes": 4}).json()
    assert tree["kind"] == "vllm" and tree["num_read"] == tree["num_stored"] == 70
    assert (tree["num_nodes"], len(tree["nodes"]), tree["num_leaves"]) == (9, 4, 6)
    root = next(n for n in tree["nodes"] if n["end"] == 560)
    assert root["states"] == [528] and root["first_hash"] == hex_hash("a0")
    mamba = client.get("/api/v1/engines/vllm-0/peer-tree", params={"group": "mamba"}).json()
    assert sorted((n["start"], n["end"]) for n in mamba["nodes"]) == [(144, 160), (512, 528)]
    page = client.get("/api/v1/engines/vllm-0/suggested-junctions").json()
    assert [(j["position"], j["tokens_saved"]) for j in page["junctions"]] == [
        (720, 192),
        (560, 32),
    ]
    flags = [r["flags"] for r in page["junctions"][1]["remedies"]]
    assert "vllm serve MODEL --block-size 560" in flags
    for path in ("peer-tree", "suggested-junctions"):
        assert client.get(f"/api/v1/engines/nobody/{path}").status_code == 404
        assert (
            client.get(f"/api/v1/engines/vllm-0/{path}", headers={"Authorization": ""}).status_code
            == 401
        )
