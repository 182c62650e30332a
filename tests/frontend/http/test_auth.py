"""API keys (a bearer token or x-api-key): which routes need one, the 401 in each surface's
shape, key sources."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.frontend.harness import FakeEngine, wait_serving
from tinyserve.config import Config, build_config
from tinyserve.errors import TinyServeError
from tinyserve.frontend.http import openapi_document
from tinyserve.frontend.http.app import build_app
from tinyserve.frontend.http.auth import ApiKeys, bearer_token, is_open, read_key_file

Client = TestClient[Any, Any]
KEYS = ("key-one", "key-two")
GOOD = {"Authorization": "Bearer key-two"}


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return build_config({"runtime_dir": str(tmp_path), "api_key": list(KEYS)}, environ={})


@pytest.fixture
async def served(engine: FakeEngine, config: Config) -> AsyncIterator[Client]:
    async with TestClient(TestServer(build_app(config))) as client:
        await wait_serving(client)
        yield client


async def refused(response: Any) -> dict[str, Any]:
    assert response.status == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    body: dict[str, Any] = await response.json()
    return body["error"]


WRONG = [
    {},
    {"Authorization": "Bearer key-three"},
    {"Authorization": "Bearer key-on"},  # a prefix of a key
    {"Authorization": "Bearer key-one-and-more"},
    {"Authorization": "Bearer "},
    {"Authorization": "Basic a2V5LW9uZTo="},
    {"Authorization": "key-one"},
    {"api-key": "key-one"},  # two ways only: the bearer header, x-api-key
    {"x-api-key": "key-three"},
    {"x-api-key": ""},
    {"Authorization": "Bearer key-three", "x-api-key": "key-one"},  # the bearer token counts
]


@pytest.mark.parametrize("headers", WRONG)
async def test_generation_routes_refuse_a_missing_or_wrong_key(
    served: Client, headers: dict[str, str]
) -> None:
    native = await refused(await served.post("/generate", json={"prompt": "Hi"}, headers=headers))
    message = native["message"]
    assert native == {"type": "invalid_api_key", "message": message}
    body = {"model": "fake", "prompt": "Hi"}
    openai = await refused(await served.post("/v1/completions", json=body, headers=headers))
    # The same words whatever was wrong: nothing tells a missing key from a wrong one.
    assert openai == {
        "message": message,
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
    await refused(await served.get("/v1/models", headers=headers))
    await refused(await served.post("/v1/chat/completions", json={}, headers=headers))
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        response = await served.post(path, json={}, headers=headers)
        assert response.status == 401 and response.headers["WWW-Authenticate"] == "Bearer"
        anthropic = {"type": "authentication_error", "message": message, "code": "invalid_api_key"}
        assert await response.json() == {"type": "error", "error": anthropic}
    # Routes that do not exist (or come later) are closed too, not merely 404.
    await refused(await served.get("/v1/requests/abc", headers=headers))


async def test_a_right_key_is_served(served: Client) -> None:
    response = await served.post("/generate", json={"prompt": "Hi"}, headers=GOOD)
    assert response.status == 200 and (await response.json())["text"] == "Hello"
    other = {"Authorization": "bearer   key-one"}  # scheme case-insensitive
    assert (await served.get("/v1/models", headers=other)).status == 200
    anthropic_clients = {"x-api-key": "key-one"}  # as Anthropic's SDKs send it
    assert (await served.get("/v1/models", headers=anthropic_clients)).status == 200


async def test_probes_and_the_api_document_stay_open(served: Client) -> None:
    for path in ("/health", "/ready", "/openapi.json"):
        assert (await served.get(path)).status == 200, path


async def test_metrics_needs_a_key_unless_told_otherwise(
    engine: FakeEngine, config: Config
) -> None:
    # Only the key check in front of the route is tested here (the route is not ours).
    for metrics_auth in (True, False):
        app = build_app(dataclasses.replace(config, metrics_auth=metrics_auth))
        async with TestClient(TestServer(app)) as client:
            await wait_serving(client)
            keyless = await client.get("/metrics")
            assert (keyless.status == 401) == metrics_auth
            assert (await client.get("/metrics", headers=GOOD)).status != 401


async def test_no_key_configured_means_no_check(engine: FakeEngine, tmp_path: Path) -> None:
    config = build_config({"runtime_dir": str(tmp_path)}, environ={})
    async with TestClient(TestServer(build_app(config))) as client:
        await wait_serving(client)
        assert (await client.post("/generate", json={"prompt": "Hi"})).status == 200


def test_key_file_comments_blank_lines_and_flags_combine(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# production\nfile-key-1\n\n   file-key-2  \n# old: revoked-key\n")
    assert read_key_file(str(path)) == ["file-key-1", "file-key-2"]
    config = build_config(
        {"runtime_dir": str(tmp_path), "api_key": ["flag-key"], "api_key_file": str(path)},
        environ={},
    )
    keys = ApiKeys.of_config(config)
    assert [keys.accepts(k) for k in ("flag-key", "file-key-2", "revoked-key", "")] == [
        True,
        True,
        False,
        False,
    ]


@pytest.mark.parametrize(
    ("content", "words"),
    [(None, "cannot read"), ("# only a comment\n\n", "holds no key"), ("a b\n", "spaces")],
)
def test_bad_key_file_is_a_start_up_error(tmp_path: Path, content: str | None, words: str) -> None:
    path = tmp_path / "keys"
    if content is not None:
        path.write_text(content)
    config = build_config({"runtime_dir": str(tmp_path), "api_key_file": str(path)}, environ={})
    with pytest.raises(TinyServeError, match=words):
        build_app(config)


def test_keys_from_the_environment_are_comma_separated(tmp_path: Path) -> None:
    env = {"TINYSERVE_API_KEY": "a1, b2,,c3"}
    assert build_config({"runtime_dir": str(tmp_path)}, environ=env).api_key == ("a1", "b2", "c3")
    with pytest.raises(SystemExit, match="TINYSERVE_API_KEY"):
        build_config({}, environ={"TINYSERVE_API_KEY": "has space"})


def test_keys_never_reach_a_child_command_line(tmp_path: Path) -> None:
    config = build_config({"runtime_dir": str(tmp_path), "api_key": list(KEYS)}, environ={})
    argv = config.flags_for("frontend")
    assert not any("key-one" in arg or arg == "--api-key" for arg in argv)
    assert config.secret_env_for("frontend") == {"TINYSERVE_API_KEY": "key-one,key-two"}
    assert config.secret_env_for("engine") == {}
    rebuilt = build_config({}, environ=config.secret_env_for("frontend"))
    assert rebuilt.api_key == KEYS


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("BEARER abc", "abc"),
        ("Bearer  abc ", "abc"),
        ("Bearer", None),
        ("Token abc", None),
        (None, None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_the_api_document_says_which_routes_take_a_key() -> None:
    paths = openapi_document.document()["paths"]
    for path, methods in paths.items():
        for operation in methods.values():
            secured = "security" in operation
            assert secured == (not is_open(path)), path
            assert ("401" in operation["responses"]) == secured, path
    either = [{openapi_document.BEARER: []}, {openapi_document.API_KEY: []}, {}]
    assert paths["/generate"]["post"]["security"] == either
    assert "security" in paths["/v1/events"]["get"]  # the feed's data needs the key
    assert "security" not in paths["/dashboard"]["get"]  # the page holds none


@pytest.mark.parametrize(
    ("path", "open_"),
    [("/dashboard", True), ("/dashboard/dashboard.js", True), ("/dashboards", False),
     ("/v1/events", False), ("/health", True)],
)  # fmt: skip
def test_only_the_dashboard_files_and_probes_are_open(path: str, open_: bool) -> None:
    assert is_open(path) == open_
