"""Headless Chromium driven over the DevTools protocol, for the report's browser checks and bench/report_page.py.

Chromium speaks the protocol on a pipe (``--remote-debugging-pipe``: it reads commands on its fd 3 and writes
answers and events on its fd 4, each message JSON ended by a NUL byte), so nothing but the standard library is
needed and no port is opened. :func:`open_report` loads a page with the network blocked three ways (no proxy
that answers, no host name that resolves, every http, https, ws and ftp URL blocked by the protocol) and
records every request the page makes, every console message, exception and log entry; :class:`PageCheck`
holds what a check saw.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import struct
import subprocess
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio",
         "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND"]  # no network at all

BLOCKED = ["http://*", "https://*", "ws://*", "wss://*", "ftp://*"]  # Network.setBlockedURLs: every remote scheme

# Whether every chart is drawn (the page's script sets window.sbenchReady once every Vega view has rendered).
READY_JS = "typeof window.sbenchReady === 'number' ? window.sbenchReady : null"


# What the page's main thread spent until every chart was drawn (Performance.getMetrics: seconds of CPU work,
# steadier than the wall clock on a shared machine), and the elements it holds.
MAIN_THREAD = ("TaskDuration", "ScriptDuration", "LayoutDuration", "RecalcStyleDuration", "Nodes")


class BrowserError(RuntimeError):
    pass


def _high(fd: int) -> int:
    """*fd* moved to a descriptor number of 10 or more."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class Chromium:
    """One headless Chromium process and one page (a target attached in flat mode); :meth:`send` sends a
    command to the page and returns its result; events are kept in :attr:`events`."""

    def __init__(self, chromium: str, width: int = 1400, height: int = 1000, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.events: list[dict[str, Any]] = []
        self._next = 0
        self._answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self._profile = tempfile.mkdtemp(prefix="sbench-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium's ends above 9, so that putting them on 3 and 4 never overwrites one with the other
        to_chrome_r, from_chrome_w = (_high(fd) for fd in (to_chrome_r, from_chrome_w))
        # bash (dash takes no descriptor above 9) puts the pipes on Chromium's fds 3 (in) and 4 (out), then execs it
        cmd = ["/bin/bash", "-c", f'exec "$0" "$@" 3<&{to_chrome_r} 4>&{from_chrome_w}', chromium, *FLAGS,
               f"--user-data-dir={self._profile}", f"--window-size={width},{height}", "--remote-debugging-pipe",
               "about:blank"]
        self.proc = subprocess.Popen(cmd, pass_fds=(to_chrome_r, from_chrome_w), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.session: str | None = None
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            self.send("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        except BaseException:
            self.close()  # no Chromium left behind
            raise

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_chrome, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            *msgs, buf = buf.split(b"\0")
            for m in msgs:
                self._answers.put(json.loads(m))
        self._answers.put({"closed": True})

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        try:
            os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        except BrokenPipeError:
            self.proc.wait(timeout=10)
            raise BrowserError(f"{method}: Chromium exited ({self.proc.returncode}): {self._stderr()}") from None
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                ans = self._answers.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise BrowserError(f"{method}: no answer from Chromium in {self.timeout:.0f} s") from None
            if ans.get("closed"):
                raise BrowserError(f"{method}: Chromium closed its pipe: {self._stderr()}")
            if ans.get("id") == self._next:
                if "error" in ans:
                    raise BrowserError(f"{method}: {ans['error']}")
                return ans.get("result", {})
            if "method" in ans:
                self.events.append(ans)

    def pump(self, seconds: float) -> None:
        """Keep the events that arrive in the next *seconds*."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                ans = self._answers.get(timeout=left)
            except queue.Empty:
                return
            if "method" in ans:
                self.events.append(ans)

    def evaluate(self, expression: str) -> Any:
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in res:
            raise BrowserError(f"{expression[:80]}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0, poll: float = 0.02) -> Any:
        """The value of *expression* once it is neither null nor false (polled in the page)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value not in (None, False):
                return value
            self.pump(poll)
        raise BrowserError(f"waited {timeout:.0f} s for {expression[:80]}")

    def _stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read().decode(errors="replace")[-2000:]

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self.send("Browser.close")
                except BrowserError:
                    pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        finally:
            for fd in (self._to_chrome, self._from_chrome):
                try:
                    os.close(fd)
                except OSError:
                    pass
            if self.proc.stderr is not None:
                self.proc.stderr.close()
            shutil.rmtree(self._profile, ignore_errors=True)


@dataclass
class PageCheck:
    """What loading one page saw: every URL it requested, the console's errors (messages, exceptions, log
    entries), the milliseconds until every chart was drawn (``window.sbenchReady``) and what the main thread spent
    until then."""

    requests: list[str] = field(default_factory=list)
    request_ids: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    ready_ms: float = 0.0
    wall_s: float = 0.0
    main_thread: dict[str, float] = field(default_factory=dict)  # seconds of MAIN_THREAD until then; Nodes


def _collect(browser: Chromium, check: PageCheck) -> None:
    for ev in browser.events:
        method, p = ev["method"], ev.get("params", {})
        if method == "Network.requestWillBeSent":
            check.requests.append(p["request"]["url"])
            check.request_ids[p["requestId"]] = p["request"]["url"]
        elif method == "Network.loadingFailed":
            check.errors.append(f"not loaded: {check.request_ids.get(p['requestId'], '?')} ({p['errorText']})")
        elif method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            check.errors.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert", "warning"):
            check.errors.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                                     for a in p["args"]))
        elif method == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
            check.errors.append(f"log {p['entry']['level']}: {p['entry']['text']} {p['entry'].get('url', '')}")
    browser.events.clear()


@contextmanager
def open_report(page: Path, width: int = 1400, height: int = 1000, timeout: float = 60.0
                ) -> Iterator[tuple[Chromium, PageCheck]]:
    """Chromium with *page* loaded, the network blocked, and every chart drawn; the check so far (requests,
    errors, time to draw). Call :func:`settle` to gather what happened since."""
    if CHROMIUM is None:
        raise BrowserError("chromium is not installed (apt-get install chromium)")
    browser = Chromium(CHROMIUM, width, height, timeout)
    check = PageCheck()
    try:
        for domain in ("Page", "Runtime", "Log", "Network", "Performance"):
            browser.send(f"{domain}.enable")
        browser.send("Network.setBlockedURLs", {"urls": BLOCKED})
        browser.send("Network.setCacheDisabled", {"cacheDisabled": True})
        t = time.perf_counter()
        browser.send("Page.navigate", {"url": page.resolve().as_uri()})
        check.ready_ms = float(browser.wait_for(READY_JS, timeout=timeout))
        check.wall_s = time.perf_counter() - t
        metrics = {m["name"]: m["value"] for m in browser.send("Performance.getMetrics")["metrics"]}
        check.main_thread = {k: metrics.get(k, 0.0) for k in MAIN_THREAD}
        browser.pump(0.2)
        _collect(browser, check)
        yield browser, check
    finally:
        browser.close()


def settle(browser: Chromium, check: PageCheck, seconds: float = 0.2) -> PageCheck:
    """Gather the events of the next *seconds* into *check*."""
    browser.pump(seconds)
    _collect(browser, check)
    return check


# A point of a chart that has a tooltip: the centre of the first drawn mark (*marks*: a CSS selector of Vega's
# SVG) of the chart *cid*, after scrolling it into view (viewport coordinates), or null.
MARK_JS = """
(function (cid, marks) {
  const el = document.getElementById(cid);
  if (!el) return null;
  el.scrollIntoView({block: 'center'});
  for (const p of el.querySelectorAll(marks)) {
    const r = p.getBoundingClientRect();
    if (r.width > 2 && r.height > 2) return [r.left + r.width / 2, r.top + r.height / 2];
  }
  return null;
})
"""

TOOLTIP_JS = """
(function () {
  const t = document.getElementById('vg-tooltip-element');
  if (!t || !t.classList.contains('visible')) return null;
  const r = t.getBoundingClientRect();
  return r.width > 0 && r.height > 0 ? t.innerText : null;
})()
"""


SYMBOLS, BARS = "g.mark-symbol path", "g.mark-rect path"  # Vega's SVG: a scatter's points, a bar chart's bars


def hover_tooltip(browser: Chromium, chart_id: str, marks: str = SYMBOLS, timeout: float = 10.0) -> str:
    """Move the mouse over a mark (*marks*) of the chart *chart_id* and return the text of the tooltip it shows."""
    where = browser.wait_for(f"{MARK_JS}({json.dumps(chart_id)}, {json.dumps(marks)})", timeout=timeout)
    x, y = where
    for dx in (-1.0, 0.0):  # two moves: Vega shows a tooltip on a pointer move over the mark
        browser.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x + dx, "y": y})
    return str(browser.wait_for(TOOLTIP_JS, timeout=timeout))


