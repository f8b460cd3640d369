"""Test helpers: start bi-rl commands on several local ranks over MLX's ring backend.

Two ways, as users have them: `mlx_launch` runs MLX's own launcher (`mlx.launch --backend
ring -n N`, ranks on 127.0.0.1), and `start_ranks` starts the rank processes directly with
the environment the launcher would give them (MLX_RANK, MLX_HOSTFILE), so a test can stop
or kill one rank by its process id. Ports are probed free first, from a random base, since
other test runs may share the machine.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MLX_LAUNCH = Path(sys.executable).with_name("mlx.launch")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> int:
    """A base port such that base .. base + n - 1 are all free now."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(20000, 60000 - n)
        if all(_free(base + i) for i in range(n)):
            return base
    raise RuntimeError("no free ports for the ring backend")


def env() -> dict:
    """The environment for a rank: this checkout first on the path."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [e.get("PYTHONPATH")])])
    e.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return e


def command(cli: str, args) -> list[str]:
    """`python -m bi_rl.cli.<cli> ARGS` with this interpreter."""
    return [sys.executable, "-m", f"bi_rl.cli.{cli}", *map(str, args)]


def mlx_launch(n: int, cli: str, args, cwd, **popen) -> subprocess.Popen:
    """`mlx.launch --backend ring -n N -- python -m bi_rl.cli.<cli> ARGS` on localhost.

    Note: mlx.launch (MLX 0.32.4) exits 0 whatever its ranks do; read their output."""
    launcher = [str(MLX_LAUNCH), "--backend", "ring", "-n", str(n), "-p", str(free_ports(n))]
    return subprocess.Popen(
        [*launcher, "--", *command(cli, args)],
        cwd=cwd,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **popen,
    )


def launched_ranks(launcher: subprocess.Popen) -> dict[int, int]:
    """{rank: pid} of the processes `mlx_launch` started (its direct children)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (d / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid != launcher.pid:
            continue
        for item in environ:
            if item.startswith(b"MLX_RANK="):
                out[int(item[len(b"MLX_RANK=") :])] = int(d.name)
    return out


def start_ranks(n: int, cli: str, args, cwd, per_rank=None) -> list[subprocess.Popen]:
    """The N rank processes started directly, as mlx.launch would start them (ring backend,
    localhost). per_rank(rank) -> extra args for that rank only."""
    base = free_ports(n)
    hostfile = Path(cwd) / f"hosts-{base}.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{base + r}"] for r in range(n)]))
    procs = []
    for r in range(n):
        e = {**env(), "MLX_RANK": str(r), "MLX_HOSTFILE": str(hostfile)}
        extra = per_rank(r) if per_rank is not None else []
        procs.append(
            subprocess.Popen(
                command(cli, [*args, *extra]),
                cwd=cwd,
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    return procs


def wait_for_lines(path: Path, lines: int, proc: subprocess.Popen, timeout: float) -> int:
    """Wait until `path` has at least `lines` complete lines (or proc ended); their count."""
    deadline = time.monotonic() + timeout
    have = 0
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            have = path.read_bytes().count(b"\n")
        except OSError:
            have = 0
        if have >= lines:
            break
        time.sleep(0.02)
    return have


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    """(returncode, stdout, stderr) once proc ends; killed after `timeout` seconds."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout} s; stderr:\n{err.decode()}") from None
    return proc.returncode, out.decode(), err.decode()
