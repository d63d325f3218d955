"""Start and stop a real ``langgraph dev`` API server for end-to-end tests.

The server is what LangGraph Studio talks to: ``langgraph dev`` (``langgraph-cli[inmem]``)
serving the graphs of a ``langgraph.json``. Tests drive it with ``langgraph_sdk``.

Usage::

    with langgraph_dev(REPO_ROOT / "langgraph.json", workdir=tmp, env={...}) as server:
        client = get_client(url=server.url)
        ...

What :func:`langgraph_dev` guarantees:

* the server runs on a free loopback port, in its own process group
  (``start_new_session=True``), with ``--no-browser --no-reload``;
* it works offline: tracing, the version check and every other phone-home are
  switched off in its environment (checked by running the suite in a network
  namespace that has only loopback);
* its working directory is ``workdir`` (the in-memory runtime writes its
  ``.langgraph_api/`` persistence there, not in the repository), serving a copy
  of the ``langgraph.json`` whose paths are made absolute (``langgraph dev``
  resolves them against its working directory);
* startup is bounded (``GET /ok`` within ``startup_timeout``, default 60 s); a
  server that dies or never answers fails the test with its log;
* on exit the whole process group gets SIGTERM, then SIGKILL after
  ``stop_timeout`` (default 10 s); then the port must be free and no process of
  the group may be left (checked with ``pgrep``);
* everything it prints goes to ``workdir/server.log``
  (:meth:`LangGraphServer.log_text`, :meth:`LangGraphServer.dump_log`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

#: Environment that keeps ``langgraph dev`` (and LangChain inside it) off the network.
OFFLINE_ENV: dict[str, str] = {
    "LANGSMITH_TRACING": "false",
    "LANGSMITH_TRACING_V2": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "LANGCHAIN_TRACING": "false",
    "LANGSMITH_OTEL_ENABLED": "false",
    "LANGGRAPH_NO_VERSION_CHECK": "true",  # skips the PyPI version check thread
    "LANGCHAIN_CALLBACKS_BACKGROUND": "false",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "NO_COLOR": "1",
}
#: Variables removed from the inherited environment: keys and endpoints that would
#: make the server (or a model inside it) talk to a remote service.
SCRUBBED_ENV: tuple[str, ...] = (
    "LANGSMITH_API_KEY",
    "LANGCHAIN_API_KEY",
    "LANGSMITH_ENDPOINT",
    "LANGCHAIN_ENDPOINT",
    "LANGGRAPH_CLOUD_LICENSE_KEY",
    "LANGSMITH_LICENSE_KEY",
    "LANGGRAPH_API_KEY",
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "POSTGRES_URI",
    "DATABASE_URI",
    "REDIS_URI",
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing accepts connections on ``host:port`` and it can be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        if sock.connect_ex((host, port)) == 0:
            return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def group_pids(pgid: int) -> list[int]:
    """Pids still alive in process group ``pgid`` (via ``pgrep -g``)."""
    pgrep = shutil.which("pgrep")
    if pgrep is None:  # pragma: no cover - procps is on every CI image we use
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    out = subprocess.run(
        [pgrep, "-g", str(pgid)], capture_output=True, text=True, timeout=10, check=False
    )
    pids = [int(p) for p in out.stdout.split()]
    # A zombie that we have not reaped yet is not a live process.
    return [p for p in pids if not _is_zombie(p)]


def pids_running(marker: str | os.PathLike[str]) -> list[int]:
    """Live pids whose command line contains ``marker`` (``pgrep -f``, exact text)."""
    pgrep = shutil.which("pgrep")
    if pgrep is None:  # pragma: no cover
        return []
    out = subprocess.run(
        [pgrep, "-f", re.escape(str(marker))],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return [p for p in (int(x) for x in out.stdout.split()) if not _is_zombie(p)]


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def _absolute(spec: str, base: Path) -> str:
    """``./x.py:var`` made absolute against ``base``; a ``pkg.mod:var`` spec is left alone."""
    target, sep, variable = spec.partition(":")
    if not target.endswith(".py") or os.path.isabs(target):
        return spec
    return str((base / target).resolve()) + sep + variable


def _absolute_graphs(data: Mapping[str, Any], base: Path) -> dict[str, Any]:
    graphs: dict[str, Any] = {}
    for name, spec in data.get("graphs", {}).items():
        if isinstance(spec, str):
            graphs[name] = _absolute(spec, base)
        elif isinstance(spec, dict) and isinstance(spec.get("path"), str):
            graphs[name] = {**spec, "path": _absolute(spec["path"], base)}
        else:
            graphs[name] = spec
    return graphs


def _absolute_dependencies(data: Mapping[str, Any], base: Path) -> list[str]:
    out = []
    for dep in data.get("dependencies", ["."]):
        local = dep.startswith((".", "/")) or (base / dep).exists()
        out.append(str((base / dep).resolve()) if local else dep)
    return out


def prepare_config(
    config: str | os.PathLike[str],
    workdir: Path,
    *,
    extra: Sequence[str | os.PathLike[str]] = (),
) -> Path:
    """Copy ``langgraph.json`` into ``workdir`` with every path made absolute.

    ``langgraph dev`` resolves graph files, dependencies and an ``env`` file against
    its working directory. Running it in ``workdir`` (so its ``.langgraph_api/``
    state is private to the test) therefore needs absolute paths.

    Args:
        config: The ``langgraph.json`` served as it is (paths aside).
        workdir: Where the copy is written.
        extra: More ``langgraph.json`` files whose graphs and dependencies are
            added (a graph id already in ``config`` is an error).
    """
    source = Path(config).resolve()
    data: dict[str, Any] = json.loads(source.read_text())
    data["graphs"] = _absolute_graphs(data, source.parent)
    data["dependencies"] = _absolute_dependencies(data, source.parent)
    if isinstance(data.get("env"), str):
        data["env"] = str((source.parent / data["env"]).resolve())
    for more in extra:
        more_path = Path(more).resolve()
        more_data = json.loads(more_path.read_text())
        for name, spec in _absolute_graphs(more_data, more_path.parent).items():
            if name in data["graphs"]:
                raise ValueError(f"graph id {name!r} of {more_path} is already in {source}")
            data["graphs"][name] = spec
        for dep in _absolute_dependencies(more_data, more_path.parent):
            if dep not in data["dependencies"]:
                data["dependencies"].append(dep)
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / "langgraph.json"
    target.write_text(json.dumps(data, indent=2))
    return target


def langgraph_executable() -> list[str]:
    """The ``langgraph`` command of the running interpreter's environment."""
    beside = Path(sys.executable).with_name("langgraph")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("langgraph")
    if found:
        return [found]
    # The CLI module is runnable as a script.
    return [sys.executable, "-c", "from langgraph_cli.cli import cli; cli()"]


