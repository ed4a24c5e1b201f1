"""The routed agent on Ray Serve: an OpenAI-compatible ingress -> a router -> one LLM deployment holding every adapter.

- ``ChatIngress`` (FastAPI): ``POST /v1/chat/completions``, ``GET /v1/models``,
  ``GET /healthz``. It checks the API key, the body size and the request
  (``openai_chat.py``), turns the model name into an adapter (``<base>``: the
  base model, ``<base>:<adapter>``: that adapter, ``<base>:auto`` or no
  model: the router's choice; ``<base>:moe``: the LoRA mixture of experts)
  and answers in OpenAI format, naming the adapter that answered in the
  ``adapter`` field and the ``X-Trace-Ray-Adapter`` header. Streamed replies
  send each piece of text as the engine samples it; stop strings end the
  generation. Over ``serve.max_concurrent_requests`` a request gets 429 with
  ``Retry-After``; a reply unfinished after ``serve.request_timeout_s`` gets
  504 and its generation stops. A request whose LLM or router replica dies
  is sent again (the Serve router picks a live replica, or waits for the
  replacement) up to ``serve.replica_retries`` times within the timeout, as is
  a stream that has shown no text yet; a stream cut after showing text ends
  with an error event. Every replica being removed drains: it takes no new
  request and finishes those it holds (up to ``serve.request_timeout_s``).
- ``ConversationRouter``: the run's router (``build_router``). It routes a
  conversation by its first user turn, once: HTTP is stateless, so decisions
  are kept in an LRU cache keyed by a hash of the system messages and the
  first user message, and every later turn gets the same adapter. Each
  ingress replica keeps the decisions it got too, so a later turn reaching
  the same replica does not call the router.
- ``ChatLLM``: the engine with the base model and every adapter of
  ``run_dir/adapters/``. Prompts are rendered and replies parsed by the agent
  prompt, as in collection and training, so what is served is what was trained.
  With ``router=moe`` a second ``ChatLLM`` deployment (``ChatMoE``) holds the
  base model gated per token over the adapters (``run_dir/router/moe``) and
  answers ``<base>:moe`` and ``<base>:auto``.

``build_app(config, run_dir)`` binds the three; ``app_builder(args)`` is the
import path of a Serve config file (``serve deploy``).
"""

# No ``from __future__ import annotations`` here: FastAPI (0.165 and later) reads the ingress methods'
# annotations at runtime and takes a string ``Request`` for a body parameter (every call then answers 422).

import asyncio
import dataclasses
import hashlib
import hmac
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentResponseGenerator
from starlette.exceptions import HTTPException

from environments.errors import TraceRayError
from serve_apps.openai_chat import (
    AUTO,
    BASE,
    MOE,
    STREAM_END,
    ChatRequest,
    ReplyText,
    RequestError,
    chat_completion,
    closing_chunks,
    content_chunk,
    conversation_key,
    first_chunk,
    first_observation,
    model_ids,
    parse_chat_request,
    reply_message,
    resolve_model,
    server_sent_event,
    stream_head,
)
from trace_ray.agent_prompt import AgentPrompt
from trace_ray.config import ServeConfig, TraceConfig
from trace_ray.config_compose import compose_config
from trace_ray.engines import SamplingParams, make_engine
from trace_ray.models import load_model
from trace_ray.routing.adapters import read_peft_folder, served_adapters
from trace_ray.routing.lora_moe import moe_engine
from trace_ray.routing.routers import build_router

APP_NAME = "routed_agent"
IMPORT_PATH = "serve_apps.routed_agent:app_builder"
ADAPTER_HEADER = "X-Trace-Ray-Adapter"
ADAPTER_VERSION = 1
INGRESS_CPUS = 0.1  # the ingress only parses and forwards
INGRESS_HEADROOM = 64  # requests the ingress takes beyond serve.max_concurrent_requests, each only to answer 429
CONSTRUCTOR_RETRIES = 3  # a replica that cannot load its model fails fast instead of Serve's 20 tries
RESEND_PAUSE_S = 0.1  # the pause before a request whose replica died is sent again, doubled at each death
DRAIN_CHECK_S = 0.5  # how often a replica being removed checks whether its requests have finished
# how often Serve checks each replica: a dead one is noticed (and replaced) within this (Serve: 10 s)
HEALTH_CHECK_S = 2

