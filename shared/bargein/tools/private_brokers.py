"""A RabbitMQ node (or cluster) and a Redis server (or Sentinel set) of a fault test's or a bench's
own, which it may stop, restart, kill and freeze (the fault tests; ``bargein bench scale --cluster``).

The shared RabbitMQ and Redis of the machine (and of CI) are never touched: each private instance
has its own node name, ports and data directory under the test's temporary folder, and is stopped
when its context ends, whatever happened. Debian's ``rabbitmq-server`` runs the node as the
``rabbitmq`` user when started as root, so its directories are given to that user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

from bargein.tools.benchkit import free_port

# The replication policy docs/operations.md gives operators ("A RabbitMQ cluster"): every queue of
# bargein's kept on two nodes, a copy made at once, the copy promoted whatever happened, the leaders
# spread over the nodes.
MIRRORING_POLICY = (
    '{"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic", '
    '"ha-promote-on-failure": "always", "ha-promote-on-shutdown": "always", '
    '"queue-master-locator": "min-masters"}'
)

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0  # a RabbitMQ node that takes longer to stop is killed
PROBE_TIMEOUT_S = 5.0  # one probe of a server that is starting


def _wait(
    check: subprocess.Popen[bytes] | None,
    probe: list[str],
    timeout: float,
    what: str,
    log: Path | None = None,
) -> None:
    """Until ``probe`` succeeds; at once if the server ``check`` has exited (say its port was
    taken), with the tail of its ``log``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check is not None and check.poll() is not None:
            said = log.read_text(errors="replace")[-2000:] if log is not None else ""
            raise RuntimeError(f"{what} exited with status {check.returncode}:\n{said}")
        with contextlib.suppress(subprocess.TimeoutExpired):  # whoever has the port may never answer
            if subprocess.run(probe, capture_output=True, timeout=PROBE_TIMEOUT_S).returncode == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"{what} did not come up within {timeout:.0f} s")


# Sourced by the node's start script as the ``rabbitmq`` user (after ``su``, which sets the soft
# limit of open files back to 1,024 whatever the caller had). RabbitMQ 3.10's classic queues share
# what that limit allows through its file handle cache; with more queues than handles (every
# session has mailboxes of its own) the cache works through all of them at each queue operation:
# ending sessions on a node limited to 1,024 ran at 3 a second with 2,000 open (docs/operations.md).
OPEN_FILES_ENV = 'ulimit -S -n "$(ulimit -H -n)"\n'


