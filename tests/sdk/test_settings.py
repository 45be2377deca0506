"""Settings from ``BARGEIN_*`` variables, the agent loader, and the CLI's exit code on bad settings:
a bad deployment fails at start-up with a SettingsError naming the variable and the value."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bargein.errors import BargeinError, SettingsError
from bargein.hosting.loader import load_agent
from bargein.settings import BroadcastSettings, BrokerSettings, CoreSettings, LLMSettings, load

pytestmark = pytest.mark.timeout(90)

REPO = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 20.0  # a healthy failure takes well under a second; this only bounds a hang


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts from an environment without BARGEIN_* variables."""
    for name in list(os.environ):
        if name.upper().startswith("BARGEIN_"):
            monkeypatch.delenv(name)
    yield


# --------------------------------------------------------------------------------------------------
# settings


def test_defaults_load_from_an_empty_environment() -> None:
    core = load(CoreSettings)
    assert core.agent == "bargein.examples.default:agent"
    assert core.max_message_bytes == 256 * 1024
    assert core.log_level == "INFO"
    llm = load(LLMSettings)
    assert llm.llm_base_url is None
    assert llm.llm_temperature == 0.7


def test_good_values_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BARGEIN_MAX_MESSAGE_BYTES", "2048")
    monkeypatch.setenv("BARGEIN_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("BARGEIN_AGENT", "my_pkg.agents:build_agent")
    monkeypatch.setenv("BARGEIN_LLM_TEMPERATURE", "1.5")
    monkeypatch.setenv("BARGEIN_LLM_BASE_URL", "http://localhost:11434/v1")
    monkeypatch.setenv("BARGEIN_LLM_MODEL", "llama3")
    monkeypatch.setenv("BARGEIN_SCRIPTED_TOKENS_PER_S", "100")
    core = load(CoreSettings)
    assert (core.max_message_bytes, core.log_level, core.agent) == (
        2048,
        "DEBUG",
        "my_pkg.agents:build_agent",
    )
    llm = load(LLMSettings)
    assert llm.llm_temperature == 1.5
    assert llm.llm_base_url == "http://localhost:11434/v1"
    assert llm.llm_model == "llama3"
    assert llm.scripted_tokens_per_s == 100.0


def test_mailboxes_are_partitioned_unless_asked_for_per_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BARGEIN_MAILBOXES", raising=False)
    monkeypatch.delenv("BARGEIN_PARTITIONS", raising=False)
    assert load(BrokerSettings).partition_count == 16
    monkeypatch.setenv("BARGEIN_PARTITIONS", "32")
    assert load(BrokerSettings).partition_count == 32
    monkeypatch.setenv("BARGEIN_MAILBOXES", "session")
    assert load(BrokerSettings).partition_count == 0


@pytest.mark.parametrize(
    ("var", "value", "cls"),
    [
        ("BARGEIN_MAX_MESSAGE_BYTES", "abc", CoreSettings),
        ("BARGEIN_MAX_MESSAGE_BYTES", "1023", CoreSettings),
        ("BARGEIN_MAX_MESSAGE_BYTES", "99999999999", CoreSettings),
        ("BARGEIN_MAX_MESSAGE_BYTES", "2.5k", CoreSettings),
        ("BARGEIN_AGENT", "not a spec", CoreSettings),
        ("BARGEIN_AGENT", "module_without_attr", CoreSettings),
        ("BARGEIN_AGENT", "mod:attr:extra", CoreSettings),
        ("BARGEIN_LOG_LEVEL", "LOUD", CoreSettings),
        ("BARGEIN_LLM_TEMPERATURE", "9", LLMSettings),
        ("BARGEIN_LLM_TEMPERATURE", "-0.1", LLMSettings),
        ("BARGEIN_LLM_TEMPERATURE", "warm", LLMSettings),
        ("BARGEIN_LLM_TIMEOUT_S", "0", LLMSettings),
        ("BARGEIN_LLM_MODEL", "", LLMSettings),
        ("BARGEIN_SCRIPTED_TOKENS_PER_S", "0", LLMSettings),
        ("BARGEIN_SCRIPTED_FIRST_TOKEN_MS", "-5", LLMSettings),
        ("BARGEIN_MAILBOXES", "per-call", BrokerSettings),
        ("BARGEIN_PARTITIONS", "0", BrokerSettings),
        ("BARGEIN_PARTITIONS", "5000", BrokerSettings),
    ],
)
def test_bad_value_raises_settings_error_naming_variable_and_value(
    monkeypatch: pytest.MonkeyPatch,
    var: str,
    value: str,
    cls: type[CoreSettings] | type[LLMSettings] | type[BrokerSettings],
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as info:
        load(cls)
    message = str(info.value)
    assert var in message
    assert repr(value) in message
    assert isinstance(info.value, BargeinError)
    assert info.value.__cause__ is None  # no pydantic traceback chained onto an operator's error


def test_lowercase_variable_names_are_read_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("bargein_llm_temperature", "9")
    with pytest.raises(SettingsError, match="BARGEIN_LLM_TEMPERATURE"):
        load(LLMSettings)


def test_every_bad_variable_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BARGEIN_MAX_MESSAGE_BYTES", "abc")
    monkeypatch.setenv("BARGEIN_AGENT", "not a spec")
    monkeypatch.setenv("BARGEIN_LOG_LEVEL", "LOUD")
    with pytest.raises(SettingsError) as info:
        load(CoreSettings)
    message = str(info.value)
    for var, value in (
        ("BARGEIN_MAX_MESSAGE_BYTES", "abc"),
        ("BARGEIN_AGENT", "not a spec"),
        ("BARGEIN_LOG_LEVEL", "LOUD"),
    ):
        assert var in message and repr(value) in message


def test_an_unrelated_bad_variable_does_not_break_the_other_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BARGEIN_LLM_TEMPERATURE", "9")
    assert load(CoreSettings).max_message_bytes == 256 * 1024
    monkeypatch.setenv("BARGEIN_NOT_A_SETTING", "whatever")
    with pytest.raises(SettingsError, match="BARGEIN_LLM_TEMPERATURE"):
        load(LLMSettings)


def test_overrides_are_validated_too() -> None:
    with pytest.raises(SettingsError, match="BARGEIN_LLM_TEMPERATURE"):
        load(LLMSettings, llm_temperature=9)
    assert load(LLMSettings, llm_temperature=0.0).llm_temperature == 0.0


# --------------------------------------------------------------------------------------------------
# the agent loader


def test_load_agent_good_spec_returns_a_callable() -> None:
    agent = load_agent("bargein.examples.default:agent")
    assert callable(agent)
    from bargein.examples.default import agent as expected

    assert agent is expected


def test_load_agent_takes_the_examples_by_their_old_name(caplog: pytest.LogCaptureFixture) -> None:
    from bargein.examples.seed import stateful

    assert load_agent("services.reasoning.agents.seed:stateful") is stateful
    assert "is now bargein.examples.seed" in caplog.text


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("no_such_module_bargein_test:agent", "cannot import 'no_such_module_bargein_test'"),
        ("bargein.examples.nope:agent", "cannot import 'bargein.examples.nope'"),
        ("bargein.examples.default:no_such_attr", "no callable 'no_such_attr'"),
        ("bargein.examples.default:SYSTEM_PROMPT", "no callable 'SYSTEM_PROMPT'"),
        ("bargein.examples.default", "must look like module:attribute"),
        ("bargein.examples.default:", "must look like module:attribute"),
        (":agent", "must look like module:attribute"),
        ("", "must look like module:attribute"),
        (".relative.module:agent", ".relative.module"),
        ("..up:agent", "..up"),
    ],
)
def test_load_agent_bad_spec_raises_settings_error(spec: str, fragment: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_agent(spec)
    message = str(info.value)
    assert "BARGEIN_AGENT" in message
    assert fragment in message


# --------------------------------------------------------------------------------------------------
# the CLI


def run_cli(*args: str, **env_overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("BARGEIN_")}
    env.update(env_overrides)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO / "shared"), str(REPO), env.get("PYTHONPATH")])
    )
    return subprocess.run(
        [sys.executable, "-m", "bargein.tools.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def test_cli_demo_with_an_unimportable_agent_exits_2_naming_bargein_agent() -> None:
    proc = run_cli("demo", BARGEIN_AGENT="nope:x")
    assert proc.returncode == 2, proc.stderr
    assert "BARGEIN_AGENT" in proc.stderr
    assert "'nope'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_demo_with_a_malformed_setting_exits_2_naming_it() -> None:
    proc = run_cli("demo", BARGEIN_MAX_MESSAGE_BYTES="abc")
    assert proc.returncode == 2, proc.stderr
    assert "BARGEIN_MAX_MESSAGE_BYTES" in proc.stderr and "'abc'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_demo_with_a_relative_agent_flag_exits_2() -> None:
    proc = run_cli("demo", "--agent", ".relative:agent")
    assert proc.returncode == 2, proc.stderr
    assert "BARGEIN_AGENT" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_demo_with_a_bad_llm_setting_exits_2_at_start_up() -> None:
    """The default agent's LLM settings are part of the deployment: a bad one must stop the demo at
    start-up with exit code 2, not fail inside the first turn (where the runtime only counts it)."""
    try:
        proc = run_cli("demo", BARGEIN_LLM_TEMPERATURE="9")
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"`bargein demo` did not exit within {CLI_TIMEOUT_S}s with a bad LLM setting: {exc}")
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "BARGEIN_LLM_TEMPERATURE" in proc.stderr
    assert "'9'" in proc.stderr
    assert "Traceback" not in proc.stderr


def _kubernetes_secret_volume(root: Path, values: dict[str, str]) -> Path:
    """A folder laid out as the kubelet mounts a Secret: each key a link into a dated folder."""
    dated = root / "..2026_12_01_00_00_00.000000001"
    dated.mkdir(parents=True)
    for key, value in values.items():
        (dated / key).write_text(value + "\n")
    (root / "..data").symlink_to(dated.name)
    for key in values:
        (root / key).symlink_to(f"..data/{key}")
    return root


def test_credentials_are_read_from_a_mounted_secret_and_the_environment_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secrets = _kubernetes_secret_volume(
        tmp_path / "secrets",
        {
            "BARGEIN_RABBITMQ_URL": "amqp://app:s3cret@rabbitmq:5672/",
            "BARGEIN_REDIS_URL": "redis+sentinel://:pw@redis-0.redis:26379/bargein/0",
            "BARGEIN_EDGE_SECRET": "a-long-random-key",
        },
    )
    monkeypatch.setenv("BARGEIN_SECRETS_DIR", str(secrets))
    broker = load(BrokerSettings)
    assert broker.rabbitmq_url == "amqp://app:s3cret@rabbitmq:5672/"  # the file's newline is dropped
    assert broker.redis_url.startswith("redis+sentinel://")
    assert load(BroadcastSettings).edge_secret == "a-long-random-key"
    monkeypatch.setenv("BARGEIN_RABBITMQ_URL", "amqp://other@elsewhere:5672/")
    assert load(BrokerSettings).rabbitmq_url == "amqp://other@elsewhere:5672/"


def test_a_bad_value_in_a_secret_file_is_named_like_a_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secrets = _kubernetes_secret_volume(tmp_path / "secrets", {"BARGEIN_REDIS_URL": "http://nope"})
    monkeypatch.setenv("BARGEIN_SECRETS_DIR", str(secrets))
    with pytest.raises(SettingsError, match="BARGEIN_REDIS_URL"):
        load(BrokerSettings)


def test_a_secrets_dir_that_is_not_there_is_an_error_not_a_silent_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BARGEIN_SECRETS_DIR", str(tmp_path / "missing"))
    with pytest.raises(SettingsError, match="BARGEIN_SECRETS_DIR"):
        load(BrokerSettings)
