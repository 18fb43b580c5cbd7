"""The hybrid model: embedding, residual pre-norm blocks (Mamba-2, attention, MLP, MoE), head.

Glossary:
    V   vocabulary                            d   model width
    l   tokens of a prefill chunk             b   sequences in a decode step
    L   blocks; in the built-in model A of them are attention, placed evenly at
        `round((i + 1) * L / A) - 1`, the rest Mamba-2

Each block is `h = h + r * mixer(norm(h))`, with the residual multiplier `r` 1 unless a
checkpoint sets it (Granite). The mixer is attention (over the paged KV cache), a recurrent
mixer over a state slot (Mamba-2, or Gated DeltaNet in Qwen3.5 / Qwen3-Next: one model has one
kind, and the cache keeps either state as its `mamba` group) or a stateless feed-forward (MLP or
MoE). `HybridStack` is the stack and its three
paths; `HybridModel` is Junction's built-in instance of it (byte vocabulary, seeded weights,
no feed-forward, the head tied to the embedding, so the weights file holds it once);
`engine.model.hf` builds the stacks of Hugging Face checkpoints.

    logits = head(final_norm(h)) / logits_divisor,   h_0 = embedding_scale * E[token]

Three ways through the stack, all with the same weights:
    prefill            one request's chunk, from cached K/V and a Mamba state
    decode             one token for each of b requests
    forward_reference  a whole sequence with no cache and the sequential scan: the oracle
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from engine.config import ModelConfig
from engine.model.attention import Attention, KVCache
from engine.model.gdn import GatedDeltaNet, GDNShape
from engine.model.mamba2 import Mamba2Mixer, MambaShape, MambaState
from engine.model.norm import RMSNorm

EMBEDDING_STD = 0.1

#: the mixers that carry a recurrent state in a slot: (conv, ssm) for Mamba-2, (conv, recurrent
#: matrix) for Gated DeltaNet; both take `prefill(u, state, save_offsets)` and `step(u, state)`
STATE_MIXERS = (Mamba2Mixer, GatedDeltaNet)


class PrefillOutput(NamedTuple):
    logits: Tensor  # [V] float32, of the chunk's last token
    final_states: list[MambaState]  # per Mamba layer, after the chunk
    saved_states: dict[int, list[MambaState]]  # offset -> per Mamba layer, after that offset


class DecodeOutput(NamedTuple):
    logits: Tensor  # [b, V] float32
    new_states: list[MambaState]  # per Mamba layer: (conv [b, m, k - 1], ssm [b, h, p, n])


def attention_layer_ids(num_layers: int, num_attention_layers: int) -> list[int]:
    return [
        round((i + 1) * num_layers / num_attention_layers) - 1 for i in range(num_attention_layers)
    ]


def mamba_shape(config: ModelConfig) -> MambaShape:
    """Mamba knobs ModelConfig has no field for come from `config.extra`, with defaults."""
    names = ("expand", "headdim", "d_state", "ngroups", "d_conv", "chunk_size")
    defaults = MambaShape(config.d_model)
    return MambaShape(
        config.d_model, **{k: int(config.extra.get(k, getattr(defaults, k))) for k in names}
    )


class Block(nn.Module):
    """`h + residual_scale * mixer(norm(h))`; the mixer of a feed-forward block is stateless."""

    def __init__(
        self,
        mixer: Attention | Mamba2Mixer | GatedDeltaNet | nn.Module,
        d: int,
        eps: float = 1e-5,
        residual_scale: float = 1.0,
        norm_offset: float = 0.0,
    ) -> None:
        super().__init__()
        self.norm = RMSNorm(d, eps, norm_offset)
        self.mixer = mixer
        self.residual_scale = residual_scale

    def add(self, h: Tensor, y: Tensor) -> Tensor:
        """The residual step, h [..., d] + the mixer's output y [..., d]."""
        return h + (y if self.residual_scale == 1.0 else y * self.residual_scale)


