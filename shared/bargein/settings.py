"""Every setting bargein reads, in one place.

All configuration comes from the environment with the ``BARGEIN_`` prefix (see the README's
settings table). :func:`load` turns pydantic's validation error into a :class:`SettingsError` that
names the environment variable, so a bad deployment fails at start-up with a message an operator
can act on instead of a traceback.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
)

from bargein.errors import SettingsError, TurnTakingError

PREFIX = "BARGEIN_"
DEFAULT_EDGE_SECRET = "dev-secret-change-me"  # the edge warns at start-up while this is in use
DEFAULT_MAX_BODY_BYTES = 64 * 1024
# What a caller says to show they are listening, not to take the floor: said while the agent speaks,
# these never cut it off (BARGEIN_BACKCHANNELS; bargein.agent.words matches them).
DEFAULT_BACKCHANNELS = (
    "uh-huh", "uh huh", "mm-hmm", "mm hmm", "mhm", "mm", "mmm", "hm", "hmm", "uh", "um", "ah", "oh",
    "uh-oh",  # what speech-to-text often makes of "uh-huh"; never "uh-uh", "mm-mm" or "nope": they mean no
    "yeah", "yes", "yep", "yup", "okay", "ok", "right", "alright", "all right", "sure",
    "i see", "got it", "cool", "nice", "great",
)  # fmt: skip
# Whisper's initial prompt (BARGEIN_STT_PROMPT): text it takes as said just before the clip, so it
# spells a listener's noises as these words. Without it the tiny model hears eSpeak NG's "Uh-huh."
# as "Uh-uh." (no) and "Mm-hmm." as "and momentum" (docs/speech.md, measured).
DEFAULT_STT_PROMPT = "Uh-huh. Mm-hmm. Okay."


# A folder of files named like the variables (BARGEIN_RABBITMQ_URL, ...), each holding a value: how
# Kubernetes mounts a Secret. Credentials read from files stay out of the process environment, where
# every child process, crash report and `ps e` would see them. A variable set in the environment wins.
SECRETS_DIR_VARIABLE: Final = f"{PREFIX}SECRETS_DIR"


class _Base(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", frozen=True, allow_inf_nan=False)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        directory = os.environ.get(SECRETS_DIR_VARIABLE) or os.environ.get(SECRETS_DIR_VARIABLE.lower())
        if not directory:
            return init_settings, env_settings, dotenv_settings
        if not Path(directory).is_dir():
            raise SettingsError(f"{SECRETS_DIR_VARIABLE}: {directory!r} is not a directory")
        secrets = SecretsSettingsSource(settings_cls, secrets_dir=directory, case_sensitive=False)
        return init_settings, env_settings, dotenv_settings, secrets


class CoreSettings(_Base):
    """Settings shared by the SDK and every service."""

    agent: str = Field(
        default="bargein.examples.default:agent",
        description="The agent to run, as module:attribute.",
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
    )
    max_message_bytes: int = Field(
        default=256 * 1024, ge=1024, le=16 * 1024 * 1024, description="Largest envelope accepted."
    )
    log_level: str = Field(default="INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)$")
    log_format: Literal["auto", "text", "json"] = Field(
        default="auto",
        description="Log lines: json (an object a line), text, or auto: json unless on a terminal.",
    )
    trace_exporter: Literal["none", "console", "otlp"] = Field(
        default="none", description="Where OpenTelemetry spans go: nowhere, stdout, or an OTLP collector."
    )
    otlp_endpoint: str | None = Field(
        default=None, description="OTLP/HTTP traces endpoint (default: the exporter's, localhost:4318)."
    )


class LLMSettings(_Base):
    """Which language model the default agents talk to.

    With no ``llm_base_url`` the agents use the scripted client, so the demo and the tests run with
    nothing else installed.
    """

    llm_base_url: str | None = Field(default=None, description="OpenAI-compatible server, e.g. .../v1")
    llm_api_key: str = Field(default="not-needed", description="API key sent to the LLM server.")
    llm_model: str = Field(default="gpt-4o-mini", min_length=1)
    llm_temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    llm_timeout_s: float = Field(default=30.0, gt=0)
    scripted_first_token_ms: float = Field(default=250.0, ge=0, description="Scripted client latency.")
    scripted_tokens_per_s: float = Field(default=20.0, gt=0, description="Scripted client token rate.")


class BrokerSettings(_Base):
    """Where RabbitMQ and Redis are, and how sessions are owned. Used by every service."""

    rabbitmq_url: str = Field(
        default="amqp://guest:guest@localhost:5672/",
        pattern=r"^amqps?://",
        description="RabbitMQ, or the nodes of a cluster separated by commas, tried in turn.",
    )
    broker_wait_s: float = Field(
        default=15.0, ge=0, le=600, description="How long a publisher waits for RabbitMQ to come back."
    )
    rabbitmq_heartbeat_s: int = Field(
        default=5, ge=1, le=600, description="AMQP heartbeat: a frozen process's connection is dropped soon."
    )
    redis_url: str = Field(
        default="redis://localhost:6379/0",
        pattern=r"^(redis|rediss|unix|redis\+sentinel)://",
        description="A Redis server, or Sentinels: redis+sentinel://[:pw@]host:port,host:port/service[/db].",
    )
    redis_pool_size: int = Field(
        default=64, ge=1, le=10_000, description="Redis connections per process; callers wait for a free one."
    )
    redis_timeout_s: float = Field(
        default=5.0, gt=0, le=60, description="How long a Redis command or a wait for a connection may take."
    )
    lease_ttl_ms: int = Field(default=5_000, ge=500, le=600_000, description="Session lease lifetime.")
    liveness_ttl_ms: int = Field(
        default=1_000, ge=200, le=60_000, description="A worker that stops its heartbeat this long is dead."
    )
    state_ttl_s: int = Field(default=24 * 3600, ge=60, description="How long idle session state is kept.")
    mailbox_expiry_s: int = Field(
        default=3600, ge=10, description="With per-session mailboxes: an unused one is deleted after this."
    )
    max_sessions: int = Field(
        default=500, ge=1, description="With per-session mailboxes: sessions one worker process owns at most."
    )
    adopt_interval_s: float = Field(default=1.0, gt=0, description="How often a worker looks for orphans.")
    status_interval_s: float = Field(
        default=30.0, gt=0, description="How often a service logs its status line (every second at DEBUG)."
    )
    probe_host: str = Field(
        default="127.0.0.1", description="Where a worker serves /healthz, /readyz, /metrics."
    )
    probe_port: int = Field(
        default=0, ge=0, le=65535, description="... and on which port (0: a free one, logged at start-up)."
    )
    audio_mailbox_frames: int = Field(
        default=500, ge=10, description="Audio frames a speech mailbox holds before dropping the oldest."
    )
    overload_lag_ms: float = Field(
        default=500,
        gt=0,
        description="Event-loop lateness beyond which a service is overloaded and takes no new sessions.",
    )
    queue_max_messages: int = Field(
        default=10_000,
        ge=10,
        description="Messages a mailbox or edge queue holds; when full, publishers wait (backpressure).",
    )
    session_idle_s: float = Field(
        default=1800,
        gt=0,
        description="A session with no message for this long is ended (its caller is gone).",
    )
    drain_timeout_s: float = Field(
        default=10.0,
        ge=0,
        description="SIGTERM: how long running turns may finish before hand-over; an edge stops within it.",
    )
    mailboxes: Literal["session", "partitioned"] = Field(
        default="partitioned",
        description="The speech and reasoning tiers' mailboxes: partitions shared by many sessions, or "
        "queues per session (docs/operations.md, 'Partitioned mailboxes'); the same in every process.",
    )
    partitions: int = Field(
        default=16,
        ge=1,
        le=1024,
        description="With partitioned mailboxes: how many per tier (the most workers a tier spreads over).",
    )

    @property
    def partition_count(self) -> int:
        """Partitions a partitioned tier runs with; 0 with a mailbox per session."""
        return self.partitions if self.mailboxes == "partitioned" else 0

    @field_validator("rabbitmq_url")
    @classmethod
    def _brokers(cls, value: str) -> str:
        broker_addresses(value)  # a ValueError here names the setting
        return value

    @field_validator("redis_url")
    @classmethod
    def _sentinels(cls, value: str) -> str:
        if is_sentinel(value):
            SentinelAddress.parse(value)  # a ValueError here names the setting
        return value


class SpeechSettings(_Base):
    """Speech detection and turn-taking. Each can be overridden per session at session start
    (``options["turn_taking"]``, same names without the ``speech_`` prefix where it has one)."""

    speech_threshold: float = Field(
        default=0.5, gt=0, lt=1, description="VAD probability that counts as speech."
    )
    min_interruption_ms: float = Field(
        default=250, ge=0, description="Speech needed before a barge-in counts."
    )
    min_silence_ms: float = Field(
        default=500, ge=32, description="Silence that ends the user's turn (the text judge: when unsure)."
    )
    turn_detector: Literal["auto", "silence", "text", "smart-turn"] = Field(
        default="auto",
        description="What ends the caller's turn: silence, text (its words), smart-turn (an acoustic model).",
    )
    end_silence_ms: float = Field(
        default=250, ge=32, description="text: silence that ends a turn whose words read finished."
    )
    max_silence_ms: float = Field(
        default=2000,
        ge=32,
        le=10_000,
        description="text: silence that ends a turn whose words read unfinished.",
    )
    speculative_turns: bool = Field(
        default=True,
        description="text: start the answer when the caller pauses, held until the turn is confirmed.",
    )
    false_interruption_timeout_ms: float = Field(
        default=1500, ge=0, description="A burst ending this soon with no transcript is a false interruption."
    )
    interrupt_words: int = Field(
        default=1,
        ge=0,
        le=20,
        description="While the agent speaks, words besides backchannels that cut it off (0: timing alone).",
    )
    max_backchannel_ms: float = Field(
        default=1500,
        ge=0,
        description="While the agent speaks, speech this long cuts it off whatever its words.",
    )
    backchannels: Annotated[tuple[str, ...], NoDecode] = Field(
        default=DEFAULT_BACKCHANNELS,
        description="Words and phrases that never cut the agent off (comma-separated).",
    )
    soft_pause_ms: float = Field(
        default=32,
        ge=0,
        description="While the agent speaks, speech this long pauses its audio (0: no soft barge-in).",
    )
    max_frame_bytes: int = Field(default=64_000, ge=2, description="Largest audio frame accepted (2 s).")
    vad_tick_ms: float = Field(default=8, gt=0, description="How often the batched VAD runs.")
    vad_max_batch: int = Field(default=256, ge=1, description="Sessions per inference call at most.")

    @field_validator("backchannels", mode="before")
    @classmethod
    def _phrases(cls, value: Any) -> Any:
        return split_phrases(value) if isinstance(value, str) else value


class TranscriptionSettings(_Base):
    """Speech-to-text in the speech tier (one engine per process, shared by its sessions)."""

    stt: Literal["auto", "none", "whisper", "openai"] = Field(
        default="auto",
        description="Speech-to-text: whisper (CPU), openai (a server), none; auto: whisper if installed.",
    )
    stt_model: str | None = Field(
        default=None,
        description="A CTranslate2 Whisper model directory; default: the bundled tiny.en (bargein[stt]).",
    )
    stt_prompt: str = Field(
        default=DEFAULT_STT_PROMPT,
        max_length=500,
        description="Text the engine takes as said before each clip (Whisper's prompt): how backchannels "
        "are spelled, names; empty: none.",
    )
    stt_threads: int = Field(default=1, ge=1, le=64, description="CPU threads per transcription.")
    stt_workers: int = Field(default=2, ge=1, le=64, description="Transcriptions run at once, at most.")
    stt_timeout_s: float = Field(default=10.0, gt=0, description="A transcription taking longer is given up.")
    stt_window_s: float = Field(
        default=10.0,
        ge=1,
        le=30,
        description="whisper: seconds of audio a short clip is read in (Whisper's own window is 30 s; "
        "a shorter one costs less in proportion; 30: always the whole window).",
    )
    stt_base_url: str | None = Field(
        default=None, description="openai: the server's API root, e.g. http://gpu-box:8000/v1."
    )
    stt_api_key: str = Field(
        default="not-needed", description="openai: the API key, if the server wants one."
    )
    stt_openai_model: str = Field(default="whisper-1", description="openai: the model name the server knows.")
    stt_language: str = Field(
        default="en", description="openai: the language hint (empty: let the server detect)."
    )


class VoiceSettings(_Base):
    """The agent's voice: speech synthesis in the client edge (one engine per process)."""

    tts: Literal["espeak", "openai", "none"] = Field(
        default="espeak",
        description="Speech synthesis: espeak (embedded), openai (a server), none (text only).",
    )
    tts_voice: str | None = Field(
        default=None,
        description="The voice (espeak: en-us, en, fr, ...; openai: alloy, ...); a session may pick its own.",
    )
    tts_rate: int = Field(default=175, ge=80, le=450, description="espeak: words a minute.")
    tts_base_url: str | None = Field(
        default=None, description="openai: the server's API root, e.g. http://gpu-box:8000/v1."
    )
    tts_api_key: str = Field(
        default="not-needed", description="openai: the API key, if the server wants one."
    )
    tts_openai_model: str = Field(default="tts-1", description="openai: the model name the server knows.")
    tts_sample_rate: int = Field(
        default=24_000, ge=8_000, le=48_000, description="openai: the rate of the server's raw PCM."
    )
    tts_workers: int = Field(default=4, ge=1, le=256, description="openai: requests at once, at most.")
    tts_timeout_s: float = Field(
        default=10.0, gt=0, description="openai: a phrase taking longer is given up."
    )
    audio_lead_ms: float = Field(
        default=200,
        ge=20,
        le=5_000,
        description="Audio sent ahead of real time (what a clear still lets play).",
    )
    soft_pause_max_s: float = Field(
        default=3.0, gt=0, le=60, description="A soft pause no verdict ends by then resumes on its own."
    )
    phrase_min_words: int = Field(
        default=4, ge=1, le=100, description="A clause boundary ends a phrase of at least this many words."
    )
    phrase_max_words: int = Field(
        default=12, ge=1, le=200, description="A phrase is spoken at this many words, punctuated or not."
    )
    phrase_max_wait_ms: float = Field(
        default=200,
        ge=0,
        le=10_000,
        description="With nothing left to play, a phrase's words waiting this long are spoken.",
    )


