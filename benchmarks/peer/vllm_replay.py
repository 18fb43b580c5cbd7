"""vLLM 0.33 as a peer: its real scheduler-side prefix cache driven on expanded traces.

Runs with `.venv-peer/bin/python` (`make peer`), never with Junction's `.venv`: it imports vLLM
and must not import Junction. Nothing of vLLM is copied here; this file only builds vLLM's own
objects and calls them:

- a hybrid `KVCacheConfig` with two groups, full attention (`FullAttentionSpec`, block `Ba`) and
  Mamba (`MambaSpec`, block `Bm`, cache mode "align"), in one `BlockPool` of
  `num_blocks + num_mamba_blocks` blocks (vLLM shares one pool between groups; Junction gives
  each group its own, so the sum is the closest match);
- the hash and hit units from vLLM's `resolve_kv_cache_block_sizes` (scheduler block
  `S = lcm(Ba, Bm)`, match unit `U`), so a geometry vLLM refuses is refused here too;
- vLLM's v1 `Scheduler` (`schedule()` / `update_from_output()`), so prefix lookup, admission,
  chunking and the Mamba block-aligned split are vLLM's. The model runner is faked: a
  `ModelRunnerOutput` that samples one token id for every request whose prefill completed.

Where the peer has to choose (vLLM would take these from a model checkpoint):
- `cache_config.block_size` is `Bm`: vLLM's align mode sets it to the Mamba block size (it
  makes `Ba == Bm` in real models), and `_mamba_block_aligned_split` reads it as that.
- `--eagle` is EAGLE with the legacy trailing-unit drop (`disable_lookahead_block_hashes`), the
  rule docs/rules.md describes; the attention group is the EAGLE group, one speculative token.
- `--no-partial-hits` passes `allow_partial_hash_hits=False` to vLLM's
  `HybridKVCacheCoordinator` (vLLM has the switch but no config option for it): hits then land
  on `S` boundaries.
- `prefix_cache_retention_interval` is vLLM's default (0: only semantic Mamba checkpoints);
  `--retention-interval dense` keeps every one.
- `--cpu-bytes N` turns on vLLM's native CPU offloading as `--kv-transfer-config` would
  (`KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
  kv_connector_extra_config={"cpu_bytes_to_use": N, "eviction_policy": "lru"})`), built by the
  Scheduler itself. It needs `--page-bytes` (one block id's bytes over every layer: the KV cache
  config gets one backing allocation of that stride, from which vLLM sizes a CPU chunk, so the
  CPU tier holds `N // page` chunks, one group's block each). There is no worker:
  `InstantTransfers` reports every load and store job of the step's connector metadata done in
  the step's own output (`KVConnectorOutput`: the jobs in `OffloadingWorkerMetadata`, an async
  load's request in `finished_recving`), as vLLM's `OffloadingConnectorWorker` reports them
  when its copies end, so transfers take no time. Hybrids offload in vLLM's align Mamba mode
  (the peer's only mode): each chunk's attention block and the state at its end.

Usage:
    .venv-peer/bin/python benchmarks/peer/vllm_replay.py replay TRACE.jsonl [options] [--out F]
    .venv-peer/bin/python benchmarks/peer/vllm_replay.py serve

A trace line: `{"id": str, "prompt_token_ids": [int, ...], "max_tokens": int}` (optional
`"cache_salt"`). An output line: `id`, `num_prompt_tokens`, `num_cached_tokens` (vLLM's hit at
first admission), `hit_tokens_by_group` (`{"attention": hit, "mamba": hit}`: vLLM's hybrid
hit is one length), `num_computed_tokens` (prompt tokens prefilled), `chunks` ([[start, end],
...] prefill chunks), `num_preemptions`.

Serve protocol: one JSON command a line on stdin, one JSON answer a line on stdout (logs go
to stderr). A geometry is an object with any of `block_size`, `mamba_block_size`,
`prefix_match_unit`, `eagle`, `partial_hits`, `max_num_batched_tokens`,
`long_prefill_threshold`, `num_blocks`, `num_mamba_blocks`, `retention_interval`, `cpu_bytes`,
`page_bytes` (the options' names; defaults as the options). Times are `time.perf_counter_ns`
differences.

    {"cmd": "ping"}
        -> {"ok": true, "vllm": "0.33.0"}
    {"cmd": "hash", "prompts": [[int, ...], ...], "unit": 16}
        -> {"ok": true, "ns": [int, ...], "num_hashes": [int, ...]}
        vLLM's request block hasher (sha256, chained every `unit` tokens) on each prompt.
    {"cmd": "lookup", "geometry": {...}, "warm_prompts": [[int, ...], ...],
     "prompts": [[int, ...], ...]}
        -> {"ok": true, "ns": [int, ...], "hit_tokens": [int, ...]}
        A fresh scheduler runs the warm prompts one at a time (max_tokens 1), so their blocks
        and Mamba states are cached; then one `KVCacheManager.get_computed_blocks` per prompt
        is timed (the prompt's hashing is not). Lookups do not change the cache.
    {"cmd": "replay", "geometry": {...}, "requests": [{"id", "prompt_token_ids",
     "max_tokens"}, ...], "concurrency": 1}
        -> {"ok": true, "records": [...], "wall_s": float, "num_steps": int}
        A fresh scheduler replays the requests; `wall_s` times only the scheduling loop. With
        `cpu_bytes` the answer also has `"offload"`: `connector`, `manager`, `num_cpu_chunks`
        (the CPU tier's size as vLLM computed it), `num_load_jobs`, `num_chunks_loaded`,
        `num_store_jobs`, `num_chunks_stored` (what the instant worker reported done).
    {"cmd": "manager_replay", ...the same fields as replay}
        -> the same answer
        The minimal loop (`ManagerReplay`): a fresh `KVCacheManager`, no `Scheduler`. Each
        step allocates the running requests' next chunks (`allocate_slots`), then admits
        waiting requests in order (`get_computed_blocks` + `allocate_slots`) within the token
        budget and `max_num_seqs`; every chunk is cut by vLLM's own
        `Scheduler._mamba_block_aligned_split`, called on the fields it reads. The faked model
        samples one token per request whose prefill completed; `check_stop` ends a request at
        `max_tokens` and `KVCacheManager.free` frees it. Blocks are cached inside
        `allocate_slots`, as in vLLM's step. Request hashing is included (vLLM's `Request`
        with its block hasher). No preemption, no EAGLE, no long-prefill threshold: it is the
        KV-cache manager's cost, without the scheduler's bookkeeping or output processing. On
        a pool that holds the batch its hits and chunks equal `replay`'s at concurrency 1
        (checked on vs_vllm.py's replay-loop workload).
    {"cmd": "quit"}
        -> {"ok": true}, then the process exits.
    A command that fails answers {"ok": false, "error": "..."} and the server goes on.

Exit codes of the command line: 0 done, 2 bad input (a geometry vLLM refuses names the option).
"""

