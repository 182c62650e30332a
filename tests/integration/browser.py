"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol, for page tests.

The browser writes its debugging port to ``DevToolsActivePort`` in its profile; we attach to
its one page over a websocket (aiohttp's client) and send DevTools commands: navigate,
evaluate JavaScript, click at a point, take a screenshot. Every network request the page
makes is recorded (``Network.requestWillBeSent``) so a test can check where it went.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest

START_TIMEOUT_S = 60.0
COMMAND_TIMEOUT_S = 60.0


def chromium_or_skip() -> str:
    """The browser's path; skips the test (naming the package) where it is not installed."""
    path = shutil.which("chromium")
    if path is None:
        pytest.skip(
            "chromium is not installed: `make test` installs it as root on Debian "
            "(deploy/system-deps.sh), else: apt-get install --no-install-recommends chromium"
        )
    return path


class Browser:
    """One headless Chromium with one page."""

    def __init__(self, workdir: Path) -> None:
        self.profile = workdir / "chromium-profile"
        self.requests: list[str] = []  # every URL the page asked for, in order
        self.console: list[str] = []  # console messages and uncaught exceptions
        self._process: subprocess.Popen[bytes] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._log = (workdir / "chromium.log").open("wb")

    async def start(self, width: int = 1280, height: int = 900) -> Browser:
        argv = [
            chromium_or_skip(),
            "--headless",
            "--no-sandbox",  # tests may run as root, where the sandbox refuses to start
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",  # no update checks or other calls home
            "--disable-component-update",
            "--disable-sync",
            "--metrics-recording-only",
            f"--window-size={width},{height}",
            f"--user-data-dir={self.profile}",
            "--remote-debugging-port=0",
            "about:blank",
        ]
        self._process = subprocess.Popen(argv, stdout=self._log, stderr=self._log)
        port = await self._debugging_port()
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json(content_type=None)
        page = next(t for t in targets if t["type"] == "page")
        self._ws = await self._session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime", "Network"):
            await self.call(f"{domain}.enable")
        return self

    async def _debugging_port(self) -> int:
        port_file = self.profile / "DevToolsActivePort"
        for _ in range(int(START_TIMEOUT_S / 0.1)):
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"chromium exited with status {self._process.returncode}")
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(port_file.read_text().split()[0])
            await asyncio.sleep(0.1)
        raise RuntimeError("chromium did not open its debugging port")

    async def _read(self) -> None:
        assert self._ws is not None
        async for message in self._ws:
            data = json.loads(message.data)
            answer = self._pending.pop(data.get("id", -1), None)
            if answer is not None and not answer.done():
                answer.set_result(data)
            method = data.get("method")
            if method == "Network.requestWillBeSent":
                self.requests.append(data["params"]["request"]["url"])
            elif method == "Runtime.consoleAPICalled":
                args = data["params"]["args"]
                self.console.append(" ".join(str(a.get("value", a.get("type"))) for a in args))
            elif method == "Runtime.exceptionThrown":
                self.console.append(json.dumps(data["params"]["exceptionDetails"])[:2000])

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its ``result`` (raises on a protocol error)."""
        assert self._ws is not None
        command_id = next(self._ids)
        answer = asyncio.get_running_loop().create_future()
        self._pending[command_id] = answer
        await self._ws.send_str(json.dumps({"id": command_id, "method": method, "params": params}))
        data = await asyncio.wait_for(answer, COMMAND_TIMEOUT_S)
        if "error" in data:
            raise RuntimeError(f"{method}: {data['error']}")
        result: dict[str, Any] = data["result"]
        return result

    async def goto(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        await self.until("document.readyState === 'complete'")

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def until(self, expression: str, timeout_s: float = 60.0) -> Any:
        """Poll a JavaScript expression until it is truthy; returns its value."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"never true: {expression}\nconsole: {self.console}")
            await asyncio.sleep(0.1)

    async def click(self, x: float, y: float) -> None:
        """A real left click at page coordinates (press and release)."""
        for kind in ("mousePressed", "mouseReleased"):
            await self.call(
                "Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1
            )

    async def screenshot(self, path: Path) -> None:
        data = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(data["data"]))

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._ws is not None:
            await self._ws.close()
        if self._session is not None:
            await self._session.close()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        self._log.close()