class PrivateRabbit:
    """``with PrivateRabbit(tmp) as rabbit:`` a node at ``rabbit.url``; ``stop_app``/``start_app``
    pause its broker (the Erlang node keeps running, as in a RabbitMQ upgrade), ``restart`` stops
    and starts the whole node (durable queues and exchanges survive)."""

    def __init__(self, base: Path) -> None:
        # The node runs as the rabbitmq user, who cannot reach into pytest's private temp folder:
        # its data lives in a folder of its own under the system's temp dir (logs are linked back).
        self.base = Path(tempfile.mkdtemp(prefix="bargein-fault-rabbitmq-"))
        self.link = base
        self.node = f"bargeinfault{uuid.uuid4().hex[:8]}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_CONFIG_FILE=str(self.base / "rabbitmq.conf"),
            RABBITMQ_MNESIA_BASE=str(self.base / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.base / "log"),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.base / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(self.base / "rabbit.pid"),
            RABBITMQ_CONF_ENV_FILE=str(self.base / "rabbitmq-env.conf"),
        )
        return env

    def _ctl(
        self, *args: str, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["rabbitmqctl", "-n", self.node, *args],
            env=self._env(),
            capture_output=True,
            check=check,
            timeout=timeout,
        )

    def start(self) -> None:
        for sub in ("mnesia", "log"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        (self.base / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{self.port}\n")
        (self.base / "enabled_plugins").write_text("[].\n")
        (self.base / "rabbitmq-env.conf").write_text(OPEN_FILES_ENV)
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("rabbitmq")
            except KeyError:
                pass
            else:
                for path in [self.base, *self.base.rglob("*")]:
                    os.chown(path, user.pw_uid, user.pw_gid)
        subprocess.run(["rabbitmq-server", "-detached"], env=self._env(), check=True, capture_output=True)
        self.await_ready()

    def await_ready(self) -> None:
        probe = ["rabbitmqctl", "-n", self.node, "-q", "await_startup"]
        deadline = time.monotonic() + START_TIMEOUT_S
        while subprocess.run(probe, env=self._env(), capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"RabbitMQ node {self.node} did not start:\n{self.log()[-3000:]}")
            time.sleep(0.3)

    def stop_app(self) -> None:
        self._ctl("stop_app")

    def start_app(self) -> None:
        self._ctl("start_app")
        self.await_ready()

    def restart(self) -> None:
        self._ctl("stop")
        self.boot()

    def kill(self) -> None:
        """SIGKILL the node's Erlang VM, as when its machine dies: no goodbye to its clients or to
        the other nodes of a cluster."""
        pid = self._pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    def freeze(self) -> None:
        """SIGSTOP the node's Erlang VM, as a machine that stalls (a hung disk, a VM paused by its
        host): its sockets stay open and nothing answers; :meth:`thaw` lets it go on."""
        pid = self._pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        pid = self._pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def _pid(self) -> int | None:
        try:
            return int((self.base / "rabbit.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def boot(self) -> None:
        """Start a node that was stopped or killed again, with its data (a cluster member rejoins)."""
        subprocess.run(["rabbitmq-server", "-detached"], env=self._env(), check=True, capture_output=True)
        self.await_ready()

    def join(self, other: PrivateRabbit) -> None:
        """Make this node a member of ``other``'s cluster (its own data is reset)."""
        self._ctl("stop_app")
        self._ctl("reset")
        self._ctl("join_cluster", other.node)
        self.start_app()

    def set_policy(self, name: str, pattern: str, definition: str, apply_to: str = "queues") -> None:
        self._ctl("set_policy", "--apply-to", apply_to, name, pattern, definition)

    def queue_lengths(self) -> dict[str, int]:
        out = self._ctl("list_queues", "-q", "--no-table-headers", "name", "messages").stdout.decode()
        lengths = {}
        for line in out.splitlines():
            name, _, count = line.rpartition("\t")
            if name:
                lengths[name] = int(count)
        return lengths

    def queue_length(self, name: str, attempts: int = 10) -> int:
        """The ready messages in queue ``name``.

        ``list_queues`` silently leaves out a queue whose process is too busy to answer in time,
        which is just when the overload tests look at it: ask again rather than fail.
        """
        for _ in range(attempts):
            lengths = self.queue_lengths()
            if name in lengths:
                return lengths[name]
            time.sleep(0.2)
        raise KeyError(f"rabbitmqctl list_queues did not list {name} in {attempts} tries")

    def queue_bytes(self, name: str) -> int:
        """The bytes of the messages in queue ``name``."""
        out = self._ctl("list_queues", "-q", "--no-table-headers", "name", "message_bytes").stdout.decode()
        for line in out.splitlines():
            queue, _, size = line.rpartition("\t")
            if queue == name:
                return int(size)
        raise KeyError(name)

    def log(self) -> str:
        logs = sorted((self.base / "log").glob("*.log"))
        return "\n".join(p.read_text(errors="replace") for p in logs)

    def stop(self) -> None:
        """Stop the node, and kill it if it will not stop (a cluster member can hang in its stop
        while it hands hundreds of mirrored queues on): no node outlives its test."""
        self.thaw()  # a node a failed test left frozen stops too
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._ctl("stop", check=False, timeout=STOP_TIMEOUT_S)
        self.kill()
        with contextlib.suppress(OSError):
            self.link.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(self.base / "log", self.link, dirs_exist_ok=True)  # keep the logs with the test's
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PrivateRabbit:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PrivateRabbitCluster:
    """``with PrivateRabbitCluster(tmp, 3) as cluster:`` RabbitMQ nodes joined in one cluster, each
    with its own ports, at ``cluster.url`` (every node's address, comma-separated, as
    ``BARGEIN_RABBITMQ_URL`` takes them). ``cluster.nodes[i].kill()`` is a machine lost."""

    def __init__(self, base: Path, size: int = 3) -> None:
        self.nodes = [PrivateRabbit(base / f"node{i}") for i in range(size)]

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes)

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        for node in self.nodes[1:]:
            node.join(self.nodes[0])

    def running(self) -> list[PrivateRabbit]:
        """The members that answer (a killed one does not)."""
        return [n for n in self.nodes if n._ctl("-q", "ping", check=False).returncode == 0]

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()

    def __enter__(self) -> PrivateRabbitCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PrivateRedis:
    """``with PrivateRedis(tmp, aof=False) as redis:`` a server at ``redis.url``; ``restart()``
    stops it and starts it again: empty without persistence, as it was with AOF."""

    def __init__(self, base: Path, *, aof: bool = False, options: tuple[str, ...] = ()) -> None:
        self.base = base
        # chosen as it first starts, not here: a port found free before a RabbitMQ node has booted
        # beside it (seconds of sockets opened) was taken by then, now and again
        self.port = 0
        self.aof = aof
        self.options = options  # more redis-server arguments (``--replicaof`` ...)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it; a restart keeps the port its clients know."""
        self.base.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port()
        command = [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.base),
            "--save",
            "",
            "--appendonly",
            "yes" if self.aof else "no",
            "--appendfsync",
            "always",
            *self.options,
        ]
        log_path = self.base / "redis.log"
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        probe = ["redis-cli", "-p", str(self.port), "ping"]
        _wait(self.proc, probe, START_TIMEOUT_S, f"Redis on {self.port}", log_path)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, as a crashed host: no shutdown, no last write."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> PrivateRedis:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


SENTINEL_SERVICE = "bargein"


class PrivateSentinelRedis:
    """``with PrivateSentinelRedis(tmp) as redis:`` a master, a replica and three Sentinels watching
    them (two must agree the master is down), at ``redis.url`` (``redis+sentinel://`` naming every
    Sentinel); ``fail_over()`` kills the master and waits until the Sentinels have promoted the
    replica, as when the master's host dies in production."""

    SENTINELS = 3
    QUORUM = 2

    def __init__(self, base: Path) -> None:
        self.base = base
        self.master = PrivateRedis(base / "master")
        self.replica = PrivateRedis(base / "replica")
        self.sentinel_ports: list[int] = []  # chosen as they first start, as each server's
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def sentinel_port(self) -> int:
        return self.sentinel_ports[0]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SENTINEL_SERVICE}/0"

    def start(self) -> None:
        self.master.start()
        self.replica.options = ("--replicaof", "127.0.0.1", str(self.master.port))
        self.replica.start()
        _wait(
            None,
            self._cli(self.replica.port, "info", "replication", expect="master_link_status:up"),
            START_TIMEOUT_S,
            "the replica's link to its master",
        )
        if not self.sentinel_ports:
            self.sentinel_ports = [free_port() for _ in range(self.SENTINELS)]
        for i, port in enumerate(self.sentinel_ports):
            config = self.base / f"sentinel-{i}.conf"  # each Sentinel rewrites its own file
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.base}\n"
                f"sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {self.master.port} {self.QUORUM}\n"
                f"sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n"
                f"sentinel failover-timeout {SENTINEL_SERVICE} 10000\n"
            )
            with (self.base / f"sentinel-{i}.log").open("ab") as log:
                self.sentinels.append(
                    subprocess.Popen(
                        [shutil.which("redis-server") or "redis-server", str(config), "--sentinel"],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        for i, (port, sentinel) in enumerate(zip(self.sentinel_ports, self.sentinels, strict=True)):
            log_path = self.base / f"sentinel-{i}.log"
            what = f"Sentinel {i}'s view of the replica"
            probe = self._cli(port, "sentinel", "replicas", SENTINEL_SERVICE, expect=str(self.replica.port))
            _wait(sentinel, probe, START_TIMEOUT_S, what, log_path)
            # and of the other Sentinels: a failover needs QUORUM of them to agree
            listed = f"redis-cli -p {port} sentinel sentinels {SENTINEL_SERVICE} | grep -cx name"
            probe = ["sh", "-c", f"test $({listed}) -ge {self.SENTINELS - 1}"]
            _wait(sentinel, probe, START_TIMEOUT_S, f"Sentinel {i}'s view of the others", log_path)

    @staticmethod
    def _cli(port: int, *command: str, expect: str) -> list[str]:
        """A probe for ``_wait``: succeeds when the command's reply contains ``expect``."""
        quoted = " ".join(command)
        return ["sh", "-c", f"redis-cli -p {port} {quoted} | grep -q -- '{expect}'"]

    def master_port(self) -> int:
        reply = subprocess.run(
            [
                "redis-cli",
                "-p",
                str(self.sentinel_port),
                "sentinel",
                "get-master-addr-by-name",
                SENTINEL_SERVICE,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        return int(reply[1])

    def fail_over(self, timeout: float = 60.0) -> None:
        self.master.kill()
        deadline = time.monotonic() + timeout
        while self.master_port() != self.replica.port:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no failover in {timeout:.0f} s:\n{self.log()[-3000:]}")
            time.sleep(0.2)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.base.glob("sentinel-*.log")))

    def stop(self) -> None:
        for sentinel in self.sentinels:
            if sentinel.poll() is None:
                sentinel.terminate()
                sentinel.wait(10)
        self.sentinels = []
        self.replica.stop()
        self.master.stop()

    def __enter__(self) -> PrivateSentinelRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
