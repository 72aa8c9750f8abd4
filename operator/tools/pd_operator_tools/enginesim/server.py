"""HTTP front of a simulated engine (aiohttp, real time).

Serves what a vLLM 0.33.0 / SGLang 0.5.23 PD instance serves, as far as the
routers and clients use it:

* ``POST /v1/completions``, ``POST /v1/chat/completions`` (OpenAI; SSE when
  ``stream``; ``usage`` with token counts, also as the last chunk with
  ``stream_options.include_usage``);
* ``GET /v1/models``, ``GET /health`` (and vLLM ``/ping``, ``/version``;
  SGLang ``/get_server_info``, ``/get_model_info``, ``/health_generate``);
* ``GET /metrics`` in Prometheus text (SGLang only with ``--enable-metrics``,
  as the real server).

Tokenisation rule (deterministic, documented): a text is
``max(1, ceil(len(text) / 4))`` tokens; a chat prompt is the sum over its
messages of (tokens of the content + 4) plus 3 for the generation prompt; a
prompt given as a list of token ids counts its length.  Output text is
synthetic: token ``i`` is the word ``WORDS[i % len(WORDS)]`` with a leading space.
The sim never stops early (no EOS): a request generates ``max_tokens``
(``max_completion_tokens``) tokens; without one, ``--default-max-tokens``
(capped to the model length).

PD handshakes (as the real routers drive them; see ``README`` in this package):

* vllm-router ``--vllm-pd-disaggregation --kv-connector nixl``: the prefill
  request carries ``kv_transfer_params: {do_remote_decode: true, ...}`` and
  ``max_tokens: 1``; the response carries ``kv_transfer_params``
  (``do_remote_prefill: true``, ``remote_engine_id``, ``remote_block_ids``,
  ``remote_host``/``remote_port`` = the NIXL side channel) which the router
  copies into the decode request.  The decode sim then pulls the KV (transfer
  time) and decodes.
* sglang-router ``--pd-disaggregation``: the same request goes to prefill and
  decode, with ``bootstrap_host``/``bootstrap_port``/``bootstrap_room``.  The
  prefill sim runs a bootstrap server on ``--disaggregation-bootstrap-port``;
  the decode sim asks it (``GET /sim/kv/{room}``, long poll) until the room's
  prefill is done, then pulls the KV (transfer time) and decodes.
"""

from __future__ import annotations

import asyncio
import json
import random
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from aiohttp import ClientSession, ClientTimeout, web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .clock import AsyncioClock
from pd_operator.perfmodel.costmodel import LINKS, CostModel, Efficiency, Link, ModelShape
from pd_operator.perfmodel.engine_defaults import default_max_running, kv_tokens
from .engine import Engine, SimRequest
from .metrics import PromSink

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs", "far")


def count_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def chat_tokens(messages: list) -> int:
    total = 3
    for m in messages or []:
        content = m.get("content", "") if isinstance(m, dict) else ""
        if isinstance(content, list):  # content parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        total += count_tokens(str(content or "")) + 4
    return total


def prompt_tokens_of(prompt: Any) -> int:
    if isinstance(prompt, list):
        if prompt and isinstance(prompt[0], int):
            return len(prompt)
        if prompt and isinstance(prompt[0], list):  # batch of token lists: first only
            return len(prompt[0])
        if prompt and isinstance(prompt[0], str):
            return count_tokens(prompt[0])
        return 1
    return count_tokens(str(prompt or ""))


# SGLang's default SGLANG_FORCE_STREAM_INTERVAL (sglang/srt/environ.py)
SGLANG_FORCE_STREAM_INTERVAL = 50


