"""The `torch` runner: the hybrid model over the paged KV cache and the Mamba state pool.

Storage, one tensor per layer and block:
    k, v   [num_blocks, Ba, kv, d]          every attention layer (Ba = block_size * D)
    conv   [num_mamba_blocks, *conv_shape]  every Mamba layer
    ssm    [num_mamba_blocks, *ssm_shape]   every Mamba layer
A position `p` of a request lives in KV slot `table[p // Ba] * Ba + p % Ba`. A step zeroes the
new blocks, runs the copies in queue order (every layer's pages of an attention block, every
layer's conv and SSM state of a Mamba block), then prefills each chunk over
`[cached prefix + chunk]` and decodes the one-token chunks as one batch.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from engine.cache.manager import BlockCopy
from engine.config import CacheConfig, ModelConfig
from engine.events import ATTENTION, MAMBA
from engine.model.build import build_model
from engine.runners.base import Runner, block_rows
from engine.runners.sampling import sample
from engine.scheduling.outputs import RunnerOutput, ScheduledChunk
from engine.tiers.moves import UnitLoad, UnitSave
from engine.tiers.unit import TierUnit


class TorchRunner(Runner):
    kind = "torch"

    def __init__(
        self, cache_config: CacheConfig, model_config: ModelConfig, record_logits: bool = False
    ) -> None:
        self.model = build_model(model_config)
        parameter = next(self.model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.medium = "GPU" if self.device.type == "cuda" else "CPU"
        self.block_size = cache_config.attention_block_size
        self.record_logits = record_logits
        self._copier: ThreadPoolExecutor | None = None  # the CPU's copy thread for loads
        kv_shape = (
            cache_config.num_blocks,
            self.block_size,
            self.model.num_kv_heads,
            self.model.head_dim,
        )
        self.kv = [
            (self._zeros(kv_shape), self._zeros(kv_shape)) for _ in self.model.attention_layer_ids
        ]
        conv_shape, ssm_shape = self.model.mamba_state_shapes()
        slots = cache_config.mamba_num_blocks
        self.conv = [self._zeros((slots, *conv_shape)) for _ in self.model.mamba_layer_ids]
        self.ssm = [self._zeros((slots, *ssm_shape)) for _ in self.model.mamba_layer_ids]

    def _zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.zeros(shape, device=self.device, dtype=self.dtype)

    # ------------------------------------------------------------------ block work
    def _group_tensors(self, group: str) -> list[torch.Tensor]:
        if group == ATTENTION:
            return [t for pair in self.kv for t in pair]
        return [*self.conv, *self.ssm]

    def zero_blocks(self, group: str, block_ids: list[int]) -> None:
        index = torch.tensor(block_ids, device=self.device)
        for tensor in self._group_tensors(group):
            tensor.index_fill_(0, index, 0)

    def copy_block(self, copy: BlockCopy) -> None:
        for tensor in self._group_tensors(copy.group):
            tensor[copy.dst].copy_(tensor[copy.src])

    # ------------------------------------------------------------------ tiers
    @torch.inference_mode()
    def save_unit(self, save: UnitSave) -> TierUnit:
        """Every attention layer's K and V rows over `[start, end)` and every state layer's
        conv and SSM state, copied to CPU tensors the unit owns."""
        blocks = []
        for block_id, low, high in block_rows(
            save.attention_block_ids, self.block_size, save.start, save.end
        ):
            payload = {}
            for layer, (k, v) in enumerate(self.kv):
                payload[f"k.{layer}"] = k[block_id, low:high].to("cpu", copy=True)
                payload[f"v.{layer}"] = v[block_id, low:high].to("cpu", copy=True)
            blocks.append(payload)
        state = {}
        for layer, (conv, ssm) in enumerate(zip(self.conv, self.ssm, strict=True)):
            state[f"conv.{layer}"] = conv[save.state_block].to("cpu", copy=True)
            state[f"ssm.{layer}"] = ssm[save.state_block].to("cpu", copy=True)
        return TierUnit(save.key, save.parent, save.start, save.end, tuple(blocks), state)

    @torch.inference_mode()
    def load_unit(self, load: UnitLoad) -> None:
        for unit in load.units:
            low = max(load.start, unit.start)
            if low >= unit.end:
                continue
            slots = self._slots(list(load.attention_block_ids), low, unit.end)
            for layer, (k, v) in enumerate(self.kv):
                for name, cache in ((f"k.{layer}", k), (f"v.{layer}", v)):
                    rows = torch.cat([block[name] for block in unit.blocks])[low - unit.start :]
                    flat = cache.view(-1, *cache.shape[2:])
                    flat[slots] = rows.to(self.device, non_blocking=True)
        state = load.units[-1].state
        for layer, (conv, ssm) in enumerate(zip(self.conv, self.ssm, strict=True)):
            conv[load.state_block].copy_(state[f"conv.{layer}"], non_blocking=True)
            ssm[load.state_block].copy_(state[f"ssm.{layer}"], non_blocking=True)

    def start_loads(self, loads: list[UnitLoad]) -> object:
        """On CUDA the loads go on a side stream, which the forward's stream waits for only
        at the step's end; on the CPU a copy thread runs them beside the forward."""
        if not loads:
            return None
        if self.device.type == "cuda":
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))  # after zeroes, copies
            with torch.cuda.stream(stream):
                for load in loads:
                    self.load_unit(load)
            return stream
        if self._copier is None:
            self._copier = ThreadPoolExecutor(1, thread_name_prefix="junction-tier-loads")
        return self._copier.submit(lambda: [self.load_unit(load) for load in loads])

    def finish_loads(self, loading: object) -> None:
        if isinstance(loading, Future):
            loading.result()  # a load's error is raised here, in the step
        elif loading is not None:
            torch.cuda.current_stream(self.device).wait_stream(loading)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ forward
    def _slots(self, block_ids: list[int], start: int, end: int) -> torch.Tensor:
        positions = torch.arange(start, end, device=self.device)  # [n]
        table = torch.tensor(block_ids, device=self.device, dtype=torch.long)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def _read_states(self, block_id: int | None) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        if block_id is None:
            return None
        return [
            (c[block_id].clone(), s[block_id].clone())
            for c, s in zip(self.conv, self.ssm, strict=True)
        ]

    def _write_states(self, block_id: int, states: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for layer, (conv_state, ssm_state) in enumerate(states):
            self.conv[layer][block_id].copy_(conv_state)
            self.ssm[layer][block_id].copy_(ssm_state)

    @torch.inference_mode()
    def forward(self, chunks: list[ScheduledChunk]) -> RunnerOutput:
        out = RunnerOutput()
        decodes = [c for c in chunks if c.end - c.start == 1 and c.start > 0]
        for chunk in chunks:
            if chunk.end - chunk.start == 1 and chunk.start > 0:
                continue
            logits = self._prefill(chunk)
            self._take(out, chunk, logits)
        if decodes:
            logits = self._decode(decodes)
            for row, chunk in enumerate(decodes):
                self._take(out, chunk, logits[row])
        return out

    def _take(self, out: RunnerOutput, chunk: ScheduledChunk, logits: torch.Tensor) -> None:
        if not chunk.sample:
            return
        logits = logits.float()
        out.sampled[chunk.request_id] = sample(logits, chunk.sampling, chunk.output_index)
        if self.record_logits:
            out.logits[chunk.request_id] = logits.cpu()

    def _prefill(self, chunk: ScheduledChunk) -> torch.Tensor:
        start, end = chunk.start, chunk.end
        token_ids = torch.tensor(chunk.token_ids[start:end], device=self.device)  # [l]
        context = self._slots(chunk.attention_block_ids, 0, end)  # [start + l]
        saves = {position - start: block for position, block in chunk.mamba_writes}
        final_block = saves.pop(end - start)
        result = self.model.prefill(
            token_ids,
            start,
            self.kv,
            context[start:],
            context,
            self._read_states(chunk.mamba_read_block),
            sorted(saves),
        )
        for offset, block_id in saves.items():
            self._write_states(block_id, result.saved_states[offset])
        self._write_states(final_block, result.final_states)
        return result.logits

    def _decode(self, chunks: list[ScheduledChunk]) -> torch.Tensor:
        device = self.device
        token_ids = torch.tensor([c.token_ids[c.start] for c in chunks], device=device)  # [b]
        positions = torch.tensor([c.start for c in chunks], device=device)  # [b]
        contexts = [self._slots(c.attention_block_ids, 0, c.end) for c in chunks]
        write_slots = torch.stack([ctx[-1] for ctx in contexts])  # [b]
        reads = torch.tensor([c.mamba_read_block for c in chunks], device=device)  # [b]
        states = [
            (conv[reads].clone(), ssm[reads].clone())
            for conv, ssm in zip(self.conv, self.ssm, strict=True)
        ]
        result = self.model.decode(token_ids, positions, self.kv, write_slots, contexts, states)
        writes = torch.tensor([c.mamba_writes[-1][1] for c in chunks], device=device)  # [b]
        for layer, (conv_state, ssm_state) in enumerate(result.new_states):
            self.conv[layer][writes] = conv_state.to(self.conv[layer].dtype)
            self.ssm[layer][writes] = ssm_state.to(self.ssm[layer].dtype)
        return result.logits

    def _num_attention_blocks(self) -> int:
        """The attention pool's blocks (what a probe may use)."""
        return self.kv[0][0].shape[0] if self.kv else 1

    def measure_prefill_rate(self, num_tokens: int = 256) -> float | None:
        """One warm prefill of `num_tokens` then a timed one, over the first blocks and
        state slot, zeroed after (call before any block holds a cache entry)."""
        from engine.request import SamplingParams

        num_blocks = min(-(-num_tokens // self.block_size), self._num_attention_blocks())
        num_tokens = min(num_tokens, num_blocks * self.block_size)
        chunk = ScheduledChunk(
            "prefill-rate-probe",
            [i % 200 + 1 for i in range(num_tokens)],
            0,
            num_tokens,
            list(range(num_blocks)),
            None,
            [(num_tokens, 0)],
            False,
            SamplingParams(max_tokens=1),
            0,
        )
        self.forward([chunk])  # warm
        started = time.perf_counter()
        self.forward([chunk])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - started
        self.zero_blocks(ATTENTION, chunk.attention_block_ids)
        self.zero_blocks(MAMBA, [0])
        return num_tokens / max(elapsed, 1e-9)