class BroadcastSettings(_Base):
    """The client edge (``bargein broadcast``)."""

    edge_secret: str = Field(
        default=DEFAULT_EDGE_SECRET, min_length=8, description="HMAC key for session tokens (set it!)."
    )
    host: str = Field(default="127.0.0.1", description="Address the edge listens on.")
    port: int = Field(default=8080, ge=0, le=65535)
    public_url: str | None = Field(
        default=None, description="Base URL clients reach the edge at (for ws_url); default from the request."
    )
    token_ttl_s: int = Field(default=3600, ge=10, description="How long a session token is valid.")
    send_buffer: int = Field(default=256, ge=8, description="Frames queued per connection before it is cut.")
    report_interval_ms: float = Field(
        default=200,
        ge=0,
        description="How often delivery is reported back while the agent streams (a cut turn, and what "
        "was heard before a caller's message, are reported at once).",
    )
    max_body_bytes: int = Field(
        default=DEFAULT_MAX_BODY_BYTES, ge=1024, le=16 * 1024 * 1024, description="Largest HTTP request body."
    )
    edge_prefetch: int = Field(
        default=200, ge=1, le=10_000, description="Chunks the edge takes from RabbitMQ ahead of handling."
    )
    overload_backlog: int = Field(
        default=2_000,
        ge=1,
        description="Chunks waiting for this edge beyond which it is overloaded (not ready).",
    )
    client_messages_per_s: float = Field(
        default=10, gt=0, description="Texts, stops and hang-ups one connection may send per second..."
    )
    client_burst: int = Field(
        default=40, ge=1, description="... and at once; more are refused (rate_limited)."
    )
    client_audio_realtime: float = Field(
        default=2.0, ge=1, description="Audio one connection may send, as a multiple of real time."
    )
    resend_wait_ms: float = Field(
        default=1000,
        ge=0,
        le=60_000,
        description="How long an answer's chunks that came after a lost one wait for it (the edge asks "
        "the owner for it again) before the caller hears them without it.",
    )
    reconnect_grace_s: float = Field(
        default=60.0,
        gt=0,
        le=24 * 3600,
        description="A session whose caller left without `end` (or never joined) ends after this long "
        "with no caller connected to any edge.",
    )