@dataclass
class SimConfig:
    flavor: str  # vllm | sglang
    model: str
    served_names: list
    shape: ModelShape
    host: str = "0.0.0.0"
    port: int = 8000
    role: str = "unified"  # unified | prefill | decode
    tp: int = 1
    dp: int = 1  # attention data-parallel ranks of the replica (cost model: the batch is spread over them)
    ep: int = 1  # expert-parallel size (an MoE shape pays one EP dispatch per MoE layer per step)
    moe_dp: int = 1  # SGLang --moe-dp-size (the schedulers' moe_ep_rank label)
    # --max-num-seqs (vLLM, per data-parallel rank) / --max-running-requests (SGLang, the whole
    # replica); None: not on the command line, the engine's own default (running_limit)
    max_num_seqs: Optional[int] = None
    max_batched_tokens: int = 8192
    performance_mode: Optional[str] = None  # vLLM --performance-mode (throughput doubles the unset batch limit)
    max_model_len: int = 40960
    mem_fraction: float = 1.0
    kv_capacity_tokens: Optional[int] = None
    # the KV cache as the engine's flags size it (engine_defaults.kv_tokens): vLLM
    # --kv-cache-memory-bytes (per GPU), SGLang --max-total-tokens (a cap per worker)
    kv_cache_memory_bytes: Optional[int] = None
    max_total_tokens: Optional[int] = None
    kv_blocks: Optional[tuple[int, int]] = None  # vLLM --num-gpu-blocks-override and the block's tokens
    api_keys: list = field(default_factory=list)
    enable_metrics: bool = True
    bootstrap_port: Optional[int] = None
    side_channel_host: str = "localhost"
    side_channel_port: int = 5600
    efficiency: Efficiency = field(default_factory=Efficiency)
    link: Link = LINKS["rdma"]
    default_max_tokens: int = 256
    bootstrap_timeout: float = 300.0
    # SIGTERM: vLLM --shutdown-timeout (0 aborts in-flight requests, N drains up
    # to N s); None for SGLang, which drains until no request is left.
    shutdown_timeout: Optional[int] = 0
    # a socket already listening on host:port, inherited (--listen-fd): the e2e
    # harness binds it before the process starts, as a readiness probe would
    # hold traffic back, so a router never meets a refused connection meanwhile
    listen_fd: Optional[int] = None
    group: Optional[Any] = None  # enginesim.group.Group: a replica over several nodes
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    kv_connector: Optional[str] = None  # vLLM kv_transfer_config.kv_connector
    # vLLM --max-num-queued-reqs: requests in flight (waiting or running) beyond it get 503
    # (AsyncLLM admission check, QueueOverflowError). SGLang's --max-queued-requests is
    # ignored in disaggregation mode (its help text), so it is not simulated.
    max_queued_reqs: Optional[int] = None
    # Fault injection (sim only): the fraction of KV transfers into a decode engine that fail
    fail_kv_transfer: float = 0.0

    @property
    def served_name(self) -> str:
        return self.served_names[0] if self.served_names else self.model

    def kv_tokens(self) -> int:
        return (self.kv_capacity_tokens if self.kv_capacity_tokens is not None
                else kv_tokens(self.cost(), self.flavor, self.mem_fraction,
                               self.kv_cache_memory_bytes, self.max_total_tokens, *(self.kv_blocks or (None, None))))

    def running_limit(self) -> int:
        """The most requests the replica runs at once: vLLM's limit is per DP rank (each rank's
        scheduler has its own), SGLang's --max-running-requests is the replica's (split over
        its attention-DP workers); unset, the engine's own default on the H200
        (perfmodel.engine_defaults: vLLM 1024 per rank, SGLang from its KV pool per worker)."""
        if self.flavor == "vllm":
            per_rank = self.max_num_seqs or default_max_running("vllm", 0, self.max_model_len, self.max_batched_tokens,
                                                             self.performance_mode)
            return per_rank * self.dp
        if self.max_num_seqs:
            return self.max_num_seqs
        return self.dp * default_max_running("sglang", self.kv_tokens() // self.dp, self.max_model_len)

    def cost(self) -> CostModel:
        # the cost model's tp counts every GPU of the replica: SGLang's --tp-size does
        # (attention DP splits it); vLLM's DP ranks each have --tensor-parallel-size GPUs
        gpus = self.tp * self.dp if self.flavor == "vllm" else self.tp
        return CostModel(self.shape, gpus, self.efficiency, dp=self.dp, ep=self.ep)


ABORTED = object()  # put on a request's token queue when the engine aborts it


def _err(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status},
                              "object": "error", "message": message, "type": kind, "code": status}, status=status)


