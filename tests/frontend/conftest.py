"""Fixtures of the frontend tests: a config in a temp runtime dir, the stand-in engine, the app."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.frontend.harness import FakeEngine, wait_serving
from tinyserve.config import Config, build_config
from tinyserve.frontend.http.app import build_app


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return build_config({"runtime_dir": str(tmp_path), "max_tokens_limit": 256}, environ={})


@pytest.fixture
async def engine(config: Config) -> AsyncIterator[FakeEngine]:
    fake = FakeEngine(config).start()
    yield fake
    await fake.stop()


@pytest.fixture
async def client(config: Config) -> AsyncIterator[TestClient[Any, Any]]:
    """The frontend app under test; not waiting for any engine."""
    async with TestClient(TestServer(build_app(config))) as test_client:
        yield test_client


@pytest.fixture
async def served(engine: FakeEngine, client: TestClient[Any, Any]) -> TestClient[Any, Any]:
    """The frontend app, handshake with ``engine`` done."""
    await wait_serving(client)
    return client