from __future__ import annotations

import os

# Before vLLM is imported: no accelerator here, and vLLM's INFO logs would drown the output.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import deque  # noqa: E402
from collections.abc import Iterable, Iterator  # noqa: E402
from dataclasses import dataclass, field, fields, replace  # noqa: E402

EXIT_BAD_INPUT = 2

DEFAULT_MAX_MODEL_LEN = 1 << 17


class GeometryError(ValueError):
    """A geometry vLLM (or this driver) refuses; the message names the option."""


@dataclass(frozen=True)
class Geometry:
    """The cache and scheduler options `junction replay` shares with this peer."""

    block_size: int = 16
    mamba_block_size: int = 512
    prefix_match_unit: int | None = None
    eagle: bool = False
    partial_hits: bool = True
    max_num_batched_tokens: int = 8192
    long_prefill_threshold: int = 0
    num_blocks: int = 4096
    num_mamba_blocks: int | None = None
    retention_interval: int | None = 0  # vLLM's default; None keeps every checkpoint
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    cpu_bytes: int = 0  # vLLM's native CPU offloading with this many bytes; 0: off
    page_bytes: int | None = None  # one block id's bytes over every layer (sizes CPU chunks)

    def __post_init__(self) -> None:
        for name in ("block_size", "mamba_block_size", "max_num_batched_tokens", "num_blocks"):
            if getattr(self, name) <= 0:
                raise GeometryError(
                    f"--{_option(name)} must be positive, got {getattr(self, name)}"
                )
        if self.prefix_match_unit is not None and self.prefix_match_unit <= 0:
            raise GeometryError(
                f"--prefix-match-unit must be positive, got {self.prefix_match_unit}"
            )
        if self.num_mamba_blocks is not None and self.num_mamba_blocks <= 0:
            raise GeometryError(f"--num-mamba-blocks must be positive, got {self.num_mamba_blocks}")
        if self.long_prefill_threshold < 0:
            raise GeometryError(
                f"--long-prefill-threshold must be >= 0, got {self.long_prefill_threshold}"
            )
        if self.cpu_bytes < 0:
            raise GeometryError(f"--cpu-bytes must be >= 0, got {self.cpu_bytes}")
        if self.cpu_bytes and not self.page_bytes:
            raise GeometryError("--cpu-bytes needs --page-bytes (the bytes of one block id)")
        if self.page_bytes is not None and self.page_bytes <= 0:
            raise GeometryError(f"--page-bytes must be positive, got {self.page_bytes}")

    @classmethod
    def from_dict(cls, data: dict) -> Geometry:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise GeometryError(f"unknown geometry field(s): {', '.join(unknown)}")
        if data.get("retention_interval") == "dense":
            data = {**data, "retention_interval": None}
        return cls(**data)

    @property
    def match_unit(self) -> int:
        if self.prefix_match_unit is None:
            return math.gcd(self.block_size, self.mamba_block_size)
        return self.prefix_match_unit

    @property
    def num_pool_blocks(self) -> int:
        """vLLM's one shared pool: both groups' blocks (plus its null block)."""
        mamba = self.num_mamba_blocks if self.num_mamba_blocks is not None else self.num_blocks
        return self.num_blocks + mamba + 1


def _option(name: str) -> str:
    return name.replace("_", "-")


# ---------------------------------------------------------------------------------------------
# Building vLLM's scheduler without a model


