"""Running the edge: settings → transport + store → Edge → Starlette app → uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import threading
import time

import uvicorn

from bargein import tracing
from bargein.edge.app import create_app
from bargein.edge.core import Edge
from bargein.edge.phone import carriers_from
from bargein.edge.protocol import AUDIO_FORMATS
from bargein.edge.tokens import Tokens
from bargein.hosting.host import default_owner_id
from bargein.hosting.logs import configure_logging
from bargein.hosting.probes import Probes, readiness
from bargein.settings import (
    DEFAULT_EDGE_SECRET,
    BroadcastSettings,
    BrokerSettings,
    CoreSettings,
    LLMSettings,
    SpeechSettings,
    TelephonySettings,
    VoiceSettings,
    load,
)
from bargein.transport.amqp import AmqpTransport
from bargein.transport.redis_store import RedisStateStore
from bargein.voice.engines import DEFAULT_VOICE, SUGGESTED_VOICES, synthesizer_from_settings

log = logging.getLogger("bargein.edge")

# of BARGEIN_DRAIN_TIMEOUT_S, kept for what comes after the sockets: the edge's own stop and closing
# its broker connection and store (1.5 s measured with a thousand sessions on the 2-core machine)
CLOSE_RESERVE_S = 2.0
MIN_GRACE_S = (
    1  # what the sockets get at least, however short the drain time-out (uvicorn counts whole seconds)
)


async def serve(
    core: CoreSettings,
    broker: BrokerSettings,
    edge_settings: BroadcastSettings,
    speech: SpeechSettings,
    voice: VoiceSettings | None = None,
    telephony: TelephonySettings | None = None,
) -> None:
    voice = voice or VoiceSettings()
    telephony = telephony or load(TelephonySettings)
    synthesizer = synthesizer_from_settings(voice)  # a bad voice or a missing URL fails here
    llm = load(LLMSettings)
    owner = f"edge-{default_owner_id()}"
    if edge_settings.edge_secret == DEFAULT_EDGE_SECRET:
        log.warning("BARGEIN_EDGE_SECRET is the development default: set your own before exposing the edge")
    transport = await AmqpTransport.from_settings(
        core, broker, name=owner, edge_prefetch=edge_settings.edge_prefetch
    )
    store = RedisStateStore.from_settings(broker)
    edge = Edge(
        transport,
        store,
        edge_settings,
        owner=owner,
        max_frame_bytes=speech.max_frame_bytes,
        overload_lag_ms=broker.overload_lag_ms,
        synthesizer=synthesizer,
        voice_settings=voice,
        status_interval_s=broker.status_interval_s,
    )

    ready = readiness(transport, store, lambda: edge.consuming, lambda: edge.overloaded)
    carriers = carriers_from(telephony)
    for name, carrier in carriers.items():
        if carrier.configured:
            log.info("phone calls through %s: POST /v1/%s/voice", name, name)
            if edge_settings.public_url is None:
                log.warning(
                    "%s is configured but BARGEIN_PUBLIC_URL is not: its webhooks' signatures are checked "
                    "against the URL this process sees, which behind a TLS proxy or a load balancer is "
                    "not the one %s signed, and every call is refused (docs/telephony.md)",
                    name,
                    name,
                )

    app = create_app(
        edge,
        Tokens(edge_settings.edge_secret, edge_settings.token_ttl_s),
        public_url=edge_settings.public_url,
        ready=ready,
        max_body_bytes=edge_settings.max_body_bytes,
        about={
            # as this process's environment says (the deployment files give every service the same)
            "llm": {
                "scripted": llm.llm_base_url is None,
                "model": llm.llm_model if llm.llm_base_url else None,
            },
            "tts": voice.tts,
            "voice": voice.tts_voice or DEFAULT_VOICE[voice.tts],
            "voices": list(SUGGESTED_VOICES[voice.tts]),
            "audio": list(AUDIO_FORMATS) if synthesizer is not None else [],
            "phone": sorted(name for name, carrier in carriers.items() if carrier.configured),
        },
        carriers=carriers,
        phone_agent_options=telephony.phone_agent_options,
    )
    # with BARGEIN_PROBE_PORT set, the edge answers there too, as every service does (one HEALTHCHECK)
    probes = Probes(ready, host=broker.probe_host, port=broker.probe_port) if broker.probe_port else None
    config = uvicorn.Config(
        app,
        host=edge_settings.host,
        port=edge_settings.port,
        log_level="warning",
        lifespan="on",
        ws="websockets-sansio",
        # chunks are a few words: compressing each costs the edge (and every client) more CPU than
        # the bytes are worth
        ws_per_message_deflate=False,
    )
    server = _EdgeServer(config, edge, stop_within_s=broker.drain_timeout_s)
    if probes is not None:
        await probes.start()
    _let_uvicorn_hand_back_the_signal()
    task = asyncio.create_task(server.serve())
    try:
        while not server.started and not task.done():  # noqa: ASYNC110 - uvicorn sets a plain flag
            await asyncio.sleep(0.05)
        if server.started:
            gc.collect()
            gc.freeze()  # start-up's objects out of the collector's way: no long pauses mid-call
            host, port = server.servers[0].sockets[0].getsockname()[:2]
            log.info("edge ready on http://%s:%d", host, port)
        await task
    finally:
        if probes is not None:
            await probes.stop()
        with contextlib.suppress(Exception):
            await store.close()
        with contextlib.suppress(Exception):
            await transport.close()
        if synthesizer is not None:
            await synthesizer.aclose()
    log.info("edge stopped")


class _EdgeServer(uvicorn.Server):
    """uvicorn, as it shuts down, closes every open WebSocket with 1012 before the app hears of it;
    the edge first tells its clients why and where to go (``shutting_down``, then 1001, as
    docs/protocol.md says); the page joins again on it, ``bargein call`` says why it stopped."""

    def __init__(self, config: uvicorn.Config, edge: Edge, *, stop_within_s: float) -> None:
        super().__init__(config)
        self.edge = edge
        self.stop_within_s = stop_within_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop within ``BARGEIN_DRAIN_TIMEOUT_S`` of the signal, as a worker does: what requests
        and sockets are still at work then (a thousand callers hanging up at once, each hang-up a
        few broker round trips) is cancelled; the sessions' owners and the caller sweep end what
        was left (docs/operations.md)."""
        deadline = time.monotonic() + self.stop_within_s - CLOSE_RESERVE_S
        try:
            await self.edge.send_clients_away()
        except Exception:  # a failed goodbye must not stop the shutdown: uvicorn closes them anyway
            log.exception("could not tell the clients the edge is stopping")
        self.config.timeout_graceful_shutdown = max(int(deadline - time.monotonic()), MIN_GRACE_S)
        await super().shutdown(sockets)


def _let_uvicorn_hand_back_the_signal() -> None:
    """uvicorn shuts down on SIGTERM or SIGINT, then puts back the handlers it found and raises the
    signal again; with Python's own handlers that ends the process there, before the edge has closed
    its broker connection and store (exit status -15, a KeyboardInterrupt's traceback on Ctrl-C).
    Handlers that only log let ``serve`` finish its tidy-up and the process exit 0, as the other
    services do. uvicorn installs its own in the task's first step, so Ctrl-C still stops a start-up."""

    if threading.current_thread() is not threading.main_thread():
        return  # signals reach the main thread only, and uvicorn leaves them alone too

    def stopped_by(sig: int, frame: object) -> None:
        log.info("edge shut down on %s; closing its connections", signal.Signals(sig).name)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stopped_by)


def main() -> int:
    core = load(CoreSettings)
    broker = load(BrokerSettings)
    edge_settings = load(BroadcastSettings)
    speech = load(SpeechSettings)
    voice = load(VoiceSettings)
    configure_logging(core.log_level, core.log_format)
    tracing.configure(core, service_name="bargein-broadcast")
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    asyncio.run(serve(core, broker, edge_settings, speech, voice))
    return 0
