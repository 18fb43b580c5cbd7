"""vLLM with its native CPU offloading beside Junction's host tier (`benchmarks/tiers.py`).

Per workload and concurrency the peer (`benchmarks/peer/vllm_replay.py`, vLLM 0.33's own
`Scheduler`) replays the same requests at the same concurrency three times: without offloading,
and with its `OffloadingConnector` (the CPU spec, LRU) at host 2x and 8x. Bytes as vLLM runs a
real hybrid (`pressure_cells.same_bytes_pages`): pages of `Bm` tokens, one page size for both
groups, as many as Junction's device pools hold in bytes; a page is `Bm` tokens of the model's
attention (its Mamba state, 434,688 bytes, fits one: the page is 524,288). vLLM's CPU tier gets
`cpu_bytes_to_use` equal to Junction's host tier (the multiple of Junction's device bytes) and
sizes itself as it does on a GPU: one chunk a group's block, a block id's bytes each (the peer
passes the page as the backing allocation's stride), so it holds `host bytes // page` chunks.

Transfers are instantaneous (`InstantTransfers` in the driver): every load and store the
connector schedules is reported done in the step's output, so vLLM's hits are those of an
offload tier that never makes a request wait. vLLM's hybrid offloading runs in its align Mamba
mode (the peer's only mode), where the connector stores each chunk's attention block and
the Mamba state at its end, and a load restores both.
"""

from __future__ import annotations

from typing import NamedTuple

from benchmarks.peer.client import PeerProcess, expanded_request
from benchmarks.pressure_cells import MAMBA_BLOCK_SIZE, UNIT, same_bytes_pages
from benchmarks.tiers_cells import Workload
from engine.config import ModelConfig
from engine.setup.footprint import footprint
from engine.traces.trace import TraceRequest

PEER_HOST_MULTIPLES = (2, 8)  # host sizes (disk off) the peer runs at, beside 0x


class PeerCell(NamedTuple):
    workload: str
    concurrency: int
    host_multiple: int  # 0: no offloading
    num_pages: int  # vLLM's device pool, pages of `Bm` tokens
    page_bytes: int
    cpu_bytes: int  # `cpu_bytes_to_use`: Junction's host tier bytes
    num_cpu_chunks: int  # what vLLM made of them (0 without offloading)
    oracle_tokens: int
    hit_tokens: int  # vLLM's
    junction_tokens: int  # Junction's cell with the same host size, disk off
    num_load_jobs: int
    num_chunks_loaded: int
    num_chunks_stored: int


def page_bytes(model: ModelConfig | None = None) -> int:
    """One page of `Bm` tokens of the model's attention keys and values."""
    return MAMBA_BLOCK_SIZE * footprint(model or ModelConfig()).attention_bytes_per_token


def run_peer_cells(
    peer: PeerProcess, workload: Workload, requests: list[TraceRequest]
) -> list[PeerCell]:
    """The peer without offloading and at each of `PEER_HOST_MULTIPLES`, on `workload`'s
    requests, concurrency and device bytes."""
    num_blocks, num_mamba_blocks = same_bytes_pages(workload.budget)
    page = page_bytes()
    expanded = [expanded_request(r) for r in requests]
    cells = []
    for host_multiple in (0, *PEER_HOST_MULTIPLES):
        junction = next(
            c for c in workload.cells if c.host_multiple == host_multiple and not c.is_disk
        )
        cpu_bytes = host_multiple * workload.device_bytes
        geometry = {
            "block_size": MAMBA_BLOCK_SIZE,
            "mamba_block_size": MAMBA_BLOCK_SIZE,
            "prefix_match_unit": UNIT,
            "num_blocks": num_blocks,
            "num_mamba_blocks": num_mamba_blocks,
            "cpu_bytes": cpu_bytes,
            "page_bytes": page,
        }
        answer = peer.replay_timed(expanded, geometry, workload.concurrency)
        offload = answer.get("offload", {})
        cells.append(
            PeerCell(
                workload.name,
                workload.concurrency,
                host_multiple,
                num_blocks + num_mamba_blocks,
                page,
                cpu_bytes,
                offload.get("num_cpu_chunks", 0),
                workload.oracle_tokens,
                sum(record["num_cached_tokens"] for record in answer["records"]),
                junction.hit_tokens,
                offload.get("num_load_jobs", 0),
                offload.get("num_chunks_loaded", 0),
                offload.get("num_chunks_stored", 0),
            )
        )
    return cells