# --- per-session turn-taking -----------------------------------------------------------------------

TURN_TAKING_OPTION = "turn_taking"  # the session option (POST /v1/sessions) that overrides them
TURN_TAKING_FIELDS = (
    "speech_threshold",
    "min_interruption_ms",
    "min_silence_ms",
    "turn_detector",
    "end_silence_ms",
    "max_silence_ms",
    "speculative_turns",
    "false_interruption_timeout_ms",
    "interrupt_words",
    "max_backchannel_ms",
    "backchannels",
    "soft_pause_ms",
)
TURN_TAKING_ALIASES = {"threshold": "speech_threshold"}

# Built from SpeechSettings' own fields, so a session's bounds and defaults are the environment's;
# strict (JSON numbers only: no strings, no booleans) and finite.
# A session gives its backchannels as a JSON list of strings.
_SESSION_TYPES: dict[str, Any] = {"backchannels": tuple[str, ...]}
_FIELDS: dict[str, Any] = {
    name: (
        _SESSION_TYPES.get(name, SpeechSettings.model_fields[name].annotation),
        SpeechSettings.model_fields[name],
    )
    for name in TURN_TAKING_FIELDS
}
_TurnTaking: type[BaseModel] = create_model(
    "TurnTaking",
    __config__=ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False),
    **_FIELDS,
)