class _ModelStub:
    """The few `ModelConfig` fields the scheduler reads (a real one needs a HF checkpoint)."""

    uses_mrope = False
    is_encoder_decoder = False
    runner_type = "generate"
    is_diffusion = False
    supports_multimodal_inputs = False
    return_sampling_mask = False
    skip_tokenizer_init = True
    multimodal_config = None
    is_submodel_config = False
    # what the OffloadingConnector reads (`build_offloading_config`)
    use_mla = False
    model = "junction-peer"
    dtype = "float32"

    def get_total_num_kv_heads(self) -> int:
        return 1

    def __init__(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len


class _EagleStub:
    """An EAGLE `SpeculativeConfig` as far as the scheduler reads it: one draft token, the
    trailing-unit drop on (lookahead block hashes off)."""

    method = "eagle"
    num_speculative_tokens = 1
    num_speculative_tokens_per_batch_size = None
    disable_eagle_block_drop = False
    disable_lookahead_block_hashes = True
    draft_model_config = None
    max_num_new_slots_for_drafting = 0  # EAGLE drafts in the decode slot it already has

    def use_eagle(self) -> bool:
        return True

    def needs_eagle_block_drop(self) -> bool:
        return True

    def use_eagle_block_drop(self) -> bool:
        return True

    def use_dflash(self) -> bool:
        return False

    def use_dspark(self) -> bool:
        return False

    def uses_draft_model(self) -> bool:
        return False

    def use_multi_module_mtp(self) -> bool:
        return False


@dataclass
class Peer:
    """One vLLM scheduler and the hasher its requests use."""

    geometry: Geometry
    scheduler: object
    block_hasher: object
    hash_block_size: int
    scheduler_block_size: int


def build_peer(geometry: Geometry) -> Peer:
    """A fresh vLLM `Scheduler` over an empty cache. Raises `GeometryError` if vLLM refuses."""
    cache_config, vllm_config = _vllm_config(geometry)
    kv_cache_config = _kv_cache_config(geometry)
    cache_config.num_gpu_blocks = geometry.num_pool_blocks
    scheduler_block_size, hash_block_size = _resolve_block_sizes(
        kv_cache_config, vllm_config, geometry
    )
    scheduler = _scheduler(
        vllm_config, kv_cache_config, scheduler_block_size, hash_block_size, geometry
    )
    hasher = _request_hasher(cache_config, vllm_config, hash_block_size)
    return Peer(geometry, scheduler, hasher, hash_block_size, scheduler_block_size)


def _vllm_config(g: Geometry):
    """vLLM's cache and scheduler configs for `g` and the `VllmConfig` over them, the model and
    speculative configs stubbed; returns (cache config, vLLM config)."""
    from vllm.config import CacheConfig, KVTransferConfig, SchedulerConfig, VllmConfig

    try:
        cache_config = CacheConfig(
            block_size=g.mamba_block_size,
            mamba_block_size=g.mamba_block_size,
            prefix_match_unit=g.prefix_match_unit,
            enable_prefix_caching=True,
            mamba_cache_mode="align",
            prefix_cache_retention_interval=g.retention_interval,
        )
        scheduler_config = SchedulerConfig(
            max_num_batched_tokens=g.max_num_batched_tokens,
            long_prefill_token_threshold=g.long_prefill_threshold,
            max_num_seqs=min(256, g.max_num_batched_tokens),
            enable_chunked_prefill=True,
            max_model_len=g.max_model_len,
            is_encoder_decoder=False,
        )
        kv_transfer_config = None
        if g.cpu_bytes:
            # as `--kv-transfer-config` passes it: the native CPU tier, LRU, `cpu_bytes`
            kv_transfer_config = KVTransferConfig(
                kv_connector="OffloadingConnector",
                kv_role="kv_both",
                kv_connector_extra_config={
                    "cpu_bytes_to_use": g.cpu_bytes,
                    "eviction_policy": "lru",
                },
            )
        vllm_config = VllmConfig(
            cache_config=cache_config,
            scheduler_config=scheduler_config,
            kv_transfer_config=kv_transfer_config,
        )
    except Exception as exc:  # pydantic's ValidationError names vLLM's field
        raise GeometryError(f"vLLM refuses the configuration: {exc}") from exc
    # VllmConfig validates assignments; the stubs stand where a checkpoint's configs would.
    object.__setattr__(vllm_config, "model_config", _ModelStub(g.max_model_len))
    object.__setattr__(vllm_config, "speculative_config", _EagleStub() if g.eagle else None)
    return cache_config, vllm_config


def _kv_cache_config(g: Geometry):
    """Two groups in one pool: full attention (block `Ba`, the EAGLE group with `--eagle`) and
    Mamba (block `Bm`, align mode). With `page_bytes`, one backing allocation of that many
    bytes a block id, which is all the offloading connector reads of it: it sizes a CPU chunk
    (one group's block) at one block id's bytes."""
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
        MambaSpec,
    )

    attention = FullAttentionSpec(
        block_size=g.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    mamba = MambaSpec(
        block_size=g.mamba_block_size,
        shapes=((1,),),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
    )
    tensors = []
    if g.page_bytes:
        tensors.append(
            KVCacheTensor(
                size=g.page_bytes * g.num_pool_blocks,
                layers=["attention.0", "mamba.0"],
                layer_stride=0,  # the groups overlay each other, as vLLM's hybrids do
                block_stride=g.page_bytes,
            )
        )
    return KVCacheConfig(
        num_blocks=g.num_pool_blocks,
        kv_cache_tensors=tensors,
        kv_cache_groups=[
            KVCacheGroupSpec(["attention.0"], attention, is_eagle_group=g.eagle),
            KVCacheGroupSpec(["mamba.0"], mamba),
        ],
        prefix_cache_retention_interval=g.retention_interval,
    )


def _resolve_block_sizes(kv_cache_config, vllm_config, g: Geometry) -> tuple[int, int]:
    """vLLM's scheduler block `S` and hash block `U`, set on `kv_cache_config` with the hit
    alignment; returns (S, U)."""
    from vllm.v1.core.kv_cache_utils import (
        resolve_cache_hit_alignment_tokens,
        resolve_kv_cache_block_sizes,
    )

    try:
        scheduler_block_size, hash_block_size = resolve_kv_cache_block_sizes(
            kv_cache_config, vllm_config
        )
        kv_cache_config.hash_block_size = hash_block_size
        kv_cache_config.cache_hit_alignment_tokens = resolve_cache_hit_alignment_tokens(
            kv_cache_config, vllm_config, scheduler_block_size, hash_block_size
        )
    except ValueError as exc:
        raise GeometryError(_name_options(str(exc), g)) from exc
    return scheduler_block_size, hash_block_size


def _scheduler(vllm_config, kv_cache_config, scheduler_block_size, hash_block_size, g: Geometry):
    """vLLM's v1 `Scheduler`, its coordinator built with `g.partial_hits`."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    with _partial_hits(g):
        return Scheduler(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=scheduler_block_size,
            hash_block_size=hash_block_size,
        )


@contextlib.contextmanager
def _partial_hits(g: Geometry) -> Iterator[None]:
    """While it is open, `KVCacheManager` builds its coordinator with `g.partial_hits`; a
    refusal from vLLM becomes a `GeometryError` naming the options."""
    from vllm.v1.core import kv_cache_manager as kv_cache_manager_module
    from vllm.v1.core.kv_cache_coordinator import get_kv_cache_coordinator

    # `KVCacheManager` builds its coordinator through this module-level name; binding
    # vLLM's own switch is how partial hits are turned off (no config option reaches it).
    factory = functools.partial(get_kv_cache_coordinator, allow_partial_hash_hits=g.partial_hits)
    saved = kv_cache_manager_module.get_kv_cache_coordinator
    kv_cache_manager_module.get_kv_cache_coordinator = factory
    try:
        yield
    except (ValueError, AssertionError) as exc:
        raise GeometryError(_name_options(str(exc) or type(exc).__name__, g)) from exc
    finally:
        kv_cache_manager_module.get_kv_cache_coordinator = saved


def _request_hasher(cache_config, vllm_config, hash_block_size: int):
    """vLLM's request block hasher: its configured hash, chained every `hash_block_size`."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    hash_fn = get_hash_fn_by_name(cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return get_request_block_hasher(hash_block_size, hash_fn, vllm_config.num_hash_lookahead_tokens)


def _name_options(message: str, g: Geometry) -> str:
    return (
        f"vLLM refuses --block-size {g.block_size} --mamba-block-size {g.mamba_block_size} "
        f"--prefix-match-unit {g.match_unit}: {message}"
    )


def make_request(
    peer: Peer,
    request_id: str,
    token_ids: list[int],
    max_tokens: int = 1,
    cache_salt: str | None = None,
    hashed: bool = True,
):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(token_ids),
        sampling_params=params,
        pooling_params=None,
        cache_salt=cache_salt,
        block_hasher=peer.block_hasher if hashed else None,
    )


