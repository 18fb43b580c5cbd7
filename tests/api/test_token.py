"""`api.guards.token`: the write token from the setting, else made once and kept in its file (mode
600), and every token the control plane refuses to start with."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from api.guards.token import EXAMPLE_TOKEN, TOKEN_FILE_NAME, TokenError, resolve_token, token_file
from api.settings import Settings


def settings(tmp_path: Path, **values) -> Settings:
    return Settings(_env_file=None, database_url=f"sqlite:///{tmp_path / 'junction.db'}", **values)


def test_a_token_is_made_once_kept_for_its_owner_and_reused(tmp_path: Path) -> None:
    made = resolve_token(settings(tmp_path))
    assert made.file == tmp_path / TOKEN_FILE_NAME and made.is_new
    assert stat.S_IMODE(made.file.stat().st_mode) == 0o600
    assert made.file.read_text() == made.token + "\n" and len(made.token) >= 32
    again = resolve_token(settings(tmp_path))
    assert (again.token, again.file, again.is_new) == (made.token, made.file, False)


def test_the_setting_wins_and_no_file_is_made(tmp_path: Path) -> None:
    token = "from-the-environment-0123"
    assert resolve_token(settings(tmp_path, api_token=token)) == (token, None, False, False)
    assert list(tmp_path.iterdir()) == []


def test_where_the_file_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = tmp_path / "secrets" / "api-token"
    assert token_file(settings(tmp_path, api_token_file=str(chosen))) == chosen
    assert token_file(settings(tmp_path, api_token_file="")) == tmp_path / TOKEN_FILE_NAME
    postgres = Settings(_env_file=None, database_url="postgresql://u@db/junction")
    assert token_file(postgres) == Path(TOKEN_FILE_NAME)  # the working directory
    memory = Settings(_env_file=None, database_url="sqlite://")
    assert token_file(memory) == Path(TOKEN_FILE_NAME)
    monkeypatch.setenv("JUNCTION_API_TOKEN_FILE", str(chosen))
    assert Settings(_env_file=None).api_token_file == chosen


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"api_token": ""}, "JUNCTION_API_TOKEN is empty"),
        ({"api_token": " \t "}, "JUNCTION_API_TOKEN is empty"),
        ({"api_token": "x" * 15}, "JUNCTION_API_TOKEN has 15 characters, too few"),
        ({"api_token": " " + "x" * 20}, "JUNCTION_API_TOKEN starts or ends with whitespace"),
        ({"api_token": EXAMPLE_TOKEN}, "JUNCTION_API_TOKEN is the placeholder of .env.example"),
        ({"read_token": "short"}, "JUNCTION_READ_TOKEN has 5 characters, too few"),
        ({"api_token": "a" * 16}, "JUNCTION_API_TOKEN has only 1 different characters"),
        ({"api_token": "junction-dev-token"}, "JUNCTION_API_TOKEN looks like words, not a secret"),
        (
            {"api_token": "password12345678"},
            "JUNCTION_API_TOKEN holds the common password 'password'",
        ),
        ({"api_token": "Qwerty-2024-zz9x"}, "holds the common password 'qwerty'"),
        ({"api_token": "abcdefgh12345678"}, "JUNCTION_API_TOKEN is mostly runs like 1234 or abcd"),
        (
            {"api_token": "k7-shared-0123456789", "read_token": "k7-shared-0123456789"},
            "JUNCTION_READ_TOKEN equals JUNCTION_API_TOKEN, so the read-only token would write",
        ),
    ],
    ids=[
        "empty",
        "blank",
        "short",
        "whitespace",
        "the example's",
        "a short read token",
        "one character",
        "words",
        "a common password",
        "a common password, mixed case",
        "runs",
        "read equals write",
    ],
)
def test_tokens_it_refuses(tmp_path: Path, values: dict, says: str) -> None:
    with pytest.raises(TokenError, match=says) as refused:
        resolve_token(settings(tmp_path, **values))
    assert "\n" not in str(refused.value)
    assert "at least 16 characters" in str(refused.value) or "a secret of its own" in str(
        refused.value
    )
    assert list(tmp_path.iterdir()) == []  # no file made


def test_a_file_without_a_usable_token_is_refused(tmp_path: Path) -> None:
    (tmp_path / TOKEN_FILE_NAME).write_text("\n")
    (tmp_path / TOKEN_FILE_NAME).chmod(0o600)
    with pytest.raises(TokenError, match="holds no usable token"):
        resolve_token(settings(tmp_path))


def test_a_folder_it_cannot_write_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder" / "token"
    with pytest.raises(TokenError, match="no-such-folder/token cannot be created"):
        resolve_token(settings(tmp_path, api_token_file=str(missing)))


def test_an_empty_read_token_means_none(tmp_path: Path) -> None:
    assert settings(tmp_path, read_token="").read_token is None
    token = "y7Qm2-Zr9x-Kw4p1e"
    assert resolve_token(settings(tmp_path, read_token="", api_token=token)).token == token


def test_a_token_file_others_may_read_or_a_link_is_refused(tmp_path: Path) -> None:
    made = resolve_token(settings(tmp_path))
    made.file.chmod(0o644)
    with pytest.raises(TokenError, match=r"may be read by others \(mode 644\): chmod 600"):
        resolve_token(settings(tmp_path))
    made.file.chmod(0o600)
    link = tmp_path / "link-to-token"
    link.symlink_to(made.file)
    with pytest.raises(TokenError, match="is a symbolic link"):
        resolve_token(settings(tmp_path, api_token_file=str(link)))
    assert resolve_token(settings(tmp_path)).token == made.token


@pytest.fixture
def shared_db(postgres, postgres_template):
    """A migrated PostgreSQL database, the engine on it, dropped afterwards."""
    from api.store.db import make_engine

    name = postgres.create("junction_token", template=postgres_template)
    db = make_engine(postgres.url(name))
    yield db
    db.dispose()
    postgres.drop(name)


def test_replicas_started_in_different_folders_share_one_token(tmp_path: Path, shared_db):
    """Each replica made its own token in its working folder, and half the clients failed
    (issue 31): on one database the first replica's token is every replica's, and a replica
    that made its file now rewrites it with the shared one."""
    from api.guards.shared_token import share_token

    tokens = []
    for folder in ("a", "b", "c"):
        (tmp_path / folder).mkdir()
        settings = Settings(_env_file=None, api_token_file=tmp_path / folder / TOKEN_FILE_NAME)
        made = resolve_token(settings)
        assert made.is_new
        shared = share_token(shared_db, made)
        assert shared.is_shared and shared.file == made.file
        assert (tmp_path / folder / TOKEN_FILE_NAME).read_text().strip() == shared.token
        assert stat.S_IMODE((tmp_path / folder / TOKEN_FILE_NAME).stat().st_mode) == 0o600
        tokens.append(shared.token)
    assert len(set(tokens)) == 1


def test_an_older_token_file_that_disagrees_with_the_shared_token_is_refused(
    tmp_path: Path, shared_db
) -> None:
    from api.guards.shared_token import share_token

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    first = Settings(_env_file=None, api_token_file=tmp_path / "a" / TOKEN_FILE_NAME)
    second = Settings(_env_file=None, api_token_file=tmp_path / "b" / TOKEN_FILE_NAME)
    share_token(shared_db, resolve_token(first))
    older = resolve_token(second)  # made before the replicas shared one: kept by a start
    again = older._replace(is_new=False)
    with pytest.raises(TokenError, match="delete .* to take theirs"):
        share_token(shared_db, again)
    assert (tmp_path / "b" / TOKEN_FILE_NAME).read_text().strip() == older.token  # untouched
    given = Settings(_env_file=None, api_token="s3cret-given-to-every-replica-0123456789")
    assert share_token(shared_db, resolve_token(given)).token == given.api_token