class TelephonySettings(_Base):
    """Phone calls through carriers' media streams, in the edge (docs/telephony.md). A carrier
    whose credentials are unset refuses every call: a webhook nobody can verify is not answered."""

    twilio_account_sid: str | None = Field(default=None, description="Twilio account SID (AC...).")
    twilio_auth_token: str | None = Field(
        default=None, description="Twilio auth token: checks X-Twilio-Signature; places calls."
    )
    twilio_api_url: str = Field(
        default="https://api.twilio.com", pattern=r"^https?://", description="Twilio's REST API."
    )
    telnyx_api_key: str | None = Field(default=None, description="Telnyx API key (places calls).")
    telnyx_public_key: str | None = Field(
        default=None, description="Telnyx's webhook public key (base64 Ed25519), from the portal."
    )
    telnyx_connection_id: str | None = Field(
        default=None, description="The TeXML application whose number places outbound calls."
    )
    telnyx_api_url: str = Field(
        default="https://api.telnyx.com", pattern=r"^https?://", description="Telnyx's REST API."
    )
    phone_agent_options: Annotated[dict[str, Any], NoDecode] = Field(
        default_factory=dict, description="Agent options of phone calls, as JSON (a webhook's query adds)."
    )
    phone_signature_max_age_s: float = Field(
        default=300.0, gt=0, le=3600, description="How old a signed webhook may be (Telnyx's timestamp)."
    )
    phone_stream_wait_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="A call answered by the voice webhook whose media stream has not started after this "
        "long is over (the caller hung up while it rang, or the stream URL is wrong).",
    )

    @field_validator("phone_agent_options", mode="before")
    @classmethod
    def _options(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value or "{}")
            except json.JSONDecodeError as exc:
                raise ValueError(f"not JSON: {exc}") from None
            if not isinstance(value, dict):
                raise ValueError("must be a JSON object")
        return value