# ---------------------------------------------------------------------------------------------
# The replay loop


def _sampled_token(request) -> int:
    """The fake model's next token: a function of the request's tokens only."""
    return (request.all_token_ids[-1] * 31 + request.num_tokens) % 256


@dataclass
class _Track:
    """What the peer records about one request while it runs."""

    request: object
    num_cached_tokens: int | None = None  # set at first admission
    chunks: list[list[int]] = field(default_factory=list)


@dataclass
class OffloadCounts:
    """What the instant worker reported done for vLLM's `OffloadingConnector`."""

    num_load_jobs: int = 0
    num_chunks_loaded: int = 0  # CPU chunks (one group's block each) read back
    num_store_jobs: int = 0
    num_chunks_stored: int = 0  # CPU chunks written


class InstantTransfers:
    """The worker side of vLLM's `OffloadingConnector`, at the metadata level, with every
    transfer taken as instantaneous: each load and store job that `schedule()` put in the
    step's `OffloadingConnectorMetadata` is reported done in that step's output, as
    `OffloadingConnectorWorker` reports a finished job (`completed_jobs` in its worker
    metadata, one count a worker; an async load's request in `finished_recving`), so the
    scheduler sees it before its next `schedule()`."""

    def __init__(self) -> None:
        self.counts = OffloadCounts()

    def output(self, scheduler_output):
        """The step's `KVConnectorOutput`, or None when no connector ran."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingConnectorMetadata,
            OffloadingWorkerMetadata,
        )
        from vllm.v1.outputs import KVConnectorOutput

        meta = scheduler_output.kv_connector_metadata
        if not isinstance(meta, OffloadingConnectorMetadata):
            return None
        done = OffloadingWorkerMetadata()
        finished_recving: set[str] = set()
        for job_id, job in meta.load_jobs.items():
            done.mark_completed(job_id)
            self.counts.num_load_jobs += 1
            self.counts.num_chunks_loaded += len(job.src_spec.block_ids)
            if not job.sync:  # a sync load's request already runs this step
                finished_recving.add(job.req_id)
        for job_id, job in meta.store_jobs.items():
            done.mark_completed(job_id)
            self.counts.num_store_jobs += 1
            self.counts.num_chunks_stored += len(job.dst_spec.block_ids)
        if not done.completed_jobs:
            return None
        return KVConnectorOutput(
            finished_recving=finished_recving or None,
            kv_connector_worker_meta=done,
        )


class Replay:
    """Requests through one scheduler, at most `concurrency` in flight, added in trace order
    as others finish (the arrival rule of Junction's `engine/traces/replay.py`)."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.num_steps = 0
        self._idle_steps = 0
        self.transfers = InstantTransfers()

    def run(self, requests: Iterable[dict], concurrency: int = 1) -> list[dict]:
        if concurrency < 1:
            raise GeometryError(f"--concurrency must be >= 1, got {concurrency}")
        tracks: list[_Track] = []
        in_flight: dict[str, _Track] = {}
        for item in requests:
            while len(in_flight) > concurrency - 1:
                self._step(in_flight)
            request = make_request(
                self.peer,
                item["id"],
                item["prompt_token_ids"],
                item.get("max_tokens", 1),
                item.get("cache_salt"),
            )
            track = _Track(request)
            tracks.append(track)
            in_flight[request.request_id] = track
            self._add(request)
        while in_flight:
            self._step(in_flight)
        return [_record(t) for t in tracks]

    def _add(self, request) -> None:
        self.peer.scheduler.add_request(request)

    def _step(self, in_flight: dict[str, _Track]) -> None:
        from vllm.v1.outputs import ModelRunnerOutput

        scheduler = self.peer.scheduler
        output = scheduler.schedule()
        self.num_steps += 1
        for new in output.scheduled_new_reqs:
            track = in_flight.get(new.req_id)
            if track is not None and track.num_cached_tokens is None:
                track.num_cached_tokens = new.num_computed_tokens
        req_ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for req_id in req_ids:
            request = scheduler.requests[req_id]
            num_new = output.num_scheduled_tokens[req_id]
            # `schedule()` has already advanced num_computed_tokens past this chunk
            end = request.num_computed_tokens
            start = end - num_new
            track = in_flight.get(req_id)
            if track is not None and start < request.num_prompt_tokens:
                track.chunks.append([start, min(end, request.num_prompt_tokens)])
            sampled.append([_sampled_token(request)] if end >= request.num_tokens else [])
        runner_output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=self.transfers.output(output),
        )
        scheduler.update_from_output(output, runner_output)
        finished = [r for r, t in in_flight.items() if t.request.is_finished()]
        for req_id in finished:
            del in_flight[req_id]
        progressed = output.total_num_scheduled_tokens > 0 or bool(finished)
        self._check_progress(progressed or runner_output.kv_connector_output is not None, in_flight)

    def _check_progress(self, progressed: bool, in_flight: dict[str, _Track]) -> None:
        if progressed:
            self._idle_steps = 0
            return
        self._idle_steps += 1
        if self._idle_steps > 3:
            raise RuntimeError(
                f"vLLM made no progress with {len(in_flight)} request(s) in flight "
                f"(pool of {self.peer.geometry.num_pool_blocks} blocks too small?)"
            )