api = FastAPI(title="trace-ray routed agent")


@api.exception_handler(RequestError)
async def _request_error(_: Request, error: RequestError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


@api.exception_handler(HTTPException)
async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
    message = (
        f"{request.method} {request.url.path}: {error.detail}; use POST /v1/chat/completions, GET /v1/models or "
        "GET /healthz"
    )
    code = "not_found" if error.status_code == 404 else None
    return JSONResponse(RequestError(error.status_code, message, code).body(), status_code=error.status_code)


class RouteCache:
    """Routing decisions by conversation key, the least recently used dropped beyond ``size``."""

    def __init__(self, size: int):
        self.size = size
        self.decisions: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str) -> str | None:
        if key in self.decisions:
            self.decisions.move_to_end(key)
        return self.decisions.get(key)

    def put(self, key: str, choice: str) -> str:
        self.decisions[key] = choice
        self.decisions.move_to_end(key)
        while len(self.decisions) > self.size:
            self.decisions.popitem(last=False)
        return choice


@serve.deployment(max_constructor_retry_count=CONSTRUCTOR_RETRIES)
class ChatLLM:
    """The base model and every adapter in one engine; each request names its adapter or none.

    With ``moe=True`` the engine's base model is the LoRA mixture of experts
    of ``run_dir/router/moe`` (every adapter gated per token, the HF engine),
    as ``trace-ray evaluate`` plays it; requests then name no adapter.
    """

    def __init__(self, config: TraceConfig, adapters: list, moe: bool = False):
        import torch

        torch.set_num_threads(config.serve.llm_threads or os.cpu_count() or 1)
        if moe:
            self.engine = moe_engine(config.model, config.engine, adapters, Path(config.run_dir) / "router" / "moe")
        else:
            self.engine = make_engine(config.model, config.engine)
            for adapter in adapters:
                self.engine.load_adapter(adapter.name, ADAPTER_VERSION, *read_peft_folder(adapter.folder))
        self.prompt = AgentPrompt.for_model(config.model, self.engine.tokenizer)
        self.max_context_tokens = config.model.max_context_tokens

    async def generate_stream(self, chat: ChatRequest, adapter: str | None):
        """The reply to ``chat`` from ``adapter`` (None: the base model) as it is generated.

        Yields ``{"prompt_tokens"}`` once the request is accepted, then
        ``{"delta": text}`` as the reply's text becomes safe to show
        (``ReplyText``), then ``{"final": ...}``: the OpenAI message, finish
        reason and token counts. Leaving early (a gone client, a timeout)
        ends the generation at its next token.
        """
        prompt_ids = self.prompt.prompt_ids(chat.messages, chat.tools, [])
        if len(prompt_ids) + chat.max_tokens > self.max_context_tokens:
            raise RequestError(
                400,
                f"the prompt is {len(prompt_ids)} tokens and max_tokens {chat.max_tokens}: over the model's "
                "context of "
                f"{self.max_context_tokens} tokens; shorten the conversation or lower max_tokens",
                "context_length_exceeded",
            )
        loop, tokens, ended = asyncio.get_running_loop(), asyncio.Queue(), threading.Event()

        def on_token(token: int) -> bool:  # the engine's thread
            loop.call_soon_threadsafe(tokens.put_nowait, token)
            return not ended.is_set()

        params = SamplingParams(chat.temperature, chat.top_p, chat.max_tokens, chat.seed)
        future = self.engine.submit(prompt_ids, params, (adapter, ADAPTER_VERSION) if adapter else None, on_token)
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(tokens.put_nowait, None))
        text, ids = ReplyText(chat.stop, bool(chat.tools)), []
        try:
            yield {"prompt_tokens": len(prompt_ids)}
            while (token := await tokens.get()) is not None:
                ids.append(token)
                delta = text.update(self.engine.tokenizer.decode(ids, skip_special_tokens=True))
                if text.stopped:
                    ended.set()
                if delta:
                    yield {"delta": delta}
            generation = future.result()
        finally:
            ended.set()
        turn = sum(message["role"] == "assistant" for message in chat.messages)
        reply_text, stopped = text.cut(self.engine.tokenizer.decode(generation.token_ids, skip_special_tokens=True))
        yield {
            "final": {
                "reply": reply_message(self.prompt.parse_text(reply_text, turn=turn), reply_text, bool(chat.tools)),
                "finish_reason": "stop" if stopped else generation.finish_reason,
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(generation.token_ids),
                "sent": text.sent,
            }
        }

    async def generate(self, chat: ChatRequest, adapter: str | None) -> dict:
        """The finished reply (the last event of :meth:`generate_stream`)."""
        async for event in self.generate_stream(chat, adapter):
            final = event.get("final")
        return final


