"""Chat completions from any OpenAI-compatible endpoint (vLLM's server, this project's serve endpoint, a hosted API).

One client for every stage that asks a model over HTTP (the LLM labeler, LLM
environment synthesis): transport failures are retried with exponential
backoff, and every failure is one line naming the endpoint, the cause and the
config keys that fix it (``<config_key>.base_url`` and so on).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Any

from environments.errors import TraceRayError

ERROR_CHARS = 200


class LLMEndpointError(TraceRayError):
    """The endpoint could not be reached or refused the request; the message names the fix."""


def one_line(text: str, limit: int = ERROR_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _server_message(body: bytes) -> str:
    """The error message of an OpenAI-style error body, else the body itself."""
    text = body.decode("utf-8", errors="replace")
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        return one_line(text)
    error = document.get("error", document) if isinstance(document, dict) else document
    message = error.get("message", error) if isinstance(error, dict) else error
    return one_line(message if isinstance(message, str) else json.dumps(message))


class LLMClient:
    """Chat completions from an OpenAI-compatible endpoint; transport failures retried with exponential backoff."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None,
        *,
        config_key: str,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        response_format: str = "json_schema",
        max_tokens: int | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max(1, max_retries)  # tries in all
        self.backoff_s = backoff_s
        self.response_format = response_format  # json_schema (structured outputs) | json_object | text
        self.max_tokens = max_tokens
        self.config_key = config_key  # the config prefix named in error messages

    def chat(self, messages: list[dict], seed: int, temperature: float, schema: dict | None = None) -> str:
        """The content of the model's answer to ``messages``.

        With ``json_schema`` the answer is constrained to ``schema`` (vLLM's
        structured outputs, hosted APIs' strict mode); with ``json_object`` (or
        no schema) any JSON object is requested; with ``text``, free text.
        """
        request_body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "seed": seed,
            "temperature": temperature,
        }
        if self.response_format == "json_schema" and schema is not None:
            request_body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema},
            }
        elif self.response_format != "text":
            request_body["response_format"] = {"type": "json_object"}
        if self.max_tokens:
            request_body["max_tokens"] = self.max_tokens
        body = json.dumps(request_body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            request = urllib.request.Request(
                f"{self.base_url}/chat/completions", data=body, headers=headers, method="POST"
            )
        except ValueError:
            raise LLMEndpointError(
                f"{self.config_key}.base_url={self.base_url!r} is not a URL; use e.g. http://127.0.0.1:8000/v1"
            ) from None
        reason = ""
        for attempt in range(self.max_retries):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return self._content(response.read())
            except urllib.error.HTTPError as error:
                reason = f"HTTP {error.code}: {_server_message(error.read())}"
                if error.code != 429 and error.code < 500:
                    raise LLMEndpointError(
                        f"the {self.config_key} endpoint {self.base_url} rejected the request ({reason}); "
                        f"fix {self.config_key}.model or the key in the variable {self.config_key}.api_key_env names, "
                        "or shorten the request"
                    ) from None
            except urllib.error.URLError as error:
                reason = self._reason(error.reason)
            except (OSError, http.client.HTTPException) as error:
                reason = self._reason(error)
        raise LLMEndpointError(
            f"cannot reach the {self.config_key} endpoint {self.base_url} ({reason}) after {self.max_retries} tries; "
            f"start the server or fix {self.config_key}.base_url"
        )

    def _reason(self, error: object) -> str:
        if isinstance(error, TimeoutError):
            return f"timed out after {self.timeout_s:g} s"
        if isinstance(error, OSError) and error.strerror:
            return error.strerror
        return one_line(str(error) or type(error).__name__)

    def _content(self, body: bytes) -> str:
        try:
            content = json.loads(body)["choices"][0]["message"]["content"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, IndexError, TypeError):
            raise LLMEndpointError(
                f"the {self.config_key} endpoint {self.base_url} answered without choices[0].message.content; "
                f"point {self.config_key}.base_url at an OpenAI-compatible API (ending in /v1)"
            ) from None
        return content if isinstance(content, str) else ""