# ---------------------------------------------------------------------------------------------
# The minimal loop: vLLM's KVCacheManager without its Scheduler


@dataclass
class ManagerPeer:
    """vLLM's `KVCacheManager` alone, the request hasher, and what vLLM's chunk split reads."""

    geometry: Geometry
    manager: object
    block_hasher: object
    split_fields: object  # the fields `Scheduler._mamba_block_aligned_split` reads


def build_manager_peer(geometry: Geometry) -> ManagerPeer:
    """A fresh `KVCacheManager` over an empty cache, built with the arguments vLLM's
    `Scheduler` passes it. Raises `GeometryError` if vLLM refuses, or for options the minimal
    loop does not model (EAGLE's draft slots, the long-prefill threshold)."""
    from types import SimpleNamespace

    from vllm.v1.core.kv_cache_manager import KVCacheManager

    if geometry.eagle or geometry.long_prefill_threshold or geometry.cpu_bytes:
        raise GeometryError(
            "the minimal loop models neither --eagle, --long-prefill-threshold nor "
            "--cpu-bytes: use the scheduler loop (cmd replay)"
        )
    cache_config, vllm_config = _vllm_config(geometry)
    kv_cache_config = _kv_cache_config(geometry)
    cache_config.num_gpu_blocks = geometry.num_pool_blocks
    scheduler_block_size, hash_block_size = _resolve_block_sizes(
        kv_cache_config, vllm_config, geometry
    )
    with _partial_hits(geometry):
        manager = KVCacheManager(
            kv_cache_config=kv_cache_config,
            max_model_len=geometry.max_model_len,
            max_in_flight_tokens=vllm_config.max_in_flight_tokens,
            enable_caching=True,
            scheduler_block_size=scheduler_block_size,
            hash_block_size=hash_block_size,
            watermark=vllm_config.scheduler_config.watermark,
            enable_mamba_shared_prefix_checkpoint=cache_config.enable_mamba_shared_prefix_checkpoint,
        )
    mamba = kv_cache_config.kv_cache_groups[1].kv_cache_spec
    partial = hash_block_size < geometry.mamba_block_size
    partial = partial and manager.coordinator.enable_partial_hash_hits
    split_fields = SimpleNamespace(
        cache_config=cache_config,
        scheduler_config=vllm_config.scheduler_config,
        block_size=scheduler_block_size,
        hash_block_size=hash_block_size,
        max_num_scheduled_tokens=geometry.max_num_batched_tokens,
        mamba_partial_cache_hit=partial,
        mamba_shared_prefix_checkpoint=partial and manager.mamba_shared_prefix_checkpoint,
        mamba_has_prefill_checkpoint_blocks=mamba.num_prefill_checkpoint_blocks > 0,
        mamba_prefill_checkpoint_alignment=mamba.prefill_checkpoint_alignment,
        use_eagle_block_drop=False,
        num_hash_lookahead_tokens=vllm_config.num_hash_lookahead_tokens,
    )
    hasher = _request_hasher(cache_config, vllm_config, hash_block_size)
    return ManagerPeer(geometry, manager, hasher, split_fields)