class SimServer:
    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.sink = PromSink(cfg.flavor, cfg.served_name, cfg.role, kv_connector=cfg.kv_connector,
                             **self._ranks(cfg))
        self.engine: Optional[Engine] = None
        self.rooms: dict[int, asyncio.Future] = {}
        self.fetching = 0  # decode requests waiting for their prefill (SGLang: the transfer queue)
        self.started = time.monotonic()
        self._session: Optional[ClientSession] = None
        self._runners: list[web.AppRunner] = []
        self.inflight: dict[SimRequest, asyncio.Queue] = {}
        self.draining = False

    @staticmethod
    def _ranks(cfg: SimConfig) -> dict:
        """SGLang's schedulers: one per attention-DP group, over the replica's nodes."""
        if cfg.flavor != "sglang":
            return {}
        return {"dp": cfg.dp, "tp": cfg.tp, "nodes": cfg.group.size if cfg.group is not None else 1,
                "ep": cfg.ep, "moe_dp": cfg.moe_dp}

    def node_page(self, node: int) -> bytes:
        """The metrics page a node of rank >= 1 of the replica serves: its schedulers' series."""
        reg = self.sink.node_registries.get(node)
        return generate_latest(reg) if reg is not None else b""

    # ---- lifecycle --------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/metrics", self.metrics)
        r.add_get("/v1/models", self.models)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        if self.cfg.flavor == "vllm":
            r.add_get("/ping", self.health)
            r.add_get("/version", lambda _req: web.json_response({"version": "0.33.0"}))
        else:
            r.add_get("/get_server_info", self.server_info)
            r.add_get("/server_info", self.server_info)
            r.add_get("/get_model_info", self.model_info)
            r.add_get("/model_info", self.model_info)
            r.add_get("/health_generate", self.health)
            r.add_get("/ready", self.ready)
        return app

    async def start(self) -> None:
        cfg = self.cfg
        self.engine = Engine(AsyncioClock(), cfg.cost(), cfg.role, max_num_seqs=cfg.running_limit(),
                             max_batched_tokens=cfg.max_batched_tokens,
                             kv_capacity_tokens=cfg.kv_tokens(),
                             link=cfg.link, sink=self.sink, name=f"{cfg.flavor}-{cfg.role}",
                             dp_ranks=cfg.dp if cfg.flavor == "sglang" else 1)
        self.sink.bind(self.engine, fetching=lambda: self.fetching,
                       gen_throughput=lambda: self.sink.samples.generation_tokens / max(1e-9, time.monotonic() - self.started))
        self._session = ClientSession(timeout=ClientTimeout(total=None))
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        if cfg.listen_fd is not None:
            import socket

            await web.SockSite(runner, socket.socket(fileno=cfg.listen_fd)).start()
        else:
            await web.TCPSite(runner, cfg.host, cfg.port).start()
        self._runners.append(runner)
        if cfg.flavor == "sglang" and cfg.role == "prefill" and cfg.bootstrap_port:
            boot = web.Application()
            boot.router.add_get("/sim/kv/{room}", self.bootstrap_wait)
            boot.router.add_get("/health", self.health)
            brunner = web.AppRunner(boot, access_log=None)
            await brunner.setup()
            await web.TCPSite(brunner, cfg.host, cfg.bootstrap_port).start()
            self._runners.append(brunner)

    async def drain(self) -> None:
        """What the engine does on SIGTERM before it exits.

        vLLM 0.33.0 (v1/engine/core.py ``_handle_shutdown``): shutdown timeout 0
        aborts every in-flight request; N > 0 refuses new requests and waits up
        to N s for the running ones, then aborts the rest. SGLang 0.5.23
        (tokenizer_manager.py ``sigterm_watchdog``): /health answers 503, new
        requests are still served, and it exits once none is left (no deadline
        of its own: the kubelet's SIGKILL ends it).
        """
        self.draining = True
        timeout = self.cfg.shutdown_timeout
        if self.cfg.flavor == "vllm" and not timeout:
            self.abort_all()
            return
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self.inflight and (deadline is None or loop.time() < deadline):
            await asyncio.sleep(0.05)
        self.abort_all()

    def abort_all(self) -> None:
        for req, tokens in list(self.inflight.items()):
            self.engine.abort(req)
            tokens.put_nowait(ABORTED)
        self.inflight.clear()

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        if self._session:
            await self._session.close()

    def _kv_fails(self) -> bool:
        """An injected KV transfer failure (--fail-kv-transfer), counted as the engine counts it."""
        if self.cfg.fail_kv_transfer > 0 and random.random() < self.cfg.fail_kv_transfer:
            self.sink.kv_transfer_failed()
            return True
        return False

    # ---- auth --------------------------------------------------------------------
    @web.middleware
    async def _auth(self, request: web.Request, handler):
        keys = self.cfg.api_keys
        if keys:
            path = request.path
            if self.cfg.flavor == "vllm":
                guarded = path.startswith(("/v1", "/v2", "/inference", "/cohere"))
            else:
                guarded = not path.startswith(("/health", "/ready", "/metrics"))
            if guarded:
                auth = request.headers.get("Authorization", "")
                if not any(auth == f"Bearer {k}" for k in keys):
                    return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    # ---- simple endpoints --------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        if self.draining and self.cfg.flavor == "sglang":
            return web.Response(status=503)  # http_server.py health_generate: gracefully_exit
        if self.cfg.group is not None and not self.cfg.group.complete:
            return web.Response(status=503)  # a replica over nodes serves once every node joined (group.py)
        return web.Response(status=200)

    async def ready(self, _request: web.Request) -> web.Response:
        """SGLang's /ready (http_server.py ready -> tokenizer_manager.py is_ready):
        200 only when started and Up, not draining, not paused; no API key needed
        (utils/auth.py). The sim is Up once its group is complete and is never
        paused nor left UnHealthy by a failed warmup."""
        if self.draining:
            return web.Response(status=503)
        if self.cfg.group is not None and not self.cfg.group.complete:
            return web.Response(status=503)
        return web.Response(status=200)

    async def metrics(self, _request: web.Request) -> web.Response:
        if self.cfg.flavor == "sglang" and not self.cfg.enable_metrics:
            return web.Response(status=404, text="Not Found")
        return web.Response(body=generate_latest(self.sink.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, _request: web.Request) -> web.Response:
        owner = "vllm" if self.cfg.flavor == "vllm" else "sglang"
        data = [{"id": n, "object": "model", "created": int(self.started), "owned_by": owner,
                 "root": self.cfg.model, "parent": None, "max_model_len": self.cfg.max_model_len}
                for n in (self.cfg.served_names or [self.cfg.model])]
        return web.json_response({"object": "list", "data": data})

    async def server_info(self, _request: web.Request) -> web.Response:
        c = self.cfg
        return web.json_response({
            "model_path": c.model, "served_model_name": c.served_name, "tp_size": c.tp, "dp_size": 1,
            "disaggregation_mode": "null" if c.role == "unified" else c.role,
            "disaggregation_bootstrap_port": c.bootstrap_port, "max_running_requests": c.running_limit(),
            "chunked_prefill_size": c.max_batched_tokens, "context_length": c.max_model_len, "version": "0.5.23",
        })

    async def model_info(self, _request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.cfg.model, "tokenizer_path": self.cfg.model,
                                  "is_generation": True, "model_type": "sim"})

    # ---- SGLang bootstrap (prefill side) ------------------------------------------
    def _room(self, room: int) -> asyncio.Future:
        fut = self.rooms.get(room)
        if fut is None:
            fut = self.rooms[room] = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_later(self.cfg.bootstrap_timeout + 5, self.rooms.pop, room, None)
        return fut

    async def bootstrap_wait(self, request: web.Request) -> web.Response:
        try:
            room = int(request.match_info["room"])
        except ValueError:
            return web.json_response({"error": "bad room"}, status=400)
        try:
            tokens = await asyncio.wait_for(asyncio.shield(self._room(room)), self.cfg.bootstrap_timeout)
        except asyncio.TimeoutError:
            return web.json_response({"error": f"room {room}: prefill not done"}, status=504)
        return web.json_response({"room": room, "tokens": tokens, "engine": self.cfg.engine_id})

    async def _fetch_room(self, host: str, port: int, room: int) -> None:
        url = f"http://{host}:{port}/sim/kv/{room}"
        async with self._session.get(url, timeout=ClientTimeout(total=self.cfg.bootstrap_timeout + 10)) as resp:
            if resp.status != 200:
                raise web.HTTPBadGateway(text=f"bootstrap {url}: {resp.status} {await resp.text()}")

    # ---- generation -----------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        cfg = self.cfg
        if self.draining and cfg.flavor == "vllm":
            # EngineCore._reject_add_in_shutdown: a new request is aborted at once
            return _err(503, "the engine is shutting down", "ServiceUnavailableError")
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _err(400, "request body is not JSON", "BadRequestError")
        if not isinstance(body, dict):
            return _err(400, "request body must be a JSON object", "BadRequestError")
        model = body.get("model")
        # vLLM refuses a model it does not serve (404); SGLang 0.5.23's chat and completions
        # handlers never compare it (only /v1/responses and /v1/models/{model} answer 404)
        if (cfg.flavor == "vllm" and model is not None and model not in (cfg.served_names or [cfg.model])
                and model != cfg.model):
            return _err(404, f"The model `{model}` does not exist.", "NotFoundError")
        if chat:
            if not isinstance(body.get("messages"), list):
                return _err(400, "messages is required", "BadRequestError")
            n_prompt = chat_tokens(body["messages"])
        else:
            if "prompt" not in body:
                return _err(400, "prompt is required", "BadRequestError")
            n_prompt = prompt_tokens_of(body["prompt"])
        room_left = cfg.max_model_len - n_prompt
        if room_left < 1:
            return _err(400, f"This model's maximum context length is {cfg.max_model_len} tokens; "
                        f"the prompt has {n_prompt}", "BadRequestError")
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is None:
            max_tokens = min(cfg.default_max_tokens, room_left)
        try:
            max_tokens = int(max_tokens)
        except (TypeError, ValueError):
            return _err(400, "max_tokens must be an integer", "BadRequestError")
        if max_tokens < 1 or max_tokens > room_left:
            return _err(400, f"max_tokens={max_tokens} out of range (1..{room_left})", "BadRequestError")

        if (cfg.flavor == "vllm" and cfg.max_queued_reqs is not None
                and self.engine.num_running + self.engine.num_waiting + 1 > cfg.max_queued_reqs):
            self.sink.admission_rejected("max_num_queued_reqs")
            return _err(503, "The engine is currently busy and cannot accept new requests. "
                        "Please try again later or on a different instance.", "ServiceUnavailableError")
        req = SimRequest(n_prompt, max_tokens, id=request.headers.get("X-Request-Id") or uuid.uuid4().hex)
        if cfg.flavor == "sglang":
            # SGLang's latencies start at the tokenizer's receipt (req_time_stats.py, created_time)
            req.received = self.engine.clock.now()
            req.stream = bool(body.get("stream"))
            if cfg.role == "decode" and not req.stream:
                # its first output is batched (output_streamer.py: every SGLANG_FORCE_STREAM_INTERVAL
                # tokens, or the end), and only a prefill worker stamps the first token's time
                req.ttft_token = SGLANG_FORCE_STREAM_INTERVAL
        response_kv: Optional[dict] = None
        room: Optional[int] = None
        if cfg.flavor == "vllm":
            ktp = body.get("kv_transfer_params")
            if isinstance(ktp, dict) and ktp.get("do_remote_decode"):
                req.prefill_only = True
                response_kv = None  # filled when done
            elif isinstance(ktp, dict) and ktp.get("do_remote_prefill") and ktp.get("remote_engine_id"):
                req.kv_transfer = True
                if self._kv_fails():  # kv_load_failure_policy "fail": finish_reason error -> GenerationError 500
                    return _err(500, "Internal server error", "InternalServerError")
        else:
            room = body.get("bootstrap_room")
            if isinstance(room, list):
                room = room[0] if room else None
            if room is not None and cfg.role == "prefill":
                req.prefill_only = True
            elif room is not None and cfg.role == "decode":
                host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
                if isinstance(host, list):
                    host, port = host[0], port[0]
                # SGLang's decode pod holds a request in its prealloc queue until KV memory is
                # reserved, then in its transfer queue while the prefill runs and its KV comes
                # (disaggregation/decode.py): the sim reserves after the prefill, so this wait,
                # the prefill's, is the transfer queue's
                self.fetching += 1
                try:
                    await self._fetch_room(host, int(port), int(room))
                except web.HTTPException as exc:
                    return _err(502, exc.text or "bootstrap failed", "InternalServerError")
                finally:
                    self.fetching -= 1
                req.kv_transfer = True
                if self._kv_fails():  # decode.py: prepare_abort(..., INTERNAL_SERVER_ERROR)
                    return _err(500, f"KV transfer failed for request rank=0 req.rid={req.id} bootstrap_room={room}",
                                "InternalServerError")

        tokens: asyncio.Queue = asyncio.Queue()
        req.on_token = lambda r, t: tokens.put_nowait(r.generated)
        req.on_finish = lambda r, t: tokens.put_nowait(None)
        try:
            self.engine.add(req)
        except ValueError as exc:
            return _err(400, str(exc), "BadRequestError")
        self.inflight[req] = tokens
        prev_finish = req.on_finish

        def finished(r, t, _prev=prev_finish):
            self.inflight.pop(r, None)
            _prev(r, t)
        req.on_finish = finished
        if req.prefill_only:
            if cfg.flavor == "vllm":
                response_kv = {
                    "do_remote_prefill": True, "do_remote_decode": False,
                    "remote_engine_id": cfg.engine_id,
                    "remote_block_ids": list(range(math.ceil(n_prompt / 16))),
                    "remote_host": cfg.side_channel_host, "remote_port": cfg.side_channel_port,
                    "tp_size": cfg.tp,
                }
            if room is not None:
                prev = req.on_finish
                fut = self._room(int(room))

                def done(r, t, _prev=prev, _fut=fut):
                    if not _fut.done():
                        _fut.set_result(r.prompt_tokens)
                    _prev(r, t)
                req.on_finish = done

        rid = ("chatcmpl-" if chat else "cmpl-") + req.id
        created = int(time.time())
        name = model or cfg.served_name
        usage = lambda n: {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}  # noqa: E731
        stream = bool(body.get("stream"))
        try:
            if not stream:
                n, fin = 0, "length"
                while (item := await tokens.get()) is not None:
                    if item is ABORTED:
                        fin = "abort"
                        break
                    n = item
                text = "".join(" " + WORDS[i % len(WORDS)] for i in range(n))
                choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                           "finish_reason": fin} if chat else
                          {"index": 0, "text": text, "logprobs": None, "finish_reason": fin})
                out = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                       "model": name, "choices": [choice], "usage": usage(n)}
                if response_kv is not None:
                    out["kv_transfer_params"] = response_kv
                return web.json_response(out)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            obj = "chat.completion.chunk" if chat else "text_completion"

            def chunk(choices: list, extra: Optional[dict] = None) -> bytes:
                c = {"id": rid, "object": obj, "created": created, "model": name, "choices": choices}
                if extra:
                    c.update(extra)
                return b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n"

            n = 0
            if chat:
                await resp.write(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]))
            while (item := await tokens.get()) is not None:
                if item is ABORTED:  # the engine aborted it: no more tokens
                    await resp.write(chunk([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "abort"} if chat
                                            else {"index": 0, "text": "", "logprobs": None, "finish_reason": "abort"}]))
                    break
                word = " " + WORDS[(item - 1) % len(WORDS)]
                n = item
                last = n >= req.max_tokens
                fin = "length" if last else None
                choice = ({"index": 0, "delta": {"content": word}, "logprobs": None, "finish_reason": fin} if chat
                          else {"index": 0, "text": word, "logprobs": None, "finish_reason": fin})
                await resp.write(chunk([choice], {"kv_transfer_params": response_kv} if (last and response_kv) else None))
            if (body.get("stream_options") or {}).get("include_usage"):
                await resp.write(chunk([], {"usage": usage(n)}))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except (asyncio.CancelledError, ConnectionResetError):
            self.engine.abort(req)
            raise
        finally:
            self.inflight.pop(req, None)