@serve.deployment(max_constructor_retry_count=CONSTRUCTOR_RETRIES)
class ConversationRouter:
    """The run's router, deciding each conversation's adapter once from its first user turn."""

    def __init__(self, config: TraceConfig, adapters: list):
        import torch

        # Ray gives a fractional-CPU actor one thread
        torch.set_num_threads(config.serve.router_threads or os.cpu_count() or 1)
        model, tokenizer = load_model(config.model)
        if config.serve.router_num_gpus > 0:
            model = model.to("cuda")
        self.router = build_router(config, Path(config.run_dir), model, tokenizer, adapters)
        self.decisions = RouteCache(config.serve.route_cache_size)

    async def route(self, messages: list[dict]) -> str:
        """The adapter (or ``base``) for the conversation ``messages`` belongs to."""
        key = conversation_key(messages)
        choice = self.decisions.get(key)
        if choice is None:
            decision = await asyncio.to_thread(self.router.route, first_observation(messages))
            choice = self.decisions.put(key, decision.choice)
        return choice


# defined before the ingress: serve.ingress pickles the FastAPI app, and what it calls, when it decorates the class
def too_large(size: int, limit: int, read_so_far: bool = False) -> RequestError:
    size_text = f"more than {limit} bytes (reading stopped at {size})" if read_so_far else f"{size} bytes"
    return RequestError(
        413,
        f"the request body is {size_text}, over this server's limit of {limit} "
        "(serve.max_request_bytes); "
        "send a shorter conversation or raise the limit",
        "request_too_large",
    )


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def failure(exc: Exception, what: str, code: str) -> RequestError:
    """An unexpected error of a deployment as a 500 in OpenAI's error JSON (its last line, never a traceback)."""
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
    return RequestError(500, f"{what} failed ({first_line[:200]}); see the Serve logs and retry", code, "server_error")


class ReplicaDeaths:
    """The replicas that died while answering one request: after each, a short pause (doubled each time) before the
    request is sent again, unless that would pass ``serve.replica_retries`` resends or the request's deadline."""

    def __init__(self, limits: ServeConfig, deadline: float):
        self.limits, self.deadline, self.count = limits, deadline, 0

    async def pause_before_resending(self, exc: RayActorError, what: str) -> None:
        pause = RESEND_PAUSE_S * 2**self.count
        self.count += 1
        if self.count > self.limits.replica_retries or time.monotonic() + pause >= self.deadline:
            raise RequestError(
                503,
                f"{what} failed: {self.count} replica(s) died while answering ({type(exc).__name__}); Serve "
                "replaces them: retry "
                "in a few seconds, and run more replicas (serve.llm_replicas) or allow more resends "
                "(serve.replica_retries)",
                "replica_unavailable",
                "server_error",
                {"Retry-After": str(self.limits.retry_after_s)},
            )
        await asyncio.sleep(pause)