class ManagerReplay(Replay):
    """The same arrivals through `KVCacheManager` driven by a minimal step loop, no
    `Scheduler`: running requests first, then waiting ones admitted in order within the token
    budget and `max_num_seqs`; every chunk cut by vLLM's own Mamba block-aligned split; no
    preemption (a pool too small for the batch is an error)."""

    def __init__(self, peer: ManagerPeer) -> None:
        super().__init__(peer)
        self.max_num_seqs = min(256, peer.geometry.max_num_batched_tokens)
        self.running: list = []
        self.waiting: deque = deque()

    def _add(self, request) -> None:
        self.waiting.append(request)

    def _split(self, request, num_new: int, num_hit: int = 0) -> int:
        from vllm.v1.core.sched.scheduler import Scheduler

        return Scheduler._mamba_block_aligned_split(
            self.peer.split_fields, request, num_new, num_hit
        )

    def _step(self, in_flight: dict[str, _Track]) -> None:
        self.num_steps += 1
        self.peer.manager.new_step_starts()
        budget = self.peer.geometry.max_num_batched_tokens
        scheduled = self._schedule_running(budget)
        budget -= sum(num_new for _, num_new in scheduled)
        scheduled += self._admit_waiting(budget, in_flight)
        self._drain()
        finished = self._run(scheduled, in_flight)
        self._check_progress(bool(scheduled) or finished, in_flight)

    def _schedule_running(self, budget: int) -> list:
        scheduled = []
        for request in self.running:
            if budget <= 0:
                break
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            num_new = self._split(request, num_new)
            if num_new == 0:
                continue
            if self.peer.manager.allocate_slots(request, num_new) is None:
                raise RuntimeError(
                    f"the minimal loop does not preempt: the pool of "
                    f"{self.peer.geometry.num_pool_blocks} blocks is too small (--num-blocks)"
                )
            scheduled.append((request, num_new))
            budget -= num_new
        return scheduled

    def _admit_waiting(self, budget: int, in_flight: dict[str, _Track]) -> list:
        from vllm.v1.request import RequestStatus

        manager, admitted = self.peer.manager, []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            blocks, num_hit, request.shared_prefix_boundary = manager.get_computed_blocks(request)
            num_new = self._split(request, min(request.num_tokens - num_hit, budget), num_hit)
            if num_new == 0:
                break
            new_blocks = manager.allocate_slots(
                request, num_new, num_hit, blocks, has_scheduled_reqs=bool(self.running)
            )
            if new_blocks is None:
                break
            self.waiting.popleft()
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit
            in_flight[request.request_id].num_cached_tokens = num_hit
            admitted.append((request, num_new))
            budget -= num_new
        return admitted

    def _drain(self) -> None:
        """What vLLM's `schedule()` drains from the manager every step: new block ids (kept
        for zeroing), the Mamba boundary states offered for offload, and the copy-on-write
        copies, whose retained source and destination blocks go back to the pool (the copies
        are taken as run)."""
        manager = self.peer.manager
        manager.take_new_block_ids()
        manager.take_boundary_state_offloads()
        _, retained = manager.take_kv_cache_block_copies()
        if retained:
            manager.block_pool.free_blocks(retained)

    def _run(self, scheduled: list, in_flight: dict[str, _Track]) -> bool:
        """The faked model: advance each chunk, sample a token where the prompt is done, and
        free what finished. The blocks were cached by `allocate_slots`, as in vLLM's step
        (its `update_from_output` caches again only for speculative or async output)."""
        from vllm.v1.core.sched.utils import check_stop

        manager, finished = self.peer.manager, False
        for request, num_new in scheduled:
            start = request.num_computed_tokens
            request.num_computed_tokens = end = start + num_new
            if start < request.num_prompt_tokens:
                chunk = [start, min(end, request.num_prompt_tokens)]
                in_flight[request.request_id].chunks.append(chunk)
            if end < request.num_tokens:
                continue
            request.append_output_token_ids(_sampled_token(request))
            if check_stop(request, self.peer.geometry.max_model_len):
                manager.free(request)
                self.running.remove(request)
                del in_flight[request.request_id]
                finished = True
        return finished


