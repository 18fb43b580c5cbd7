"""The control plane's bearer tokens, checked before anything starts.

The write token is `JUNCTION_API_TOKEN`; unset, `junction api` (and `junction up`, for every
part it starts) makes one at first start, `secrets.token_urlsafe(32)`, and keeps it in a file
only its owner reads (`JUNCTION_API_TOKEN_FILE`, default beside the SQLite store, else in the
working directory), which later starts read again. There is no built-in token. A token that is
empty, shorter than `MIN_LENGTH`, `.env.example`'s placeholder, of fewer than `MIN_DISTINCT`
different characters (`aaaaaaaaaaaaaaaa`), or shorter than `PLAIN_LENGTH` without a digit
(`junction-dev-token`: words, not a secret), holding a common password (`password12345678`) or
made mostly of runs (`abcdefgh12345678`) is refused, so is an optional read-only token
(`JUNCTION_READ_TOKEN`) that is set but fails the same rules or equals the write token (it
would then write). A token file that others may read, or that is a symbolic link, is refused
rather than used.

`bearer_token` reads a request's `Authorization: Bearer` header; the routes' dependencies
compare what it reads with these tokens (`api.deps`).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import NamedTuple

from sqlalchemy.engine import make_url

from api.settings import Settings

MIN_LENGTH = 16
MIN_DISTINCT = 8  # different characters a token holds at least
PLAIN_LENGTH = 32  # a token shorter than this needs a digit: a few words are no secret
RUN_LENGTH = 3  # a run this long of climbing, falling or equal characters adds nothing
MIN_DISTINCT_BESIDE_RUNS = 6  # different characters a short token holds besides its runs
#: words a token shorter than `PLAIN_LENGTH` may not hold: the head of every leaked-password list
COMMON_PASSWORDS = (
    "password",
    "passw0rd",
    "secret",
    "changeme",
    "letmein",
    "qwerty",
    "admin",
    "welcome",
    "iloveyou",
    "monkey",
    "dragon",
)
#: `.env.example`'s `JUNCTION_API_TOKEN`: a placeholder to replace, so a control plane refuses it.
EXAMPLE_TOKEN = "replace-me-with-a-long-random-secret"
TOKEN_FILE_NAME = "junction-api-token"
HOW_TO_MAKE_ONE = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


#: The 401 of a write that sends no token (`api.deps`', and `api.guards.limits`' before the
#: body is read).
MISSING_WRITE_TOKEN = "missing bearer token (Authorization: Bearer <JUNCTION_API_TOKEN>)"


class TokenError(ValueError):
    """A token the control plane will not start with; the message says which and what to do."""


class ApiToken(NamedTuple):
    token: str  # the write token every part sends
    file: Path | None  # where it is kept; None: it came from JUNCTION_API_TOKEN
    is_new: bool  # made by this start
    is_shared: bool = False  # the replicas on the database share it (`api.guards.shared_token`)


def resolve_token(settings: Settings) -> ApiToken:
    """The write token of `settings`, else the one kept in `token_file(settings)` (made there
    now if there is none); raises `TokenError` for a token it refuses. Checks the read token
    too. Creates the file at most; changes nothing else."""
    if settings.read_token is not None:
        check_token(settings.read_token, "JUNCTION_READ_TOKEN")
        if settings.read_token == settings.api_token:
            raise TokenError(
                "JUNCTION_READ_TOKEN equals JUNCTION_API_TOKEN, so the read-only token would "
                f"write: give it a secret of its own ({HOW_TO_MAKE_ONE})"
            )
    if settings.api_token is not None:
        return ApiToken(check_token(settings.api_token, "JUNCTION_API_TOKEN"), None, False)
    path = token_file(settings)
    try:
        return ApiToken(_read(path), path, False)
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another start made it meanwhile: use that one
        return ApiToken(_read(path), path, False)
    except OSError as exc:
        raise TokenError(
            f"JUNCTION_API_TOKEN is not set and {path} cannot be created ({exc.strerror}): "
            "set JUNCTION_API_TOKEN, or JUNCTION_API_TOKEN_FILE to a writable path"
        ) from exc
    with os.fdopen(descriptor, "w") as file:
        file.write(token + "\n")
    return ApiToken(token, path, True)


def check_token(token: str, name: str) -> str:
    """`token` if a control plane may use it as `name`; else `TokenError` saying why."""
    fix = f"set {name} to a secret of at least {MIN_LENGTH} characters ({HOW_TO_MAKE_ONE})"
    if not token.strip():
        unset = " or unset it to have one made" if name == "JUNCTION_API_TOKEN" else ""
        raise TokenError(f"{name} is empty: {fix}{unset}")
    if token != token.strip():
        raise TokenError(f"{name} starts or ends with whitespace: {fix}")
    if token == EXAMPLE_TOKEN:
        raise TokenError(f"{name} is the placeholder of .env.example: {fix}")
    if len(token) < MIN_LENGTH:
        raise TokenError(f"{name} has {len(token)} characters, too few: {fix}")
    if len(set(token)) < MIN_DISTINCT:
        raise TokenError(f"{name} has only {len(set(token))} different characters: {fix}")
    if len(token) < PLAIN_LENGTH and not any(c.isdigit() for c in token):
        raise TokenError(
            f"{name} looks like words, not a secret (under {PLAIN_LENGTH} characters and no "
            f"digit): {fix}"
        )
    if len(token) < PLAIN_LENGTH:
        word = next((w for w in COMMON_PASSWORDS if w in token.lower()), None)
        if word is not None:
            raise TokenError(
                f"{name} holds the common password {word!r} (under {PLAIN_LENGTH} characters): "
                f"{fix}"
            )
        rest = without_runs(token)
        if len(set(rest)) < MIN_DISTINCT_BESIDE_RUNS:
            raise TokenError(
                f"{name} is mostly runs like 1234 or abcd ({len(set(rest))} different "
                f"characters besides them, under {PLAIN_LENGTH} characters): {fix}"
            )
    return token


def without_runs(text: str) -> str:
    """`text` less every run of `RUN_LENGTH` or more characters whose code points climb or
    fall by one (`1234`, `dcba`) or stay (`aaa`): what a guess does not have to find."""
    kept, start = [], 0
    while start < len(text):
        end = start + 1
        if end < len(text):
            step = ord(text[end]) - ord(text[start])
            if step in (-1, 0, 1):
                while end < len(text) and ord(text[end]) - ord(text[end - 1]) == step:
                    end += 1
        if end - start >= RUN_LENGTH:
            start = end
            continue
        kept.append(text[start])
        start += 1
    return "".join(kept)


def token_file(settings: Settings) -> Path:
    """`JUNCTION_API_TOKEN_FILE`, else `junction-api-token` in the SQLite store's folder, else
    in the working directory."""
    if settings.api_token_file is not None:
        return settings.api_token_file
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        return Path(url.database).parent / TOKEN_FILE_NAME
    return Path(TOKEN_FILE_NAME)


def where(api_token: ApiToken) -> str:
    """Where the token is, for a log line (never the token itself)."""
    if api_token.file is None:
        return "the API token is JUNCTION_API_TOKEN's"
    path = api_token.file.resolve()
    if api_token.is_shared:
        made = "made an API token; " if api_token.is_new else ""
        return (
            f"{made}the replicas on this database share the API token, kept in {path} too "
            "(mode 600); clients send it"
        )
    if api_token.is_new:
        return f"made an API token and kept it in {path} (mode 600); clients send it"
    return f"the API token is the one kept in {path}"


def _read(path: Path) -> str:
    """The token kept in `path` (FileNotFoundError if there is none); `TokenError` if the file
    is a symbolic link, others may read it, or it holds no token `check_token` accepts."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        raise TokenError(
            f"{path} is a symbolic link: set JUNCTION_API_TOKEN_FILE to the file itself "
            "(a link could hand the token to another file's readers)"
        )
    if info.st_mode & 0o077:
        raise TokenError(
            f"{path} may be read by others (mode {stat.S_IMODE(info.st_mode):o}): "
            f"chmod 600 {path}, or delete it to have a new one made"
        )
    token = path.read_text().strip()
    if len(token) < MIN_LENGTH or token == EXAMPLE_TOKEN:
        raise TokenError(
            f"{path} holds no usable token (it needs at least {MIN_LENGTH} characters): "
            "delete it to have one made, or set JUNCTION_API_TOKEN"
        )
    return token


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, else None."""
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None