@serve.deployment
@serve.ingress(api)
class ChatIngress:
    def __init__(self, config: TraceConfig, adapters: list[str], api_key_digest: str | None, llm, router, moe):
        self.limits = config.serve
        self.sampling = config.model.sampling
        self.base = config.model.name
        self.adapters = adapters
        self.api_key_digest = api_key_digest
        self.llm = llm
        self.router = router
        self.moe = moe  # the LoRA MoE's LLM deployment (router=moe), or None
        self.routed = router is not None or moe is not None
        self.decisions = RouteCache(config.serve.route_cache_size)  # this replica's: later turns skip the router's hop
        self.in_flight = 0

    def _authorize(self, request: Request) -> None:
        if self.api_key_digest is None:
            return
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        variable = self.limits.api_key_env
        if scheme.lower() != "bearer" or not key.strip():
            raise RequestError(
                401,
                "missing API key; send the header 'Authorization: Bearer <key>' with the key set "
                f"in {variable} on the server",
                "missing_api_key",
                "authentication_error",
            )
        if not hmac.compare_digest(key_digest(key.strip()), self.api_key_digest):
            raise RequestError(
                401,
                f"wrong API key; send the key set in {variable} on the server as 'Authorization: Bearer <key>'",
                "invalid_api_key",
                "authentication_error",
            )

    async def _body(self, request: Request) -> bytes:
        """The body, read no further than the limit: a declared, chunked or understated length over it is a 413."""
        limit = self.limits.max_request_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_large(int(declared), limit)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_large(len(body), limit, read_so_far=True)
        return bytes(body)

    async def _route(self, messages: list[dict], deaths: ReplicaDeaths) -> str:
        if self.moe is not None:
            return MOE
        if self.router is None or first_observation(messages) is None:
            return BASE
        key = conversation_key(messages)
        choice = self.decisions.get(key)
        if choice is None:  # new to this replica: the router decides, or recalls another replica's decision
            _, decided = await self._sent(
                lambda: self.router.route.remote(messages), deaths, "routing", "routing_failed"
            )
            choice = self.decisions.put(key, decided)
        return choice

    async def _sent(self, send, deaths: ReplicaDeaths, what: str, code: str):
        """``(call, answer)``: the deployment call ``send()`` makes and its result (a stream: its first event) by the
        deadline; whenever the replica answering it dies, the call is made again and Serve routes it to a live
        replica."""
        while True:
            call = send()
            try:
                return call, await self._by_deadline(call, deaths.deadline, what, code)
            except RayActorError as exc:
                await deaths.pause_before_resending(exc, what)

    async def _by_deadline(self, call, deadline: float, what: str, code: str):
        """The result of ``call`` (a stream: its next event) by the deadline, a timeout cancelling it; a dead replica's
        error
        is raised as it is, any other unexpected error as a 500."""
        pending = call.__anext__() if isinstance(call, DeploymentResponseGenerator) else call
        try:
            return await asyncio.wait_for(pending, max(deadline - time.monotonic(), 0))
        except TimeoutError:
            call.cancel()
            raise self._timed_out() from None
        except (RequestError, StopAsyncIteration, RayActorError):
            raise
        except Exception as exc:
            raise failure(exc, what, code) from None

    def _admit(self) -> None:
        """Count the request in, or refuse it with 429 when this replica already answers its limit."""
        limit = self.limits.max_concurrent_requests
        if self.in_flight >= limit:
            retry = self.limits.retry_after_s
            raise RequestError(
                429,
                f"this server is answering {limit} requests (serve.max_concurrent_requests); retry after {retry} s",
                "rate_limit_exceeded",
                "rate_limit_error",
                {"Retry-After": str(retry)},
            )
        self.in_flight += 1

    def _timed_out(self) -> RequestError:
        timeout = self.limits.request_timeout_s
        return RequestError(
            504,
            f"the reply took longer than {timeout} s (serve.request_timeout_s); ask for fewer max_tokens or retry",
            "request_timeout",
            "server_error",
        )

    @api.get("/healthz")
    async def healthz(self) -> dict:
        return {"status": "ok"}

    @api.get("/v1/models")
    async def models(self, request: Request) -> dict:
        self._authorize(request)
        ids = model_ids(self.base, self.adapters, self.routed, moe=self.moe is not None)
        return {
            "object": "list",
            "data": [{"id": name, "object": "model", "created": 0, "owned_by": "trace-ray"} for name in ids],
        }

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        self._authorize(request)
        self._admit()
        deaths = ReplicaDeaths(self.limits, time.monotonic() + self.limits.request_timeout_s)
        try:
            chat = parse_chat_request(await self._body(request), self.limits, self.sampling)
            adapter = resolve_model(chat.model, self.base, self.adapters, self.routed, moe=self.moe is not None)
            if adapter == AUTO:
                adapter = await self._route(chat.messages, deaths)
            llm, served = (self.moe, None) if adapter == MOE else (self.llm, None if adapter == BASE else adapter)
            model = self.base if adapter == BASE else f"{self.base}:{adapter}"
            headers = {ADAPTER_HEADER: adapter}
            if chat.stream:  # accepted (or refused with its status) once the first event came, before streaming begins
                start = partial(llm.options(stream=True).generate_stream.remote, chat, served)
                events, _ = await self._sent(start, deaths, "generation", "generation_failed")
                stream = self._stream(events, start, deaths, stream_head(model, adapter))
                return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
            _, result = await self._sent(
                lambda: llm.generate.remote(chat, served), deaths, "generation", "generation_failed"
            )
        except BaseException:
            self.in_flight -= 1
            raise
        self.in_flight -= 1
        completion = chat_completion(
            result["reply"],
            result["finish_reason"],
            model,
            adapter,
            result["prompt_tokens"],
            result["completion_tokens"],
        )
        return JSONResponse(completion, headers=headers)

    async def _stream(self, events, start, deaths: ReplicaDeaths, head: dict):
        """The server-sent events of a streamed reply: each text piece as the engine writes it, then the rest and the
        finish.

        A replica that dies before any text was shown is replaced by calling ``start()`` again (the client has seen
        only the role, which every reply begins with); after that the stream ends with an error event."""
        try:
            yield server_sent_event(first_chunk(head))
            shown = False
            while True:
                try:
                    event = await self._by_deadline(events, deaths.deadline, "generation", "generation_failed")
                except RayActorError as exc:
                    if shown:
                        raise RequestError(
                            502,
                            "the replica generating this reply died after part of it was sent "
                            f"({type(exc).__name__}); "
                            "a reply cannot be resumed: send the request again",
                            "replica_died",
                            "server_error",
                        ) from None
                    await deaths.pause_before_resending(exc, "generation")
                    events, _ = await self._sent(start, deaths, "generation", "generation_failed")
                    continue
                if "delta" in event:
                    shown = True
                    yield server_sent_event(content_chunk(head, event["delta"]))
                    continue
                final = event["final"]
                for chunk in closing_chunks(head, final["reply"], final["finish_reason"], final["sent"]):
                    yield server_sent_event(chunk)
                break
        except RequestError as error:
            yield server_sent_event(error.body())
        finally:
            self.in_flight -= 1
            events.cancel()  # a client that left stops the generation
        yield STREAM_END


