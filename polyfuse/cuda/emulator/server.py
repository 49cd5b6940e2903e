"""The emulator's server process: it loads kernel libraries and runs each request in a forked
child, so a crashing kernel cannot take the caller down. One server per executable, shared by
the emulators of this process, started on first use and stopped at exit."""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import select
import signal
import socket
import subprocess
import threading
from pathlib import Path

import numpy as np

from polyfuse.base.errors import EmulatorError

from .wire import MSG, MSG_LOAD, MSG_MAP, MSG_RUN


class ServerDied(Exception):
    """The server's socket closed or failed (internal: turned into EmulatorError by _guard)."""


class Server:
    """One emulator server process: loads kernel libraries, forks a child per run.

    Shared by every :class:`Emulator` of this process that uses the same server executable;
    ``lock`` serialises its use (one run at a time, in the shared region).
    """

    def __init__(self, exe: Path):
        self.exe = exe
        self.lock = threading.RLock()
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.libraries: list[Path] = []  # loaded, in module-id order
        self.loaded: dict[Path, tuple[int, str]] = {}
        self.shm: mmap.mmap | None = None
        self.shm_view: np.ndarray | None = None
        self.shm_fd = -1

    # ---- process management
    @contextlib.contextmanager
    def _guard(self, doing: str):
        """Turn a dead server into a one-line :class:`EmulatorError`; the next call restarts it."""
        try:
            yield
        except ServerDied:
            proc = self.proc
            how = "stopped answering"
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=2.0)
                code = proc.returncode
                if code is not None and code < 0:
                    try:
                        how = f"was killed by {signal.Signals(-code).name}"
                    except ValueError:
                        how = f"was killed by signal {-code}"
                elif code is not None:
                    how = f"exited with status {code}"
            pid = f" (pid {proc.pid})" if proc is not None else ""
            self.stop()
            raise EmulatorError(
                f"emulator: the emulator server process{pid} {how} while {doing}; the next call "
                "starts a new one (if it keeps dying, check memory limits and stderr)"
            ) from None

    def _start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [str(self.exe), str(child.fileno())],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
            )
        finally:
            child.close()
        self.sock = parent
        for path in self.libraries:
            self._load(path)
        if self.shm is not None:
            self._map()

    def ensure(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            with self._guard("starting (reloading its kernel libraries)"):
                self._start()

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def close(self) -> None:
        self.stop()
        self.shm_view = None
        self.shm = None
        if self.shm_fd >= 0:
            os.close(self.shm_fd)
            self.shm_fd = -1

    # ---- messages
    def _send(self, kind: int, a: int = 0, b: int = 0, text: bytes = b"", fds=()) -> None:
        assert self.sock is not None
        msg = MSG.pack(kind, 0, a, b) + text
        try:
            if fds:
                socket.send_fds(self.sock, [msg], list(fds))
            else:
                self.sock.sendall(msg)
        except OSError as e:
            raise ServerDied(str(e)) from e

    def _recv(self, timeout: float | None = None) -> tuple[int, int, int, bytes] | None:
        assert self.sock is not None
        if timeout is not None:
            ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
            if not ready:
                return None
        try:
            data = self.sock.recv(1 << 20)
        except OSError as e:
            raise ServerDied(str(e)) from e
        if len(data) < MSG.size:
            raise ServerDied("the emulator server exited")
        kind, _, a, b = MSG.unpack_from(data)
        return kind, a, b, data[MSG.size :]

    def _load(self, path: Path) -> tuple[int, str]:
        self._send(MSG_LOAD, text=str(path).encode())
        reply = self._recv()
        assert reply is not None
        _, a, _, text = reply
        if a < 0:
            raise EmulatorError(
                f"emulator: cannot load {path.name}: {text.decode(errors='replace')}"
            )
        return a, text.decode()

    def load(self, path: Path) -> tuple[int, str]:
        """Load a kernel library; returns its module id and "name signature" lines."""
        with self.lock:
            if path in self.loaded:
                return self.loaded[path]
            self.ensure()
            try:
                mid, text = self._load(path)
            except ServerDied:
                self.stop()
                self.ensure()
                with self._guard(f"loading {path.name}"):
                    mid, text = self._load(path)
            self.libraries.append(path)
            self.loaded[path] = (mid, text)
            return mid, text

    def _map(self) -> None:
        assert self.shm is not None
        self._send(MSG_MAP, len(self.shm), fds=[self.shm_fd])
        reply = self._recv()
        if reply is None or reply[1] != 0:
            raise EmulatorError("emulator: the server cannot map the shared region")

    def region(self, size: int) -> np.ndarray:
        """The shared region (at least ``size`` bytes), mapped by the server too."""
        if self.shm is None or len(self.shm) < size:
            cap = max(1 << 20, 1 << (size - 1).bit_length())
            # Views of the old mapping may still be alive (e.g. in a traceback): let it be
            # unmapped when they go, rather than closing it here.
            self.shm_view = None
            self.shm = None
            if self.shm_fd >= 0:
                os.close(self.shm_fd)
            self.shm_fd = os.memfd_create("polyfuse-emulator", os.MFD_CLOEXEC)
            os.ftruncate(self.shm_fd, cap)
            self.shm = mmap.mmap(self.shm_fd, cap)
            self.shm_view = np.frombuffer(self.shm, dtype=np.uint8)
            self.ensure()
            with self._guard("mapping the shared region"):
                self._map()
        return self.shm_view

    def run(self, spec_off: int, timeout: float, what: str = "kernels") -> tuple[int, bool]:
        """Run the specification at ``spec_off``; returns (wait status, timed out)."""
        self.ensure()
        with self._guard(f"running {what}"):
            return self._run(spec_off, timeout)

    def _run(self, spec_off: int, timeout: float) -> tuple[int, bool]:
        self._send(MSG_RUN, spec_off)
        reply = self._recv()
        assert reply is not None
        pid = reply[1]
        if pid < 0:
            raise EmulatorError(f"emulator: cannot fork a run: {os.strerror(-pid)}")
        timed_out = False
        try:
            done = self._recv(timeout)
            if done is None:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                done = self._recv(30.0)
                if done is None:
                    raise ServerDied("no answer after killing a hung run")
        except BaseException as e:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if not isinstance(e, ServerDied):
                self.stop()  # its answer is pending or lost: start afresh next time
            raise
        return done[1], timed_out


SERVERS: dict[Path, Server] = {}
SERVERS_LOCK = threading.Lock()


def server_for(exe: Path) -> Server:
    with SERVERS_LOCK:
        server = SERVERS.get(exe)
        if server is None:
            server = SERVERS[exe] = Server(exe)
        return server


@atexit.register
def stop_servers() -> None:
    for server in list(SERVERS.values()):
        with contextlib.suppress(Exception):
            server.close()