def _record(track: _Track) -> dict:
    request = track.request
    hit = track.num_cached_tokens or 0
    return {
        "id": request.request_id,
        "num_prompt_tokens": request.num_prompt_tokens,
        "num_cached_tokens": hit,
        "hit_tokens_by_group": {"attention": hit, "mamba": hit},
        "num_computed_tokens": sum(end - start for start, end in track.chunks),
        "chunks": track.chunks,
        "num_preemptions": request.num_preemptions,
    }


# ---------------------------------------------------------------------------------------------
# Serve commands


def cmd_hash(prompts: list[list[int]], unit: int, algo: str = "sha256") -> dict:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    hash_fn = get_hash_fn_by_name(algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(unit, hash_fn)
    params = SamplingParams(max_tokens=1)
    timings, counts = [], []
    for i, tokens in enumerate(prompts):
        request = Request(f"hash-{i}", list(tokens), params, None)
        started = time.perf_counter_ns()
        hashes = hasher(request)
        timings.append(time.perf_counter_ns() - started)
        counts.append(len(hashes))
    return {"ok": True, "ns": timings, "num_hashes": counts}


def cmd_lookup(geometry: Geometry, warm_prompts: list[list[int]], prompts: list[list[int]]) -> dict:
    peer = build_peer(_fit(geometry, warm_prompts + prompts))
    warm = [{"id": f"warm-{i}", "prompt_token_ids": p} for i, p in enumerate(warm_prompts)]
    Replay(peer).run(warm, concurrency=1)
    manager = peer.scheduler.kv_cache_manager
    timings, hits = [], []
    for i, tokens in enumerate(prompts):
        request = make_request(peer, f"lookup-{i}", tokens)
        started = time.perf_counter_ns()
        _, num_hit, _ = manager.get_computed_blocks(request)
        timings.append(time.perf_counter_ns() - started)
        hits.append(num_hit)
    return {"ok": True, "ns": timings, "hit_tokens": hits}


def cmd_replay(
    geometry: Geometry, requests: list[dict], concurrency: int = 1, loop: str = "scheduler"
) -> dict:
    """The requests through vLLM's `Scheduler` (`loop` "scheduler") or through its
    `KVCacheManager` driven by the minimal loop ("manager")."""
    _check_requests(requests)
    geometry = _fit(geometry, [r["prompt_token_ids"] for r in requests], requests)
    if loop == "scheduler":
        replay = Replay(build_peer(geometry))
    elif loop == "manager":
        replay = ManagerReplay(build_manager_peer(geometry))
    else:
        raise GeometryError(f"--loop must be scheduler or manager, got {loop!r}")
    started = time.perf_counter()
    records = replay.run(requests, concurrency)
    wall_s = time.perf_counter() - started
    answer = {"ok": True, "records": records, "wall_s": wall_s, "num_steps": replay.num_steps}
    if geometry.cpu_bytes:
        answer["offload"] = _offload_answer(replay)
    return answer


def _offload_answer(replay: Replay) -> dict:
    """The CPU tier's size as vLLM sized it, and what the instant worker reported."""
    connector = replay.peer.scheduler.connector
    manager = connector.scheduler.manager
    return {
        "connector": type(connector).__name__,
        "manager": type(manager).__name__,
        "num_cpu_chunks": manager._num_chunks,  # vLLM's `cpu_bytes_to_use // chunk bytes`
        **vars(replay.transfers.counts),
    }


def _fit(geometry: Geometry, prompts: list[list[int]], requests: list[dict] = ()) -> Geometry:
    """`max_model_len` raised to hold the longest prompt plus its output."""
    longest = max((len(p) for p in prompts), default=0)
    longest = max(
        [longest] + [len(r["prompt_token_ids"]) + r.get("max_tokens", 1) for r in requests]
    )
    if longest + 1 <= geometry.max_model_len:
        return geometry
    return replace(geometry, max_model_len=longest + 1)


def _check_requests(requests: list[dict]) -> None:
    seen: set[str] = set()
    for n, item in enumerate(requests, start=1):
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise GeometryError(f'request {n}: needs a string "id"')
        tokens = item.get("prompt_token_ids")
        if not isinstance(tokens, list) or not tokens:
            raise GeometryError(f'request {item["id"]!r}: needs a non-empty "prompt_token_ids"')
        if item["id"] in seen:
            raise GeometryError(f"request {item['id']!r}: the id repeats")
        seen.add(item["id"])


def serve(stdin=None, stdout=None) -> int:
    import vllm

    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    for line in stdin:
        if not line.strip():
            continue
        try:
            command = json.loads(line)
            answer, done = _answer(command, vllm.__version__)
        except Exception as exc:  # one bad command must not end a benchmark's session
            answer, done = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, False
        stdout.write(json.dumps(answer, separators=(",", ":")) + "\n")
        stdout.flush()
        if done:
            break
    return 0


def _answer(command: dict, version: str) -> tuple[dict, bool]:
    name = command.get("cmd")
    if name == "ping":
        return {"ok": True, "vllm": version}, False
    if name == "quit":
        return {"ok": True}, True
    if name == "hash":
        return cmd_hash(
            command["prompts"], int(command["unit"]), command.get("algo", "sha256")
        ), False
    geometry = Geometry.from_dict(dict(command.get("geometry", {})))
    if name == "lookup":
        return cmd_lookup(geometry, command.get("warm_prompts", []), command["prompts"]), False
    if name in ("replay", "manager_replay"):
        loop = "manager" if name == "manager_replay" else "scheduler"
        concurrency = int(command.get("concurrency", 1))
        return cmd_replay(geometry, command["requests"], concurrency, loop), False
    raise ValueError(f"unknown cmd {name!r} (ping, hash, lookup, replay, manager_replay, quit)")


# ---------------------------------------------------------------------------------------------
# Command line


def read_requests(path: str) -> Iterator[dict]:
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, start=1):
            if raw.strip():
                try:
                    yield json.loads(raw)
                except json.JSONDecodeError as exc:
                    raise GeometryError(
                        f"{path} line {number}: not valid JSON ({exc.msg})"
                    ) from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm_replay", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    replay = sub.add_parser("replay", help="replay an expanded trace through vLLM")
    replay.add_argument("trace", help="expanded trace JSONL")
    replay.add_argument("--block-size", type=int, default=16, help="attention block size Ba")
    replay.add_argument("--mamba-block-size", type=int, default=512, help="Mamba block size Bm")
    replay.add_argument("--prefix-match-unit", type=int, default=None, help="U (default: gcd)")
    replay.add_argument("--eagle", action="store_true", help="EAGLE: hits drop one unit")
    replay.add_argument("--no-partial-hits", action="store_true", help="hit only on lcm(Ba, Bm)")
    replay.add_argument("--max-num-batched-tokens", type=int, default=8192)
    replay.add_argument("--long-prefill-threshold", type=int, default=0)
    replay.add_argument("--num-blocks", type=int, default=4096, help="blocks per group")
    replay.add_argument("--num-mamba-blocks", type=int, default=None)
    replay.add_argument(
        "--retention-interval",
        default="0",
        help="vLLM's prefix_cache_retention_interval: 0 (its default), N, or dense",
    )
    replay.add_argument(
        "--cpu-bytes",
        type=int,
        default=0,
        help="vLLM's native CPU offloading (OffloadingConnector, LRU) with this many bytes",
    )
    replay.add_argument(
        "--page-bytes", type=int, default=None, help="one block id's bytes (sizes CPU chunks)"
    )
    replay.add_argument("--concurrency", type=int, default=1)
    replay.add_argument(
        "--loop",
        choices=("scheduler", "manager"),
        default="scheduler",
        help="vLLM's Scheduler, or its KVCacheManager driven by a minimal step loop",
    )
    replay.add_argument("--out", default=None, help="output JSONL (default: stdout)")
    sub.add_parser("serve", help="JSON-lines server on stdin/stdout (see the docstring)")
    return parser