@dataclass
class ServePlan:
    adapters: list  # TrainedAdapter: every PEFT folder of run_dir/adapters/, the routable (described) ones first
    router: str  # the router in use: config.router.name, or "none" when it is none or no adapter has a description

    @property
    def routable(self) -> list:
        return [adapter for adapter in self.adapters if adapter.description]


def serve_plan(config: TraceConfig, run_dir: Path) -> ServePlan:
    """The adapters ``run_dir`` serves and the router in use; a missing adapters folder under a router is a one-line
    error."""
    folder = run_dir / "adapters"
    if config.router.name != "none" and not folder.is_dir():
        raise TraceRayError(
            f"router={config.router.name} routes between the adapters in {folder}, which does not "
            "exist; "
            f"run trace-ray train run_dir={run_dir} first or serve the base model with router=none"
        )
    adapters = served_adapters(run_dir)
    for adapter in adapters:
        if adapter.name in (BASE, AUTO, MOE):
            raise TraceRayError(
                f"adapter folder {adapter.folder} is named {adapter.name!r}, which model names "
                "reserve; rename the folder"
            )
    plan = ServePlan(adapters, config.router.name)
    return plan if plan.routable else dataclasses.replace(plan, router="none")


def _replicas(settings: ServeConfig, count: int, autoscaled: bool = True) -> dict:
    """The replica count (or ``serve.autoscaling``) of a deployment, its health checks, and its drain: a replica being
    removed (scale-down, redeploy) takes no new request and finishes those it holds, which end by
    ``serve.request_timeout_s``."""
    scaling = settings.autoscaling if autoscaled else None
    lifecycle = {
        "health_check_period_s": HEALTH_CHECK_S,
        "graceful_shutdown_timeout_s": settings.request_timeout_s,
        "graceful_shutdown_wait_loop_s": DRAIN_CHECK_S,
    }
    if scaling is None:
        return {"num_replicas": count, **lifecycle}
    return {"autoscaling_config": dataclasses.asdict(scaling), **lifecycle}


