"""An OpenAI request's prompt as token ids, rendered as the engine renders it: a completion's
`prompt` (text, or token ids inside the vocabulary) and a chat's `messages` through the
model's chat template. The engine's routes and the router both call these, so the router scores
the very tokens the engine will run."""

from __future__ import annotations

from engine.model.tokenizer import ChatPrompt, Tokenizer
from protocol.errors import OpenAIError
from protocol.schemas import ChatMessage


def prompt_token_ids(
    tokenizer: Tokenizer, prompt: str | list[int] | list[str] | list[list[int]]
) -> list[int]:
    if prompt and isinstance(prompt, list) and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise OpenAIError(
                f"batched prompts are not supported: send one prompt a request, got {len(prompt)}",
                param="prompt",
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    vocab_size = tokenizer.vocab_size
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise OpenAIError(f"token ids must lie in [0, {vocab_size}), got {bad[:5]}", param="prompt")
    return list(prompt)


def _content(message: ChatMessage, index: int) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    texts = []
    for part in message.content:
        if part.type != "text" or part.text is None:
            raise OpenAIError(
                f"only text content parts are supported, got {part.type!r}",
                param=f"messages.{index}.content",
            )
        texts.append(part.text)
    return "".join(texts)


def fewest_tokens(
    tokenizer: Tokenizer, prompt: str | list[int] | list[str] | list[list[int]]
) -> int:
    """The fewest tokens `prompt` can be, known without tokenizing it: its ids, or its text's
    UTF-8 bytes over the most bytes one token stands for (`Tokenizer.max_token_bytes`)."""
    if prompt and isinstance(prompt, list) and not isinstance(prompt[0], int):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return -(-len(prompt.encode("utf-8", "surrogatepass")) // tokenizer.max_token_bytes)
    return len(prompt)


def fewest_chat_tokens(tokenizer: Tokenizer, messages: list[ChatMessage]) -> int:
    """The fewest tokens the chat can be, its template aside: its text parts' bytes over the
    most bytes one token stands for."""
    num_bytes = 0
    for message in messages:
        content = message.content
        if isinstance(content, str):
            num_bytes += len(content.encode("utf-8", "surrogatepass"))
        elif content:
            num_bytes += sum(
                len(part.text.encode("utf-8", "surrogatepass"))
                for part in content
                if getattr(part, "text", None)
            )
    return -(-num_bytes // tokenizer.max_token_bytes)


def chat_prompt(tokenizer: Tokenizer, messages: list[ChatMessage]) -> ChatPrompt:
    if not messages:
        raise OpenAIError("messages must not be empty", param="messages")
    plain = [{"role": m.role, "content": _content(m, i)} for i, m in enumerate(messages)]
    try:
        return tokenizer.chat_prompt(plain)
    except ValueError as exc:  # no chat template, or the template refused the messages
        raise OpenAIError(str(exc), param="messages") from exc
