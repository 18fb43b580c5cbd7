"""The hybrid model: byte embedding, residual pre-norm blocks (Mamba-2 or attention), tied head.

Glossary:
    V   vocabulary (258 bytes + BOS + EOS)    d   model width
    l   tokens of a prefill chunk             b   sequences in a decode step
    L   layers; A of them attention, placed evenly: layer `round((i + 1) * L / A) - 1`

Each block is `h = h + mixer(norm(h))`; there is no MLP. The head is the embedding matrix
itself (`logits = norm(h) @ E^T`), so the weights file holds it once.

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
from engine.model.mamba2 import Mamba2Mixer, MambaShape, MambaState
from engine.model.norm import RMSNorm

EMBEDDING_STD = 0.1


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
    def __init__(self, mixer: Attention | Mamba2Mixer, d: int) -> None:
        super().__init__()
        self.norm = RMSNorm(d)
        self.mixer = mixer


class HybridModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.attention_layer_ids = attention_layer_ids(
            config.num_layers, config.num_attention_layers
        )
        self.mamba_layer_ids = [
            i for i in range(config.num_layers) if i not in self.attention_layer_ids
        ]
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = d // config.num_heads
        theta = float(config.extra.get("rope_theta", 10000))
        shape = mamba_shape(config)
        self.embedding = nn.Embedding(config.vocab_size, d)
        self.layers = nn.ModuleList(
            Block(
                Attention(d, config.num_heads, config.num_kv_heads, theta)
                if i in self.attention_layer_ids
                else Mamba2Mixer(shape),
                d,
            )
            for i in range(config.num_layers)
        )
        self.final_norm = RMSNorm(d)
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

    def mamba_state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv_state shape, ssm_state shape) of ONE Mamba layer for ONE slot."""
        return mamba_shape(self.config).state_shapes()

    @property
    def device(self) -> torch.device:
        return self.embedding.weight.device

    def _logits(self, h: Tensor) -> Tensor:  # [..., d] -> [..., V] float32
        return (self.final_norm(h) @ self.embedding.weight.t()).float()

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
        h = self.embedding(token_ids.to(device))  # [l, d]
        final_states: list[MambaState] = []
        saved: dict[int, list[MambaState]] = {o: [] for o in save_offsets}
        for i, block in enumerate(self.layers):
            x = block.norm(h)
            if isinstance(block.mixer, Attention):
                cache = kv_caches[self.attention_layer_ids.index(i)]
                h = h + block.mixer.prefill(x, start, cache, write_slots, context_slots)
                continue
            index = self.mamba_layer_ids.index(i)
            state = (
                mamba_states[index] if mamba_states is not None else block.mixer.zero_state(device)
            )
            state = (state[0].to(device), state[1].to(device))
            out = block.mixer.prefill(x, state, save_offsets)
            h = h + out.y
            final_states.append(out.final_state)
            for offset, layer_state in out.saved_states.items():
                saved[offset].append(layer_state)
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
        h = self.embedding(token_ids.to(device))  # [b, d]
        new_states: list[MambaState] = []
        for i, block in enumerate(self.layers):
            x = block.norm(h)
            if isinstance(block.mixer, Attention):
                cache = kv_caches[self.attention_layer_ids.index(i)]
                h = h + block.mixer.decode(x, positions, cache, write_slots, context_slots)
                continue
            conv, ssm = mamba_states[self.mamba_layer_ids.index(i)]
            y, state = block.mixer.step(x, (conv.to(device), ssm.to(device)))
            h = h + y
            new_states.append(state)
        return DecodeOutput(self._logits(h), new_states)

    @torch.no_grad()
    def forward_reference(self, token_ids: Tensor) -> Tensor:
        """Whole sequence [l] -> logits [l, V] with no cache, Mamba via the sequential scan."""
        h = self.embedding(token_ids.to(self.device))  # [l, d]
        for block in self.layers:
            h = h + block.mixer.forward_reference(block.norm(h))
        return self._logits(h)

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


def resolve_device(config: ModelConfig) -> torch.device:
    if config.device is not None:
        return torch.device(config.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build_model(config: ModelConfig) -> HybridModel:
    """From `config.weights_path` if set, else from the seed; on the device and dtype, eval."""
    if config.weights_path:
        model = HybridModel.load(config, config.weights_path)
    else:
        model = HybridModel(config)
    dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
    return model.to(device=resolve_device(config), dtype=dtype).eval()
