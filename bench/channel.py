"""The sandbox channel: round trip over a mounted unix socket against docker's attached stdio.

Workload: a container from the sandbox image runs a Python echo loop (one JSON line in,
the same line out); the host sends N 200-byte JSON lines one at a time and times each
round trip. (a) unix socket: the host listens on a socket in a directory mounted into the
container, the guest connects. (b) stdio: the container is created with stdin open and
attached (``attach_socket`` before ``start``, so that no early output is missed); replies are read
through docker's 8-byte stream frame headers. Same image, same hardening, same run.

    python -m bench.channel [--n 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import summary, table
from bench.report import STAT_COLUMNS, Section, SuiteOptions, Table, not_run, ratio_cell, ratio_stats, stat_cells
from runledger.sandbox.image import build_image, docker_client

ECHO_SOCKET = (
    "import socket,sys\n"
    "s=socket.socket(socket.AF_UNIX); s.connect('/run/rl/echo.sock'); f=s.makefile('rwb')\n"
    "for line in f:\n    f.write(line); f.flush()\n"
)
ECHO_STDIO = "import sys\nfor line in sys.stdin.buffer:\n    sys.stdout.buffer.write(line); sys.stdout.buffer.flush()\n"
HARDENED: dict[str, Any] = dict(
    network_mode="none", read_only=True, cap_drop=["ALL"], security_opt=["no-new-privileges"],
    user="10001:10001", pids_limit=32, mem_limit="128m",
)  # fmt: skip
LINE = (json.dumps({"id": 1, "op": "tool", "name": "lookup", "args": {"q": "x" * 120}}) + "\n").encode()


async def unix_socket(docker: Any, image: str, n: int) -> list[float]:
    d = Path(tempfile.mkdtemp())
    d.chmod(0o777)
    conn: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.get_running_loop().create_future()

    async def on_connect(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conn.set_result((r, w))

    server = await asyncio.start_unix_server(on_connect, path=str(d / "echo.sock"))
    (d / "echo.sock").chmod(0o777)
    c = docker.containers.run(image, ["python3", "-c", ECHO_SOCKET], detach=True,
                              volumes={str(d): {"bind": "/run/rl", "mode": "rw"}}, **HARDENED)  # fmt: skip
    try:
        reader, writer = await asyncio.wait_for(conn, 30)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            writer.write(LINE)
            await writer.drain()
            await reader.readuntil(b"\n")
            out.append((time.perf_counter() - t0) * 1000)
        return out
    finally:
        c.remove(force=True)
        server.close()
        shutil.rmtree(d, ignore_errors=True)


def stdio(docker: Any, image: str, n: int) -> list[float]:
    c = docker.containers.create(image, ["python3", "-c", ECHO_STDIO], stdin_open=True, tty=False, **HARDENED)
    sock = c.attach_socket(params={"stdin": 1, "stdout": 1, "stream": 1, "logs": 0})
    raw: socket.socket = sock._sock
    raw.settimeout(10)
    c.start()
    buf = b""

    def read_line() -> bytes:
        nonlocal buf
        while b"\n" not in buf:
            header = b""
            while len(header) < 8:
                header += raw.recv(8 - len(header))
            size = struct.unpack(">I", header[4:])[0]
            chunk = b""
            while len(chunk) < size:
                chunk += raw.recv(size - len(chunk))
            if header[0] == 1:
                buf += chunk
        line, _, buf = buf.partition(b"\n")
        return line

    try:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            raw.sendall(LINE)
            read_line()
            out.append((time.perf_counter() - t0) * 1000)
        return out
    finally:
        c.remove(force=True)


def measure(n: int, rounds: int = 5) -> dict[str, list[float]]:
    """Round trips in ms per channel; the two channels take turns, ``rounds`` times ``n // rounds`` each."""
    docker = docker_client()
    image = build_image(log=lambda m: None)
    out: dict[str, list[float]] = {"unix socket": [], "attached stdio": []}
    for _ in range(rounds):
        out["unix socket"] += asyncio.run(unix_socket(docker, image, max(1, n // rounds)))
        out["attached stdio"] += stdio(docker, image, max(1, n // rounds))
    return out


def run_suite(opts: SuiteOptions) -> Section:
    title = "the sandbox channel: mounted unix socket against attached stdio"
    try:
        docker_client()
    except Exception as exc:  # DockerUnavailableError, or docker-py missing: the part is reported as not run
        return not_run("channel", title, f"{exc}")
    n, rounds = (40, 2) if opts.quick else (2000, 5)
    samples = measure(n, rounds)
    section = Section(part="channel", title=title, data={k: summary(v) for k, v in samples.items()})
    section.workload = (
        "A container of the sandbox image (hardened: no network, read-only root, no capabilities, non-root) runs "
        "a Python echo loop; the host sends 200-byte JSON lines one at a time and times each round trip. unix "
        "socket: over a socket in a directory mounted into the container. attached stdio: the container's stdin "
        f"and stdout through docker's attach socket and 8-byte frame headers. {rounds} rounds of "
        f"{n // rounds} round trips per channel, the channels taking turns (a new container each time)."
    )
    pairs = [(summary(a)["p50"], summary(b)["p50"])
             for a, b in zip(_chunks(samples["attached stdio"], rounds), _chunks(samples["unix socket"], rounds),
                             strict=True)]  # fmt: skip
    rows = [[name, *stat_cells(summary(v)), "" if name == "unix socket" else ratio_cell(ratio_stats(pairs))]
            for name, v in samples.items()]  # fmt: skip
    section.tables.append(Table("round trip (ms)", ["channel", *STAT_COLUMNS, "/ unix socket p50"], rows))
    from bench.plots import latency_cdf

    section.plots.append(latency_cdf(opts.plot_dir / "channel-cdf.png", "ms per round trip", samples))
    return section


def _chunks(values: list[float], k: int) -> list[list[float]]:
    size = len(values) // k
    return [values[i * size : (i + 1) * size] for i in range(k)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args(argv)
    docker = docker_client()
    image = build_image(log=lambda m: None)
    results = {"unix socket": summary(asyncio.run(unix_socket(docker, image, args.n))),
               "attached stdio": summary(stdio(docker, image, args.n))}  # fmt: skip
    rows = [["channel", "p50 ms", "p99 ms", "min ms", "max ms", "n"]]
    for name, s in results.items():
        rows.append([name, f"{s['p50']:.3f}", f"{s['p99']:.3f}", f"{s['min']:.3f}", f"{s['max']:.3f}", str(s["n"])])
    print(table(rows))
    ratio = results["attached stdio"]["p50"] / results["unix socket"]["p50"]
    print(f"\nstdio p50 / unix socket p50 = {ratio:.2f}x")
    return results


if __name__ == "__main__":
    main()
