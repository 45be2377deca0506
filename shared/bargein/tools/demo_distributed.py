"""``bargein demo --distributed``: the real path, as separate processes.

It starts the three services as child processes, exactly as an operator would
(``bargein speech``, ``bargein reasoning``, ``bargein broadcast``, each ``python -m bargein ...``, with
``BARGEIN_PORT`` set to a free port), against the RabbitMQ and Redis the environment names
(``BARGEIN_RABBITMQ_URL`` / ``BARGEIN_REDIS_URL``, defaults on localhost). Once each is ready (the
workers log ``ready (up to``, the edge answers ``GET /readyz`` with 200) it runs ``bargein call``'s
client with a fixture WAV holding a question and then a barge-in, and prints the same live
timeline. The processes are always stopped (SIGTERM, then SIGKILL), on success, error or Ctrl-C.

With the scripted LLM (no ``BARGEIN_LLM_BASE_URL``) the agent's words are paced at
``DEMO_WORDS_PER_S`` unless ``BARGEIN_SCRIPTED_TOKENS_PER_S`` says otherwise, so that the second
utterance of the fixture lands while the answer is still streaming.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TextIO

import httpx

from bargein.settings import BrokerSettings, CoreSettings, LLMSettings, load
from bargein.tools.call import DEFAULT_LISTEN_AFTER_S, run_call
from bargein.tools.timeline import Timeline

DEFAULT_WAV = Path(str(resources.files("bargein") / "data" / "barge_in.wav"))  # made by make fixtures
WORKER_READY = "ready (up to"  # bargein.hosting.worker logs it once it takes session starts
START_TIMEOUT_S = 60.0  # model loading and broker connections on a busy machine
STOP_TIMEOUT_S = 15.0
DEMO_WORDS_PER_S = "10"  # scripted replies of 30-40 words last 3-4 s: the barge-in lands inside one


class DemoError(Exception):
    """The demo could not run; the message says why (and shows the failing service's log)."""


@dataclass
class _Child:
    name: str  # the bargein subcommand it runs
    proc: asyncio.subprocess.Process
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc.returncode is None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _env(port: int, agent_spec: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(BARGEIN_HOST="127.0.0.1", BARGEIN_PORT=str(port), PYTHONUNBUFFERED="1")
    env.setdefault("BARGEIN_LOG_FORMAT", "text")  # the services' logs are for people (--keep-logs)
    if agent_spec:
        env["BARGEIN_AGENT"] = agent_spec
    if not env.get("BARGEIN_LLM_BASE_URL"):
        env.setdefault("BARGEIN_SCRIPTED_TOKENS_PER_S", DEMO_WORDS_PER_S)
    return env


class _Services:
    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = env
        self.children: list[_Child] = []

    async def start(self, service: str) -> _Child:
        """``service`` is a ``bargein`` subcommand: ``speech``, ``reasoning`` or ``broadcast``."""
        log_path = self.log_dir / f"{service}.log"
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bargein",
                service,
                env=self.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in the terminal reaches only the demo, which stops them
            )
        child = _Child(service, proc, log_path)
        self.children.append(child)
        return child

    async def wait_log(self, child: _Child, marker: str, deadline: float) -> None:
        while marker not in child.log():
            self._check(child, deadline)
            await asyncio.sleep(0.05)

    async def wait_http_ready(self, child: _Child, url: str, deadline: float) -> None:
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                self._check(child, deadline)
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(f"{url}/readyz")).status_code == 200:
                        return
                await asyncio.sleep(0.1)

    def _check(self, child: _Child, deadline: float) -> None:
        if not child.alive():
            raise DemoError(
                f"{child.name} exited with code {child.proc.returncode} before it was ready "
                f"(is RabbitMQ/Redis running? see BARGEIN_RABBITMQ_URL, BARGEIN_REDIS_URL):\n"
                f"{_tail(child.log())}"
            )
        if time.monotonic() > deadline:
            raise DemoError(
                f"{child.name} was not ready after {START_TIMEOUT_S:.0f} s:\n{_tail(child.log())}"
            )

    async def stop(self) -> list[str]:
        """SIGTERM to all, SIGKILL to whoever is still running after ``STOP_TIMEOUT_S``; the names
        of those that had to be killed."""
        killed: list[str] = []
        for child in self.children:
            if child.alive():
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
        for child in self.children:
            try:
                await asyncio.wait_for(child.proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                killed.append(child.name)
                with contextlib.suppress(ProcessLookupError):
                    child.proc.kill()
                await child.proc.wait()
        return killed


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


async def run_distributed_demo(
    wav: Path | None = None,
    *,
    agent_spec: str | None = None,
    json_lines: bool = False,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    listen_after_s: float = DEFAULT_LISTEN_AFTER_S,
    keep_logs: bool = False,
) -> int:
    """Start the services, run the call, stop the services; the call's exit code (or 1 if the
    services did not come up). Progress lines go to ``out`` (``err`` with ``json_lines``, so the
    JSON stream holds only the call's entries)."""
    load(CoreSettings)  # a bad setting fails here with the variable's name, not in a child's log
    broker = load(BrokerSettings)
    load(LLMSettings)
    audio = wav or DEFAULT_WAV
    if not audio.exists():
        print(f"bargein demo: no fixture WAV at {audio}; pass one with --wav", file=err)
        return 2
    progress = Timeline(err if json_lines else out)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_dir = Path(tempfile.mkdtemp(prefix="bargein-demo-"))
    services = _Services(log_dir, _env(port, agent_spec))
    progress.line(
        "system", f"starting speech, reasoning and broadcast against {_redacted(broker.rabbitmq_url)}"
    )
    code = 1
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        speech = await services.start("speech")
        reasoning = await services.start("reasoning")
        edge = await services.start("broadcast")
        await services.wait_log(speech, WORKER_READY, deadline)
        await services.wait_log(reasoning, WORKER_READY, deadline)
        await services.wait_http_ready(edge, url, deadline)
        pids = ", ".join(f"{c.name} {c.proc.pid}" for c in services.children)
        progress.line("system", f"ready in {progress.elapsed():.1f} s (pids: {pids}); edge at {url}")
        progress.line("system", f"calling with {audio.name}: a question, then a barge-in over the answer")
        code = await run_call(
            url,
            audio,
            None,
            json_lines=json_lines,
            out=out,
            err=err,
            listen_after_s=listen_after_s,
            t0=None if json_lines else progress.t0,
        )
    except DemoError as exc:
        print(f"bargein demo: {exc}", file=err, flush=True)
    finally:
        progress.line("system", "stopping the services")
        stopping = time.monotonic()
        killed = await services.stop()
        note = f"; killed {', '.join(killed)} after {STOP_TIMEOUT_S:.0f} s" if killed else ""
        progress.line("system", f"services stopped in {time.monotonic() - stopping:.1f} s{note}")
        if keep_logs or code != 0:
            progress.line("system", f"service logs: {log_dir}")
        else:
            shutil.rmtree(log_dir, ignore_errors=True)
    return code


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at:
        return url
    user = creds.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}"


def main(
    wav: Path | None = None,
    *,
    agent_spec: str | None = None,
    json_lines: bool = False,
    keep_logs: bool = False,
) -> int:
    """``bargein demo --distributed``."""
    try:
        return asyncio.run(
            run_distributed_demo(wav, agent_spec=agent_spec, json_lines=json_lines, keep_logs=keep_logs)
        )
    except KeyboardInterrupt:  # the children were stopped by run_distributed_demo's finally
        return 130