def split_phrases(text: str) -> tuple[str, ...]:
    """``"uh-huh, Yeah ,got it"`` → ``("uh-huh", "yeah", "got it")``: how BARGEIN_BACKCHANNELS is read."""
    return tuple(p.strip().lower() for p in text.split(",") if p.strip())


def turn_taking_defaults() -> dict[str, Any]:
    return {name: SpeechSettings.model_fields[name].default for name in TURN_TAKING_FIELDS}


def check_turn_taking(overrides: Any) -> dict[str, Any]:
    """A session's ``turn_taking`` options as (setting name → value), checked with the bounds of the
    ``BARGEIN_`` variables themselves; :class:`TurnTakingError` naming every problem otherwise."""
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        kind = type(overrides).__name__
        raise TurnTakingError(
            f"options.{TURN_TAKING_OPTION} must be a mapping of setting → value, got {kind}"
        )
    problems: list[str] = []
    values: dict[str, Any] = {}
    for key, value in overrides.items():
        name = TURN_TAKING_ALIASES.get(str(key), str(key))
        if name in values:
            problems.append(f"{key}: given twice (as {name} and an alias)")
        elif name not in TURN_TAKING_FIELDS:
            known = ", ".join(TURN_TAKING_FIELDS)
            where = "a process setting" if name in SpeechSettings.model_fields else "not a setting"
            problems.append(f"{key}: {where}; a session may set {known}")
        else:
            values[name] = value
    if not problems:
        try:
            phrases = values.get("backchannels")
            if isinstance(phrases, list):  # JSON has no tuples; strict validation wants one
                values["backchannels"] = tuple(phrases)
            checked = _TurnTaking.model_validate({**turn_taking_defaults(), **values})
        except ValidationError as exc:
            for err in exc.errors():
                field = ".".join(str(p) for p in err["loc"])
                problems.append(f"{field}: {err['msg']} (got {err.get('input')!r})")
        else:
            return {name: getattr(checked, name) for name in values}
    raise TurnTakingError(f"invalid options.{TURN_TAKING_OPTION}: " + "; ".join(problems))


