"""The embedded Triton: the real `tritonserver` binary from the nvidia-pytriton wheel.

No Docker engine is needed: the wheel ships tritonserver 2.51, the python backend and one
`triton_python_backend_stub` per Python version. We copy the backend folder, drop in the stub
that matches this interpreter, and start the binary on loopback in explicit model-control mode.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loadkit.errors import ServerStartError

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_MODEL_REPOSITORY = REPO_ROOT / "model_repository"
LOOPBACK = "127.0.0.1"
LOOPBACK_HOSTS = (LOOPBACK, "localhost", "::1")  # binding to anything else warns


def _pytriton_dir() -> Path:
    try:
        import pytriton  # noqa: PLC0415  (optional dependency)
    except ImportError as exc:
        raise ServerStartError(
            "the embedded server needs the 'embedded' extra: pip install 'loadkit[embedded]' "
            "(nvidia-pytriton ships the tritonserver binary)"
        ) from exc
    return Path(pytriton.__file__).resolve().parent / "tritonserver"


def unservable(folder: Path) -> str:
    """Why the embedded server cannot load this model folder ('' when it can): a backend the
    wheel does not ship (it has the python backend only), or a module the model.py imports that
    this Python does not have (the stub imports from this venv)."""
    import importlib.util

    from loadkit.modelconfig import from_pbtxt

    config = from_pbtxt((folder / "config.pbtxt").read_text())
    backend = config.get("backend") or config.get("platform", "")
    if backend == "ensemble" or config.get("platform") == "ensemble":
        return ""
    if not (_pytriton_dir() / "backends" / backend).is_dir():
        return f"backend '{backend}' is not in the embedded server (python only)"
    if backend != "python":
        return ""
    missing = sorted(m for m in model_imports(folder) - {"triton_python_backend_utils"}
                     if importlib.util.find_spec(m) is None)
    return f"its model.py imports {', '.join(missing)}, not installed here" if missing else ""


def model_imports(folder: Path) -> set[str]:
    """The top-level modules a python-backend model's 1/model.py imports (none without one)."""
    import ast

    source = folder / "1" / "model.py"
    if not source.is_file():
        return set()
    tree = ast.parse(source.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    return names


def free_port(host: str = LOOPBACK) -> int:
    """A port the OS says is free right now (a small race, acceptable on loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def prepare_backends(workdir: Path) -> Path:
    """Copy the python backend and put this interpreter's stub beside it."""
    src = _pytriton_dir()
    backends = workdir / "backends"
    if backends.exists():
        shutil.rmtree(backends)
    shutil.copytree(src / "backends", backends)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = src / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise ServerStartError(f"nvidia-pytriton has no python backend stub for Python {version}")
    target = backends / "python" / "triton_python_backend_stub"
    shutil.copy2(stub, target)
    target.chmod(0o755)
    return backends


PR_SET_PDEATHSIG = 1


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A pre-exec hook that has the kernel SIGTERM the server when loadkit dies, even by SIGKILL
    (nothing else runs then to stop it); Linux only. libc is loaded here, in the parent."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def hook() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return hook


def die_with_parent(parent: int) -> None:
    """Called first thing in a child loadkit process (a worker) that must not outlive `parent`;
    in-process, because a pre-exec hook is unsafe once grpc's threads exist."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


@dataclass(kw_only=True)
class EmbeddedServer:
    """A tritonserver process bound to loopback; use as a context manager or start()/stop()."""

    model_repository: Path = DEFAULT_MODEL_REPOSITORY
    models: tuple[str, ...] = ()
    host: str = LOOPBACK
    grpc_port: int = 0
    http_port: int = 0
    metrics_port: int = 0
    log_path: Path | None = None
    ready_timeout_s: float = 120.0
    stop_grace_s: float = 10.0
    extra_args: tuple[str, ...] = ()
    # Triton's local response cache: only models whose config enables `response_cache` use
    # it (scenarios/response-cache.yaml shows why a load test must know).
    cache_bytes: int = 64 << 20
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _workdir: Path | None = field(default=None, init=False)

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_address(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def _env(self) -> dict[str, str]:
        # The stub embeds libpython; with VIRTUAL_ENV and PATH of this interpreter it imports the
        # same numpy/onnxruntime we installed. One BLAS thread per instance keeps instance counts
        # meaningful on small machines.
        env = dict(os.environ)
        prefix = Path(sys.prefix)
        if sys.prefix != sys.base_prefix:
            env["VIRTUAL_ENV"] = str(prefix)
        env["PATH"] = f"{prefix / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        # The copied stub's RPATH no longer reaches the wheel's bundled libraries (libcudart...).
        libs = _pytriton_dir().parent.parent / "nvidia_pytriton.libs"
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(libs), env.get("LD_LIBRARY_PATH", "")) if p
        )
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, "1")
        return env

    def command(self, backends: Path) -> list[str]:
        binary = _pytriton_dir() / "bin" / "tritonserver"
        cmd = [
            str(binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backends}",
            "--model-control-mode=explicit",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=true",
            "--metrics-interval-ms=1000",
            "--exit-timeout-secs=5",
            "--log-verbose=0",
        ]
        if self.cache_bytes:
            cmd += [f"--cache-directory={_pytriton_dir() / 'caches'}",
                    f"--cache-config=local,size={self.cache_bytes}"]
        cmd += list(self.extra_args)
        return cmd

    def start(self) -> EmbeddedServer:
        if self.host not in LOOPBACK_HOSTS:
            print(
                f"warning: embedded Triton binds to {self.host}, beyond loopback", file=sys.stderr
            )
        self._workdir = Path(tempfile.mkdtemp(prefix="loadkit-triton-"))
        backends = prepare_backends(self._workdir)
        for attr in ("grpc_port", "http_port", "metrics_port"):
            if not getattr(self, attr):
                setattr(self, attr, free_port(self.host))
        if self.log_path is None:
            self.log_path = self._workdir / "tritonserver.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115  (owned by the child for its lifetime)
        try:
            self.process = subprocess.Popen(
                self.command(backends),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env(),
                start_new_session=True,
                preexec_fn=_die_with_parent_hook(),  # noqa: PLW1509  (no threads exist yet)
            )
        finally:
            log.close()
        self._wait_ready()
        for model in self.models:
            self.load_model(model)
        return self

    def load_model(self, name: str) -> None:
        """Load one model through the HTTP repository API, quoting Triton's refusal."""
        url = f"http://{self.http_address}/v2/repository/models/{name}/load"
        req = urllib.request.Request(url, data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.ready_timeout_s):  # noqa: S310
                return
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            tail = self.log_tail(15)
            self.stop()
            raise ServerStartError(
                f"tritonserver could not load model {name!r}: {detail}\nlog tail:\n{tail}"
            ) from exc

    def _ready(self) -> bool:
        url = f"http://{self.http_address}/v2/health/ready"
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 (loopback only)
                return resp.status == 200
        except OSError:
            return False

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise ServerStartError(
                    f"tritonserver exited with code {self.process.returncode} before it was "
                    f"ready; log tail:\n{tail}"
                )
            if self._ready():
                return
            time.sleep(0.2)
        tail = self.log_tail()
        self.stop()
        raise ServerStartError(
            f"tritonserver was not ready after {self.ready_timeout_s:.0f} s; log tail:\n{tail}"
        )

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after the grace period; the whole process group goes."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        # Python-backend stubs run in the server's process group; make sure none outlive it.
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._workdir is not None:
            shutil.rmtree(self._workdir / "backends", ignore_errors=True)

    def copy_log(self, dest: Path) -> None:
        if self.log_path is not None and self.log_path.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            if self.log_path.resolve() != dest.resolve():
                shutil.copy2(self.log_path, dest)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