def click(browser: Chromium, x: float, y: float) -> None:
    """A left click at (*x*, *y*) of the viewport."""
    browser.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
    for kind in ("mousePressed", "mouseReleased"):
        browser.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})


LEGEND = "g.role-legend-symbol path"  # Vega's SVG: a legend entry's symbol


def click_legend(browser: Chromium, chart_id: str, timeout: float = 10.0) -> None:
    """Click the first entry of the legend of the chart *chart_id*."""
    x, y = browser.wait_for(f"{MARK_JS}({json.dumps(chart_id)}, {json.dumps(LEGEND)})", timeout=timeout)
    click(browser, x, y)


def screenshot(browser: Chromium) -> bytes:
    """The viewport as PNG."""
    return base64.b64decode(browser.send("Page.captureScreenshot", {"format": "png"})["data"])


def png_pixels(data: bytes) -> tuple[int, int, set[bytes]]:
    """(width, height, the distinct RGB values of a sample of the pixels) of an 8-bit RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    height, ctype = 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6), (depth, ctype)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    values: set[bytes] = set()
    for y in range(height):
        ftype, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 255
            elif ftype == 2:
                line[i] = (line[i] + b) & 255
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        values.update(bytes(line[i:i + 3]) for i in range(0, stride, bpp * 7))  # every 7th pixel
        prev = line
    return width, height, values