_S = TypeVar("_S", bound=BaseSettings)


def load(cls: type[_S], **overrides: Any) -> _S:
    """Build ``cls`` from the environment, naming the offending variable on error."""
    try:
        return cls(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else "?"
            got = err.get("input")
            problems.append(f"{PREFIX}{field.upper()}: {err['msg']} (got {got!r})")
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None


def all_variables() -> set[str]:
    """Every ``BARGEIN_*`` variable bargein reads (the deployment files are checked against it)."""
    classes: list[type[BaseSettings]] = [
        CoreSettings,
        LLMSettings,
        BrokerSettings,
        SpeechSettings,
        TranscriptionSettings,
        VoiceSettings,
        BroadcastSettings,
        TelephonySettings,
    ]
    fields = {f"{PREFIX}{name.upper()}" for cls in classes for name in cls.model_fields}
    return fields | {SECRETS_DIR_VARIABLE}


# --- RabbitMQ: one node, or a cluster's nodes tried in turn (transport/amqp_address.py) ------------

AMQP_SCHEMES: Final = ("amqp", "amqps")


def broker_addresses(url: str) -> tuple[str, ...]:
    """The addresses of a ``BARGEIN_RABBITMQ_URL`` (comma-separated), in order; a ``ValueError``
    says what is wrong with which."""
    addresses = tuple(part.strip() for part in url.split(","))
    if any(not part for part in addresses):
        raise ValueError(f"{url!r}: an empty address in the list (two commas, or one at an end)")
    for address in addresses:
        parts = urlsplit(address)
        if parts.scheme not in AMQP_SCHEMES or not parts.hostname:
            raise ValueError(f"{address!r} is not an amqp:// or amqps:// URL with a host")
    return addresses


# --- Redis behind Sentinel: the one URL form redis-py does not parse itself ----------------------

SENTINEL_SCHEME: Final = "redis+sentinel"
SENTINEL_PORT: Final = 26379


@dataclass(frozen=True)
class SentinelAddress:
    """A parsed ``redis+sentinel://`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    password: str | None = None
    sentinel_password: str | None = None

    @classmethod
    def parse(cls, url: str) -> SentinelAddress:
        parts = urlsplit(url)
        if parts.scheme != SENTINEL_SCHEME:
            raise ValueError(f"not a {SENTINEL_SCHEME}:// URL: {url!r}")
        credentials, _, hosts = parts.netloc.rpartition("@")
        password = unquote(credentials.partition(":")[2]) if credentials else None
        sentinels = tuple(_host_port(host, url) for host in hosts.split(",") if host)
        if not sentinels:
            raise ValueError(f"{url!r} names no Sentinel")
        path = [p for p in parts.path.split("/") if p]
        if not path or len(path) > 2:
            raise ValueError(f"{url!r} must name the monitored service: .../service[/db]")
        try:
            db = int(path[1]) if len(path) == 2 else 0
        except ValueError:
            raise ValueError(f"{url!r}: the database must be a number, got {path[1]!r}") from None
        query = parse_qs(parts.query)
        unknown = set(query) - {"sentinel_password"}
        if unknown:
            raise ValueError(f"{url!r}: unknown options {sorted(unknown)}")
        sentinel_password = query.get("sentinel_password", [None])[0]
        return cls(sentinels, unquote(path[0]), db, password or None, sentinel_password)


def _host_port(text: str, url: str) -> tuple[str, int]:
    host, port = text, SENTINEL_PORT
    if text.startswith("["):  # [::1]:26379
        host, _, rest = text[1:].partition("]")
        if rest:
            port = _port(rest.removeprefix(":"), url)
    elif ":" in text:
        host, _, number = text.rpartition(":")
        port = _port(number, url)
    if not host:
        raise ValueError(f"{url!r}: a Sentinel without a host")
    return host, port


def _port(text: str, url: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{url!r}: bad port {text!r}")
    return int(text)


def is_sentinel(url: str) -> bool:
    return url.startswith(f"{SENTINEL_SCHEME}://")
