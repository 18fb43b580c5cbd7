"""A small hybrid language model: byte tokenizer, Mamba-2 and attention layers, tied head."""
