"""Run a model's Python answer against a task's asserts in a locked-down child process.

    >>> run_asserts("def add(a, b):\\n    return a + b", ["assert add(2, 3) == 5"]).passed
    True
    >>> run_asserts("def add(a, b):\\n    while True: pass", ["assert add(2, 3) == 5"]).status
    'timeout'

What is enforced on the child (``python -I``, a fresh empty folder as its working directory, an
empty environment, stdin from /dev/null):
- **time**: the parent kills the child's whole process group at ``timeout_s`` of wall time
  (status ``timeout``); ``RLIMIT_CPU`` backs it up at the same number of CPU seconds;
- **memory**: ``RLIMIT_AS`` caps the address space at ``memory_mb`` (a ``MemoryError`` or a kill:
  status ``error``); ``RLIMIT_FSIZE`` caps any file it writes at 1 MB; ``RLIMIT_CORE`` is 0;
- **network**: where ``unshare -n`` works (root, or user namespaces) the child runs in a network
  namespace of its own with no interface but loopback. Always, an audit hook installed before the
  answer runs refuses every ``socket.*`` event, new processes (``subprocess.Popen``, ``os.system``,
  ``os.exec*``, ``os.fork``, ``os.posix_spawn``, ``os.spawn*``) and ``ctypes`` (which could undo the
  rest). `Sandbox.network` says which of the two held.
The answer runs as a module named ``answer`` (an ``if __name__ == "__main__":`` block does not
run), with its prints sent to /dev/null. The verdict travels back on the child's stdout behind a
nonce it read from stdin before the answer ran, so an answer that exits early (``sys.exit(0)``,
``os._exit``) is a failure, not a pass. Each assert runs on its own; the answer passes when all do.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Literal

__all__ = ["Outcome", "network_isolation", "run_asserts"]

Status = Literal["passed", "failed", "error", "timeout"]

# The child's first code: read the nonce, lock down, run the answer, run each assert, report.
_RUNNER = r"""
import json, os, sys
nonce = sys.stdin.readline().strip()
job = json.loads(sys.stdin.readline())
out = os.dup(1)
BLOCKED = ("socket.", "subprocess.", "os.system", "os.exec", "os.fork", "os.posix_spawn", "os.spawn",
           "os.forkpty", "pty.", "ctypes.")
def _audit(event, args):
    if event.startswith(BLOCKED):
        raise PermissionError(f"sandbox: {event} is not allowed")
sys.addaudithook(_audit)
sink = open(os.devnull, "w")
sys.stdout = sys.stderr = sink
def report(verdict):
    os.write(out, (nonce + " " + json.dumps(verdict) + "\n").encode())
    os._exit(0)
scope = {"__name__": "answer"}
try:
    exec(compile(job["code"], "<answer>", "exec"), scope)
except BaseException as e:
    report({"status": "error", "passed": 0, "detail": f"answer: {type(e).__name__}: {e}"[:300]})
passed, detail = 0, ""
for test in job["tests"]:
    try:
        exec(compile(test, "<test>", "exec"), scope)
        passed += 1
    except BaseException as e:
        detail = detail or f"{test}: {type(e).__name__}: {e}"[:300]
report({"status": "passed" if passed == len(job["tests"]) else "failed", "passed": passed, "detail": detail})
"""


@dataclass(frozen=True)
class Outcome:
    """How one answer fared. ``passed``: every assert held; ``n_passed`` of ``n_tests`` held."""

    status: Status
    n_passed: int
    n_tests: int
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@cache
def network_isolation() -> str:
    """``"unshare+audit"`` where ``unshare -n`` runs here, else ``"audit"`` (the hook alone)."""
    tool = shutil.which("unshare")
    if tool is None:
        return "audit"
    try:
        ok = (
            subprocess.run([tool, "-n", "true"], capture_output=True, timeout=10, check=False).returncode == 0
        )
    except (OSError, subprocess.SubprocessError):
        ok = False
    return "unshare+audit" if ok else "audit"


def _limits(timeout_s: float, memory_mb: int):
    """The child's resource limits, set between fork and exec."""

    def apply() -> None:
        import resource  # POSIX only: imported where it is used, in the child

        cpu = max(1, int(timeout_s + 1))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        memory = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_asserts(code: str, tests: Sequence[str], *, timeout_s: float = 5.0, memory_mb: int = 512) -> Outcome:
    """Run ``code`` then each of ``tests`` (assert statements) in a sandboxed child; never raises for
    anything the answer does. A child still running at ``timeout_s`` is killed: status ``timeout``."""
    nonce = secrets.token_hex(16)
    command = [sys.executable, "-I", "-c", _RUNNER]
    if network_isolation() == "unshare+audit":
        command = [shutil.which("unshare") or "unshare", "-n", *command]
    job = nonce + "\n" + json.dumps({"code": code, "tests": list(tests)}) + "\n"
    with tempfile.TemporaryDirectory(prefix="vp-sandbox-") as folder:
        child = subprocess.Popen(
            command,
            cwd=folder,
            env={},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, killed whole at the time limit
            preexec_fn=_limits(timeout_s, memory_mb),
        )
        try:
            stdout, _ = child.communicate(job.encode(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            return Outcome("timeout", 0, len(tests), f"killed at the {timeout_s:g} s time limit")
        finally:
            _kill_group(child)
    return _verdict(stdout, nonce, len(tests), child.returncode)


def _kill_group(child: subprocess.Popen) -> None:
    if child.poll() is None:
        with contextlib.suppress(ProcessLookupError):  # it ended between the poll and the kill
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def _verdict(stdout: bytes, nonce: str, n_tests: int, returncode: int | None) -> Outcome:
    """The child's report behind the nonce, or an error when it never reported."""
    for line in stdout.decode("utf-8", "replace").splitlines():
        if line.startswith(nonce + " "):
            v = json.loads(line[len(nonce) + 1 :])
            return Outcome(v["status"], int(v["passed"]), n_tests, v.get("detail", ""))
    why = f"signal {-returncode}" if returncode is not None and returncode < 0 else f"exit {returncode}"
    return Outcome("error", 0, n_tests, f"the answer ended the run before the asserts ({why})")
