"""The write token replicas on one database share.

`junction api` without `JUNCTION_API_TOKEN` keeps the token it makes in a file
(`api.guards.token`), by default in its working directory: replicas started in different
directories made different tokens, and half the clients then failed (issue 31). So on a
database other than SQLite (SQLite serves one process) the token is kept in the store as well,
in `api_secrets`: the first replica to start keeps its token there, and every later one takes
that one. A replica that has just made its token file rewrites the file with the shared token
(nobody can have read the file's first token yet); a file an earlier start left that holds
another token is refused, naming it, rather than have two tokens in use. The token in the
store is as secret as the data beside it: whoever reads the database reads what it records.
"""

from __future__ import annotations

import os

from sqlalchemy import Engine, insert, select
from sqlalchemy.exc import IntegrityError

from api.guards.token import ApiToken, TokenError, check_token
from api.store.models import ApiSecret

WRITE_TOKEN = "write_token"  # the name of the shared write token in `api_secrets`


def share_token(db: Engine, api_token: ApiToken) -> ApiToken:
    """The token every replica on `db` uses: `api_token` when it came from
    `JUNCTION_API_TOKEN` (each replica is given it) or when it is the first kept in the
    store, else the store's (rewriting a token file made by this start). `TokenError` when a
    token file an earlier start made holds another token. Writes the store's row at most once."""
    if api_token.file is None:
        return api_token
    with db.begin() as connection:
        try:
            with connection.begin_nested():
                connection.execute(
                    insert(ApiSecret).values(name=WRITE_TOKEN, value=api_token.token)
                )
        except IntegrityError:  # another replica kept its token first
            pass
        shared = connection.scalar(select(ApiSecret.value).where(ApiSecret.name == WRITE_TOKEN))
    shared = check_token(shared, "the token in the store's api_secrets")
    if shared == api_token.token:
        return api_token._replace(is_shared=True)
    path = api_token.file
    if not api_token.is_new:
        raise TokenError(
            f"{path} holds a token other than the one the replicas on this database share: "
            f"delete {path} to take theirs (it is then written there), or give every replica "
            "one JUNCTION_API_TOKEN"
        )
    descriptor = os.open(path, os.O_WRONLY | os.O_TRUNC)  # made by this start, mode 600
    with os.fdopen(descriptor, "w") as file:
        file.write(shared + "\n")
    return ApiToken(shared, path, False, is_shared=True)