def build_app(config: TraceConfig, run_dir: Path):
    """The routed agent as a Serve application over ``run_dir``'s adapters (``serve.run`` it)."""
    run_dir = Path(run_dir)
    config = dataclasses.replace(config, run_dir=str(run_dir))
    plan = serve_plan(config, run_dir)
    settings = config.serve
    llm = ChatLLM.options(
        **_replicas(settings, settings.llm_replicas),
        max_ongoing_requests=settings.max_ongoing_requests,
        ray_actor_options={"num_cpus": settings.llm_num_cpus, "num_gpus": settings.llm_num_gpus},
    ).bind(config, plan.adapters)
    router = moe = None
    if plan.router == "moe":  # the MoE answers <base>:auto and <base>:moe itself: no per-conversation router
        moe = ChatLLM.options(
            name="ChatMoE",
            **_replicas(settings, settings.llm_replicas),
            max_ongoing_requests=settings.max_ongoing_requests,
            ray_actor_options={"num_cpus": settings.llm_num_cpus, "num_gpus": settings.llm_num_gpus},
        ).bind(config, plan.routable, moe=True)
    elif plan.router != "none":
        router = ConversationRouter.options(
            **_replicas(settings, settings.router_replicas, autoscaled=False),
            max_ongoing_requests=settings.max_ongoing_requests,
            ray_actor_options={"num_cpus": settings.router_num_cpus, "num_gpus": settings.router_num_gpus},
        ).bind(config, plan.routable)
    api_key = os.environ.get(settings.api_key_env, "").strip()
    return ChatIngress.options(  # Serve queues no request at the ingress: over its own limit it answers 429 at once
        **_replicas(settings, settings.ingress_replicas),
        max_ongoing_requests=settings.max_concurrent_requests + INGRESS_HEADROOM,
        ray_actor_options={"num_cpus": INGRESS_CPUS},
    ).bind(config, [a.name for a in plan.adapters], key_digest(api_key) if api_key else None, llm, router, moe)


def app_builder(args: dict):
    """The application of a Serve config file: ``args`` holds ``run_dir`` and ``overrides`` (Hydra overrides of
    conf/)."""
    run_dir = args.get("run_dir")
    if not run_dir:
        raise TraceRayError(
            "the Serve config's args need run_dir: <the run directory>; regenerate it with trace-ray serve run_dir=DIR "
            "serve.config_out=PATH"
        )
    config = compose_config("serve", [*args.get("overrides", []), f"run_dir={run_dir}"])
    return build_app(config, Path(run_dir))
