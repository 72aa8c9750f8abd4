"""A simulated engine replica over several nodes (one pod per node).

What the engines do, and the sim copies:
- SGLang (``--nnodes N --node-rank R --dist-init-addr HOST:PORT``): every node
  joins the rendezvous node rank 0 hosts at HOST:PORT; only rank 0 serves the API
  (http_server.py launch_server returns for node_rank >= 1), and it serves only
  after the distributed init, i.e. once every node joined. Ranks >= 1 serve
  /health, /ping, /health_generate and (with --enable-metrics) /metrics on --port,
  their own schedulers' series only (engine.py launch_dummy_health_check_server):
  with attention DP over nodes, the DP groups whose first rank is on that node,
  which the leader does not report (FACTS.md "Series per engine"). The sim's
  leader, which runs the whole replica, sends each worker its node's page over the
  rendezvous connection every second (``PAGE_PERIOD_S``), and the worker serves it.
- vLLM (``--data-parallel-size DP --data-parallel-size-local L``, workers
  ``--headless --data-parallel-start-rank S``): the API server on the leader
  coordinates the DP ranks over ``--data-parallel-address:--data-parallel-rpc-port``;
  headless workers serve no API (cli/serve.py run_headless).
- A lost node takes the replica down: the collectives of the remaining ranks
  fail, so the leader exits and so do the other workers (LWS then recreates
  the group: restartPolicy RecreateGroupOnPodRestart).

The sim's rendezvous is one TCP connection per worker to the leader's
rendezvous port: a worker sends its node rank and holds the connection; the
leader answers /health 200 only while all N-1 workers are connected, and exits
when one drops; a worker exits when the leader's connection drops.

The leader names itself by its pod IP (POD_IP: it binds ZMQ sockets there, and
libzmq binds no DNS name; the sim refuses a name there, __main__.py
check_bind_host); the workers get LWS's DNS name of the leader
(LWS_LEADER_ADDRESS). The local test world has no cluster DNS, so
``PD_SIM_LEADER_IP`` (set by the e2e harness to the leader pod's IP) is used
instead when present.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST


@dataclass
class Group:
    size: int          # nodes (pods) of the replica
    rank: int          # this node's rank; 0 is the leader
    leader_host: str
    port: int          # the leader's rendezvous port
    joined: set = field(default_factory=set)
    lost = False
    page: bytes = b""  # a worker's: its node's metrics page, as the leader last sent it

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def complete(self) -> bool:
        return len(self.joined) == self.size - 1 and not self.lost


def group_from_namespace(flavor: str, ns) -> Group | None:
    """The replica layout of a parsed engine command line; None on one node."""
    leader = os.environ.get("PD_SIM_LEADER_IP")
    if flavor == "sglang":
        nnodes = getattr(ns, "nnodes", 1) or 1
        if nnodes <= 1:
            return None
        host, _, port = (ns.dist_init_addr or "").rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--nnodes {nnodes} needs --dist-init-addr HOST:PORT")
        return Group(nnodes, ns.node_rank or 0, leader or host, int(port))
    dp = ns.data_parallel_size or 1
    local = ns.data_parallel_size_local or dp
    if local >= dp:
        return None
    if dp % local:
        raise ValueError(f"--data-parallel-size {dp} is not a multiple of --data-parallel-size-local {local}")
    start = ns.data_parallel_start_rank or 0
    if bool(getattr(ns, "headless", False)) != (start > 0):
        raise ValueError("a vLLM replica over nodes: workers are --headless with --data-parallel-start-rank > 0, "
                         "the leader neither")
    return Group(dp // local, start // local, leader or ns.data_parallel_address or "127.0.0.1",
                 ns.data_parallel_rpc_port or 29550)


PAGE_PERIOD_S = 1.0


async def lead(group: Group, bind: str, on_lost, page=None) -> asyncio.AbstractServer:
    """Accept the workers' joins on the rendezvous port; ``on_lost()`` when one drops.
    ``page(rank)``: the metrics page of node ``rank``, sent to it as ``<length>\n<bytes>``
    every PAGE_PERIOD_S."""

    async def send_pages(rank: int, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = page(rank)
                writer.write(b"%d\n" % len(data) + data)
                await writer.drain()
                await asyncio.sleep(PAGE_PERIOD_S)
        except ConnectionError:
            writer.close()  # the worker sees the end and goes: the replica is down

    async def joined(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        try:
            rank = int(line.decode().strip())
        except ValueError:
            writer.close()
            return
        if not 0 < rank < group.size or rank in group.joined:
            writer.close()
            return
        group.joined.add(rank)
        print(f"pd-sim: node rank {rank} joined ({len(group.joined)}/{group.size - 1})", file=sys.stderr, flush=True)
        sender = asyncio.create_task(send_pages(rank, writer)) if page is not None else None
        await reader.read()  # until the worker goes
        if sender is not None:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        group.joined.discard(rank)
        group.lost = True
        print(f"pd-sim: node rank {rank} lost: the replica is down", file=sys.stderr, flush=True)
        on_lost()

    return await asyncio.start_server(joined, bind, group.port)


async def join(group: Group, timeout: float = 600.0, on_joined=None) -> None:
    """A worker: join the leader (retrying while it starts), then hold on until it goes,
    keeping the pages it sends (``group.page``); ``await on_joined()`` once joined."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            reader, writer = await asyncio.open_connection(group.leader_host, group.port)
            break
        except OSError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.5)
    writer.write(f"{group.rank}\n".encode())
    await writer.drain()
    print(f"pd-sim: node rank {group.rank} joined the leader {group.leader_host}:{group.port}", file=sys.stderr, flush=True)
    if on_joined is not None:
        await on_joined()
    try:
        while line := await reader.readline():
            group.page = await reader.readexactly(int(line))
    except (asyncio.IncompleteReadError, ValueError, ConnectionError):
        pass
    print("pd-sim: the leader is gone: the replica is down", file=sys.stderr, flush=True)


async def serve_worker(group: Group, host: str, port: int, enable_metrics: bool,
                       listen_fd: int | None = None) -> web.AppRunner:
    """SGLang's node of rank >= 1 on ``--port``: /ping, /health and /health_generate answer 200,
    /metrics (with --enable-metrics) its node's page (utils/common.py
    launch_dummy_health_check_server; without metrics no route: 404). ``listen_fd``: a socket
    already listening there (the e2e harness binds a pod's ``http`` port before the sim starts)."""
    app = web.Application()

    async def ok(_request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=group.page, headers={"Content-Type": CONTENT_TYPE_LATEST})

    for path in ("/ping", "/health", "/health_generate"):
        app.router.add_get(path, ok)
    if enable_metrics:
        app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    if listen_fd is not None:
        import socket

        await web.SockSite(runner, socket.socket(fileno=listen_fd)).start()
    else:
        await web.TCPSite(runner, host, port).start()
    return runner
