"""``trace-ray serve run_dir=DIR``: the routed agent as an OpenAI-compatible endpoint on Ray Serve.

Starts a local Ray (or joins ``ray.address``), runs the application of
``serve_apps/routed_agent.py`` on ``serve.host:serve.port`` (the base model
and every adapter of ``DIR/adapters/``; ``router=`` picks the router of
``model=<base>:auto``), prints the URL, the models, the router and a curl
example, and serves until SIGINT or SIGTERM. ``serve.config_out=PATH``
instead writes a Serve config file for ``serve deploy PATH`` on a cluster.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from environments.errors import TraceRayError
from trace_ray.artifacts import atomic_path
from trace_ray.config import TraceConfig
from trace_ray.console import console

HELP = (
    "serve the routed agent (base model + every adapter of run_dir/adapters/) as an OpenAI-compatible API on Ray Serve"
)
# set by the CLI, by args.run_dir, or meaningless on the cluster
NOT_RECOMPOSED = ("command", "run_dir", "serve.config_out")


def _hydra_value(value) -> str:
    """``value`` in Hydra's override grammar."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_hydra_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_hydra_value(item) for item in value) + "]"
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    return json.dumps(value)


def _differences(wanted, baseline, prefix: str = "") -> list[str]:
    if isinstance(wanted, dict) and isinstance(baseline, dict):
        return [
            line for key, value in wanted.items() for line in _differences(value, baseline.get(key), f"{prefix}{key}.")
        ]
    key = prefix[:-1]
    return [] if wanted == baseline or key in NOT_RECOMPOSED else [f"{key}={_hydra_value(wanted)}"]


def config_overrides(config: TraceConfig) -> list[str]:
    """Hydra overrides that recompose ``config`` from conf/: its group options, then every value that differs from
    theirs."""
    from hydra import compose, initialize_config_dir

    from trace_ray.config_compose import CONF_DIR, config_groups

    groups = [
        f"{group}={getattr(config, group).name}"
        for group, options in config_groups().items()
        if getattr(getattr(config, group, None), "name", None) in options
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        composed = compose("config", overrides=[*groups, f"command={config.command}"])
    baseline = OmegaConf.to_container(composed, resolve=True, throw_on_missing=False)
    return groups + _differences(OmegaConf.to_container(OmegaConf.structured(config)), baseline)


def write_serve_config(config: TraceConfig, path: Path) -> None:
    """A Serve config file running the routed agent with ``config`` (``serve deploy PATH``)."""
    from serve_apps.routed_agent import APP_NAME, IMPORT_PATH

    document = {
        "http_options": {"host": config.serve.host, "port": config.serve.port},
        "applications": [
            {
                "name": APP_NAME,
                "route_prefix": "/",
                "import_path": IMPORT_PATH,
                "args": {"run_dir": str(Path(config.run_dir).absolute()), "overrides": config_overrides(config)},
            }
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as scratch:
        Path(scratch).write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise TraceRayError(
                f"cannot listen on {host}:{port} ({exc.strerror}); stop what uses the port or pick another with "
                "serve.port=N"
            ) from None


def deployment_error(exc: Exception) -> TraceRayError:
    """A failed deployment as one line: the TraceRayError a replica raised, else the error's last line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    ours = [line.split("TraceRayError:", 1)[1].strip() for line in lines if "TraceRayError:" in line]
    cause = ours[-1] if ours else (lines[-1] if lines else type(exc).__name__)
    return TraceRayError(
        f"the routed agent failed to start: {cause}"
        + ("" if ours else "; see the Serve logs (ray logs) and fix the config")
    )


def say(text: str) -> None:
    console.print(text, markup=False, soft_wrap=True)  # no wrapping: the curl line must stay copyable


def print_summary(config: TraceConfig, plan) -> None:
    from serve_apps.openai_chat import model_ids

    base, url, variable = config.model.name, f"http://{config.serve.host}:{config.serve.port}", config.serve.api_key_env
    routed = plan.router != "none"
    key_set = bool(os.environ.get(variable, "").strip())
    body = json.dumps(
        {
            "model": f"{base}:auto" if routed else base,
            "messages": [{"role": "user", "content": "Turn on wifi"}],
            "max_tokens": 64,
        }
    )
    auth = f' -H "Authorization: Bearer ${variable}"' if key_set else ""
    served_ids = model_ids(base, [adapter.name for adapter in plan.adapters], routed, moe=plan.router == "moe")
    say(
        "\n".join(
            [
                f"routed agent: {url}/v1 (OpenAI-compatible: POST /v1/chat/completions, GET /v1/models, GET /healthz)",
                f"models: {', '.join(served_ids)}",
                f"router: {plan.router} over {', '.join(a.name for a in plan.routable)} (model={base}:auto or no model)"
                if routed
                else "router=none: serving the base model and forced adapters",
                f"API key: required ({variable})" if key_set else f"API key: none (set {variable} to require one)",
                f"example: curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'",
                "serving until Ctrl-C or SIGTERM",
            ]
        )
    )


def wait_for_stop() -> None:
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass


def run(config: TraceConfig) -> None:
    import ray
    from ray import serve

    from actors.ray_connection import connect_ray
    from serve_apps.routed_agent import APP_NAME, build_app, serve_plan

    if config.serve.config_out:
        path = Path(config.serve.config_out)
        write_serve_config(config, path)
        say(f"wrote {path}; on a cluster whose nodes see {Path(config.run_dir).absolute()}, run: serve deploy {path}")
        return
    run_dir = Path(config.run_dir)
    plan = serve_plan(config, run_dir)
    joining = bool(config.ray.address or os.environ.get("RAY_ADDRESS"))
    if not joining:
        check_port_free(config.serve.host, config.serve.port)
    started = not ray.is_initialized() and not joining
    connect_ray(config)
    try:
        serve.start(http_options={"host": config.serve.host, "port": config.serve.port})
        try:
            serve.run(build_app(config, run_dir), name=APP_NAME, route_prefix="/", blocking=False)
        except RuntimeError as exc:
            raise deployment_error(exc) from None
        print_summary(config, plan)
        wait_for_stop()
    finally:
        if joining:
            serve.delete(APP_NAME)  # other applications on the cluster keep running
        else:
            serve.shutdown()
        if started:
            ray.shutdown()
    say("stopped")