def geometry_from_args(args: argparse.Namespace) -> Geometry:
    retention = args.retention_interval
    try:
        retention = None if retention == "dense" else int(retention)
    except ValueError:
        raise GeometryError(
            f"--retention-interval must be an integer or dense, got {retention}"
        ) from None
    return Geometry(
        block_size=args.block_size,
        mamba_block_size=args.mamba_block_size,
        prefix_match_unit=args.prefix_match_unit,
        eagle=args.eagle,
        partial_hits=not args.no_partial_hits,
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_threshold=args.long_prefill_threshold,
        num_blocks=args.num_blocks,
        num_mamba_blocks=args.num_mamba_blocks,
        retention_interval=retention,
        cpu_bytes=args.cpu_bytes,
        page_bytes=args.page_bytes,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve()
    try:
        geometry = geometry_from_args(args)
        requests = list(read_requests(args.trace))
        answer = cmd_replay(geometry, requests, args.concurrency, args.loop)
    except GeometryError as exc:
        print(f"vllm_replay: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        print(f"vllm_replay: cannot read {args.trace}: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    lines = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in answer["records"])
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(lines)
    else:
        sys.stdout.write(lines)
    print(
        f"vllm_replay: {len(answer['records'])} requests, {answer['num_steps']} steps, "
        f"{answer['wall_s']:.3f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