class HybridStack(nn.Module):
    """Embedding, blocks, final norm and head (None: tied to the embedding), with the paths.

    `attention_layer_ids` and `mamba_layer_ids` index `layers`; the KV caches and Mamba states
    handed to `prefill` and `decode` come one per attention and one per Mamba block, in order.
    """

    def __init__(
        self,
        vocab_size: int,
        d: int,
        layers: list[Block],
        mamba_shape: MambaShape | GDNShape,
        *,
        eps: float = 1e-5,
        tied: bool = True,
        embedding_scale: float = 1.0,
        logits_divisor: float = 1.0,
        norm_offset: float = 0.0,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d)
        self.layers = nn.ModuleList(layers)
        self.final_norm = RMSNorm(d, eps, norm_offset)
        self.lm_head = None if tied else nn.Linear(d, vocab_size, bias=False)
        self.embedding_scale = embedding_scale
        self.logits_divisor = logits_divisor
        self.mamba_shape = mamba_shape
        self.attention_layer_ids = [
            i for i, b in enumerate(layers) if isinstance(b.mixer, Attention)
        ]
        self.mamba_layer_ids = [
            i for i, b in enumerate(layers) if isinstance(b.mixer, STATE_MIXERS)
        ]
        # the KV cache geometry; with no attention layer there is no KV cache, and 1 is a size
        attention = [layers[i].mixer for i in self.attention_layer_ids]
        self.num_kv_heads = attention[0].num_kv_heads if attention else 1
        self.head_dim = attention[0].head_dim if attention else 1

    def mamba_state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv_state shape, ssm_state shape) of ONE state layer for ONE slot (for Gated
        DeltaNet the second is the recurrent matrix per value head)."""
        return self.mamba_shape.state_shapes()

    @property
    def device(self) -> torch.device:
        return self.embedding.weight.device

    def _embed(self, token_ids: Tensor) -> Tensor:  # [...] -> [..., d]
        h = self.embedding(token_ids.to(self.device))
        return h if self.embedding_scale == 1.0 else h * self.embedding_scale

    def _logits(self, h: Tensor) -> Tensor:  # [..., d] -> [..., V] float32
        head = self.embedding.weight if self.lm_head is None else self.lm_head.weight
        logits = (self.final_norm(h) @ head.t()).float()
        return logits if self.logits_divisor == 1.0 else logits / self.logits_divisor

    @torch.no_grad()
    def prefill(
        self,
        token_ids: Tensor,
        start: int,
        kv_caches: list[KVCache],
        write_slots: Tensor,
        context_slots: Tensor,
        mamba_states: list[MambaState] | None,
        save_offsets: list[int],
    ) -> PrefillOutput:
        """One request's chunk `token_ids` [l] at positions start .. start + l - 1."""
        length = token_ids.shape[0]
        if (
            length == 0
            or write_slots.shape[0] != length
            or context_slots.shape[0] != start + length
        ):
            raise ValueError(
                f"prefill of {length} tokens from {start} needs {length} write slots and "
                f"{start + length} context slots, got {write_slots.shape[0]} and "
                f"{context_slots.shape[0]}"
            )
        bad = [o for o in save_offsets if not 1 <= o <= length]
        if bad:
            raise ValueError(f"save offsets {bad} lie outside 1..{length}")
        device = self.device
        write_slots, context_slots = write_slots.to(device), context_slots.to(device)
        h = self._embed(token_ids)  # [l, d]
        final_states: list[MambaState] = []
        saved: dict[int, list[MambaState]] = {o: [] for o in save_offsets}
        for i, block in enumerate(self.layers):
            x, mixer = block.norm(h), block.mixer
            if isinstance(mixer, Attention):
                cache = kv_caches[self.attention_layer_ids.index(i)]
                y = mixer.prefill(x, start, cache, write_slots, context_slots)
            elif isinstance(mixer, STATE_MIXERS):
                index = self.mamba_layer_ids.index(i)
                state = mamba_states[index] if mamba_states is not None else None
                state = mixer.zero_state(device) if state is None else state
                out = mixer.prefill(x, (state[0].to(device), state[1].to(device)), save_offsets)
                y = out.y
                final_states.append(out.final_state)
                for offset, layer_state in out.saved_states.items():
                    saved[offset].append(layer_state)
            else:  # a feed-forward block: no state
                y = mixer(x)
            h = block.add(h, y)
        return PrefillOutput(self._logits(h[-1]), final_states, saved)

    @torch.no_grad()
    def decode(
        self,
        token_ids: Tensor,
        positions: Tensor,
        kv_caches: list[KVCache],
        write_slots: Tensor,
        context_slots: list[Tensor],
        mamba_states: list[MambaState],
    ) -> DecodeOutput:
        """One token for each of b requests; token_ids, positions, write_slots [b]."""
        lengths = [len(slots) for slots in context_slots]
        if lengths != (positions + 1).tolist() or write_slots.shape[0] != len(lengths):
            raise ValueError(
                f"decode at positions {positions.tolist()} needs one write slot each and "
                f"position + 1 context slots each, got {write_slots.shape[0]} write slots and "
                f"context lengths {lengths}"
            )
        device = self.device
        positions, write_slots = positions.to(device), write_slots.to(device)
        context_slots = [slots.to(device) for slots in context_slots]
        h = self._embed(token_ids)  # [b, d]
        new_states: list[MambaState] = []
        for i, block in enumerate(self.layers):
            x, mixer = block.norm(h), block.mixer
            if isinstance(mixer, Attention):
                cache = kv_caches[self.attention_layer_ids.index(i)]
                y = mixer.decode(x, positions, cache, write_slots, context_slots)
            elif isinstance(mixer, STATE_MIXERS):
                conv, ssm = mamba_states[self.mamba_layer_ids.index(i)]
                y, state = mixer.step(x, (conv.to(device), ssm.to(device)))
                new_states.append(state)
            else:
                y = mixer(x)
            h = block.add(h, y)
        return DecodeOutput(self._logits(h), new_states)

    @torch.no_grad()
    def forward_reference(self, token_ids: Tensor) -> Tensor:
        """Whole sequence [l] -> logits [l, V] with no cache, Mamba via the sequential scan."""
        h = self._embed(token_ids)  # [l, d]
        for block in self.layers:
            x, mixer = block.norm(h), block.mixer
            stateful = isinstance(mixer, (Attention, *STATE_MIXERS))
            h = block.add(h, mixer.forward_reference(x) if stateful else mixer(x))
        return self._logits(h)


