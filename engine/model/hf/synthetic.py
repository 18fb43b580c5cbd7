"""Synthetic Hugging Face checkpoints: a transformers model with random weights, saved by
transformers itself beside a small tokenizer, for the tests and benchmarks to load as they
would a download. The engine never calls this.

`write_checkpoint(model, path)` saves config.json, model.safetensors and
generation_config.json, then `build_tokenizer(path)` a byte-level BPE trained on a few
sentences (tokenizer.json, tokenizer_config.json with a chat template). A model's config
takes `VOCAB_SIZE` and the special ids from here, so its embedding covers the tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

VOCAB_SIZE = 384  # the config's; the tokenizer fills the first ids, as real checkpoints pad
SPECIAL_TOKENS = ["<|pad|>", "<|begin|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Junction caches prefixes of hybrid attention and Mamba models.",
    "Hello, world! How are you today? I am fine, thank you.",
    "A state space model carries a recurrent state from token to token.",
    "def main():\n    print('hello')\n",
] * 4


def build_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on `CORPUS`, with the chat template, saved to `path`."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 16,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<|pad|>",
        bos_token="<|begin|>",
        eos_token="<|end|>",
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(path)
    return fast


def write_checkpoint(model: PreTrainedModel, path: Path) -> Path:
    """`model` (its config built with `VOCAB_SIZE` and the special ids) and the tokenizer,
    saved to `path` as one checkpoint; returns `path`."""
    path = Path(path)
    model.save_pretrained(path)
    build_tokenizer(path)
    return path