def server_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ours, scrubbed of remote keys, offline, plus ``env``."""
    out = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    out.update(OFFLINE_ENV)
    paths = [str(REPO_ROOT)]
    if out.get("PYTHONPATH"):
        paths.append(out["PYTHONPATH"])
    out["PYTHONPATH"] = os.pathsep.join(paths)
    out.update(env or {})
    return out


@dataclass
class LangGraphServer:
    """A running ``langgraph dev``: its URL, process, log and working directory."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    workdir: Path
    config_path: Path
    env: dict[str, str] = field(repr=False)
    started_in: float = 0.0
    stopped_in: float | None = None

    @property
    def pid(self) -> int:
        """The server's pid (also its process-group id)."""
        return self.proc.pid

    def alive(self) -> bool:
        """True while the server process runs."""
        return self.proc.poll() is None

    def log_text(self) -> str:
        """Everything the server printed so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def dump_log(self, header: str = "langgraph dev log", *, tail: int = 400) -> None:
        """Print the last ``tail`` lines of the server log (pytest shows it on failure)."""
        lines = _ANSI.sub("", self.log_text()).splitlines()
        shown = lines[-tail:]
        print(f"\n===== {header} ({self.log_path}, {len(shown)}/{len(lines)} lines) =====")
        print("\n".join(shown))
        print("===== end of log =====")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``timeout`` s; reap the server."""
        t0 = time.monotonic()
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        # Children of the group (none expected) get the same treatment.
        deadline = time.monotonic() + timeout
        while group_pids(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if group_pids(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            time.sleep(0.5)
        self.stopped_in = time.monotonic() - t0


class ServerStartError(RuntimeError):
    """``langgraph dev`` died or did not answer ``/ok`` in time."""


def _wait_ok(server: LangGraphServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        code = server.proc.poll()
        if code is not None:
            raise ServerStartError(f"langgraph dev exited with code {code} before /ok answered")
        try:
            with urllib.request.urlopen(server.url + "/ok", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            last = exc
        time.sleep(0.1)
    raise ServerStartError(f"langgraph dev did not answer /ok within {timeout:.0f}s ({last!r})")


@contextlib.contextmanager
def langgraph_dev(
    config: str | os.PathLike[str],
    *,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    startup_timeout: float = 60.0,
    stop_timeout: float = 10.0,
    port: int | None = None,
    allow_blocking: bool = False,
    extra_configs: Sequence[str | os.PathLike[str]] = (),
) -> Iterator[LangGraphServer]:
    """Run ``langgraph dev`` on loopback for the duration of the ``with`` block.

    Args:
        config: The ``langgraph.json`` to serve (copied into ``workdir`` with
            absolute paths, see :func:`prepare_config`).
        workdir: The server's working directory; holds its log and state.
        env: Extra environment (e.g. ``LANGGRAPH_CANCEL_DB``).
        startup_timeout: Seconds to wait for ``GET /ok``.
        stop_timeout: Seconds between SIGTERM and SIGKILL.
        port: Port to use (default: a free one).
        extra_configs: More ``langgraph.json`` files whose graphs are served too.
        allow_blocking: Pass ``--allow-blocking``: the dev server then does not
            raise ``BlockingError`` on synchronous I/O inside async nodes.

    Yields:
        The running server.

    Raises:
        ServerStartError: The server died or never answered (its log is printed).
        AssertionError: After the block, when the port is still taken or a
            process of the server's group is still alive.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    served = prepare_config(config, workdir, extra=extra_configs)
    port = port or free_port()
    log_path = workdir / "server.log"
    full_env = server_env(env)
    cmd = [
        *langgraph_executable(),
        "dev",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-browser",
        "--no-reload",
        "--config",
        str(served),
        *(["--allow-blocking"] if allow_blocking else []),
    ]
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = LangGraphServer(
        url=f"http://127.0.0.1:{port}",
        port=port,
        proc=proc,
        log_path=log_path,
        workdir=workdir,
        config_path=served,
        env=full_env,
    )
    failed = False
    try:
        try:
            _wait_ok(server, startup_timeout)
        except ServerStartError:
            failed = True
            server.stop(stop_timeout)
            server.dump_log("langgraph dev failed to start")
            raise
        server.started_in = time.monotonic() - t0
        yield server
    except BaseException:
        if not failed:
            failed = True
            server.dump_log("langgraph dev log (the block failed)")
        raise
    finally:
        if server.stopped_in is None:
            server.stop(stop_timeout)
        leftovers = sorted(set(group_pids(server.pid)) | set(pids_running(served)))
        free = port_is_free(port)
        if leftovers or not free:
            if failed:  # never hide the block's own error behind this one
                print(f"langgraph dev: leftover pids {leftovers}, port {port} free: {free}")
            else:
                server.dump_log("langgraph dev did not stop cleanly")
                assert not leftovers, f"langgraph dev left processes behind: {leftovers}"
                assert free, f"port {port} is still taken after langgraph dev stopped"


__all__ = [
    "OFFLINE_ENV",
    "REPO_ROOT",
    "SCRUBBED_ENV",
    "LangGraphServer",
    "ServerStartError",
    "free_port",
    "group_pids",
    "langgraph_dev",
    "pids_running",
    "port_is_free",
    "prepare_config",
    "server_env",
]