class HybridModel(HybridStack):
    """Junction's built-in model: `config`'s shape, weights from `config.seed`."""

    def __init__(self, config: ModelConfig) -> None:
        d = config.d_model
        attention_ids = attention_layer_ids(config.num_layers, config.num_attention_layers)
        theta = float(config.extra.get("rope_theta", 10000))
        shape = mamba_shape(config)
        layers = [
            Block(
                Attention(d, config.num_heads, config.num_kv_heads, theta)
                if i in attention_ids
                else Mamba2Mixer(shape),
                d,
            )
            for i in range(config.num_layers)
        ]
        super().__init__(config.vocab_size, d, layers, shape)
        self.config = config
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = d // config.num_heads
        self.reset_parameters(config.seed)

    def reset_parameters(self, seed: int) -> None:
        """Every weight from one CPU generator, so a seed gives the same model on any device."""
        generator = torch.Generator().manual_seed(seed)
        out_scale = (2 * len(self.layers)) ** -0.5
        with torch.no_grad():
            self.embedding.weight.normal_(0.0, EMBEDDING_STD, generator=generator)
            for block in self.layers:
                block.norm.weight.fill_(1.0)
                block.mixer.reset_parameters(generator, out_scale)
            self.final_norm.weight.fill_(1.0)

    def save(self, path: str) -> None:
        tensors = {name: t.detach().cpu().contiguous() for name, t in self.state_dict().items()}
        save_file(tensors, path, metadata={"name": self.config.name})

    @classmethod
    def load(cls, config: ModelConfig, path: str) -> HybridModel:
        """A model of `config`'s shape with the weights in `path` (float32, CPU)."""
        model = cls(config)
        expected = model.state_dict()
        found = load_file(path)
        missing = sorted(expected.keys() - found.keys())
        unexpected = sorted(found.keys() - expected.keys())
        if missing or unexpected:
            raise ValueError(
                f"weights file {path}: missing tensors {missing}, unexpected tensors {unexpected}"
            )
        for name, tensor in found.items():
            if tuple(tensor.shape) != tuple(expected[name].shape):
                raise ValueError(
                    f"weights file {path}: tensor {name} has shape "
                    f"{tuple(tensor.shape)}, expected {tuple(expected[name].shape)}"
                )
        model.load_state_dict(found)
        return model
