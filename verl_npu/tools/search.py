"""The search tool of Search-R1 (verl's `SearchTool`; tool config class_name `search` or verl's
`verl.tools.search_tool.SearchTool`): the model asks a retrieval server for documents and reads them.

The model calls `search` with `{"query_list": ["...", ...]}`; the tool POSTs to `retrieval_service_url`
the request of Search-R1's retrieval server::

    {"queries": [...], "topk": <topk>, "return_scores": true}
    -> {"result": [[{"document": {"id": ..., "contents": "<title>\\n<text>"}, "score": ...}, ...], ...]}

(one list of documents per query) and hands the model, as verl does, one JSON object::

    {"result": "Doc 1 (Title: <title>)\\n<text>\\n\\nDoc 2 (Title: ...)\\n...\\n---\\nDoc 1 (Title: ...) ..."}

(a query's documents, numbered, the first line of `contents` as the title; the queries' blocks joined by
`\\n---\\n`). No documents: `{"result": "No search results found."}`. What goes wrong becomes the call's
text, never an exception: a missing or empty `query_list` (`{"result": "Error: 'query_list' is missing,
empty, or not a list in parameters."}`), a server that cannot be reached, times out or answers 5xx
(tried `max_attempts` times, waiting `retry_delay` x the attempt number between tries, as verl's loop),
a 4xx answer or a reply that is not the contract's JSON (`{"result": "Search error: ..."}`).

Config keys (`tool_registry.SEARCH_CONFIG_KEYS`, checked by `verl-npu validate`; an unknown key is
refused by name): verl's `retrieval_service_url` (required), `topk` (3), `timeout` (30 s per request),
`num_workers` (120: this tool's requests in flight at once in one worker process), `rate_limit` (120:
requests in flight at once, all search tools of the process with that rate_limit together) and
`enable_global_rate_limit` (true: apply `rate_limit`); verl-npu's own `max_attempts` (10) and `retry_delay` (1 s). verl's rate limit is
one Ray actor for the whole cluster; here it is per worker process, so N workers may have up to N x
`rate_limit` requests in flight. A server for a local corpus: `verl-npu retrieval-server`
(verl_npu/tools/retrieval_server.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

from verl_npu.registry import TOOLS
from verl_npu.tools.base import BaseTool, ToolResponse

log = logging.getLogger(__name__)

#: verl's defaults
DEFAULTS = {
    "topk": 3,
    "timeout": 30,
    "num_workers": 120,
    "rate_limit": 120,
    "enable_global_rate_limit": True,
    "max_attempts": 10,
    "retry_delay": 1.0,
}
SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Searches the web for relevant information based on the given query.",
        "parameters": {
            "type": "object",
            "properties": {
                "query_list": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "A list of fully-formed semantic queries. The tool will "
                    "return search results for each query.",
                }
            },
            "required": ["query_list"],
        },
    },
}
MISSING_QUERIES = "Error: 'query_list' is missing, empty, or not a list in parameters."
NO_RESULTS = "No search results found."
#: the process's requests in flight (rate_limit), shared by every search tool with enable_global_rate_limit
_GLOBAL_LIMITS: dict[int, threading.BoundedSemaphore] = {}
_GLOBAL_LOCK = threading.Lock()


class SearchFailed(Exception):
    """One request's failure, with whether trying again may help (a connection, timeout or 5xx error)."""

    def __init__(self, message: str, retry: bool):
        super().__init__(message)
        self.retry = retry


def result_text(text: str) -> str:
    """What the model reads: verl's one-key JSON object."""
    return json.dumps({"result": text}, ensure_ascii=False)


def passages_text(documents: list) -> str:
    """One query's documents as verl writes them: `Doc i (Title: <first line>)\\n<the rest>`, blank-line separated."""
    blocks = []
    for i, item in enumerate(documents):
        doc = item.get("document", item) if isinstance(item, dict) else {}
        contents = str(doc.get("contents", "")) if isinstance(doc, dict) else ""
        title, _, text = contents.partition("\n")
        blocks.append(f"Doc {i + 1} (Title: {title})\n{text}")
    return "\n\n".join(blocks).strip()


def post_json(url: str, payload: dict, timeout: float) -> Any:
    """The decoded JSON answer of one POST. Raises SearchFailed (retry: connection refused or reset, a
    timeout, 5xx; no retry: another HTTP error, with the server's message, or an answer that is not JSON)."""
    try:
        request = urllib.request.Request(
            url,
            data=json.dumps(payload).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
    except ValueError as err:
        raise SearchFailed(f"retrieval_service_url {url!r} is not a URL: {err}", retry=False) from None
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the configured URL
            body = response.read()
    except urllib.error.HTTPError as err:
        detail = err.read()[:300].decode(errors="replace").strip()
        raise SearchFailed(
            f"the retrieval server answered HTTP {err.code}" + (f": {detail}" if detail else ""), retry=err.code >= 500
        ) from None
    except TimeoutError:
        raise SearchFailed(f"no answer from {url} within {timeout:g} s", retry=True) from None
    except (urllib.error.URLError, ConnectionError, OSError) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, (TimeoutError, socket.timeout)):
            raise SearchFailed(f"no answer from {url} within {timeout:g} s", retry=True) from None
        raise SearchFailed(f"cannot reach {url}: {reason}", retry=True) from None
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SearchFailed(f"the retrieval server's answer is not JSON ({err}): {body[:200]!r}", retry=False) from None


@TOOLS.register(
    "search",
    function_name=None,
    verl_class_paths=("verl.tools.search_tool.SearchTool",),
    config_check="verl_npu.tool_registry:search_config_problems",
    retrieval_server=True,
    doc="queries a retrieval server over HTTP and replies with the documents found (Search-R1)",
)
class SearchTool(BaseTool):
    """verl's SearchTool (module docstring): `execute(instance_id, {"query_list": [...]})`."""

    def __init__(self, config: dict, tool_schema=None):
        super().__init__(config, tool_schema or SCHEMA)
        from verl_npu.tool_registry import search_config_problems

        problems = search_config_problems(self.config, "config")
        if problems:
            raise ValueError("; ".join(f"{key}: {what}" for key, what in problems))
        props = ((self.tool_schema.model_dump().get("function") or {}).get("parameters") or {}).get("properties") or {}
        if "query_list" not in props:
            raise ValueError(
                "the tool_schema's parameters must have query_list (a list of strings): the search "
                "tool reads its queries there"
            )
        settings = {**DEFAULTS, **{k: v for k, v in self.config.items() if v is not None}}
        self.url = settings["retrieval_service_url"]
        self.topk, self.timeout = int(settings["topk"]), float(settings["timeout"])
        self.max_attempts, self.retry_delay = int(settings["max_attempts"]), float(settings["retry_delay"])
        self._workers = threading.BoundedSemaphore(int(settings["num_workers"]))
        self._global = None
        if settings["enable_global_rate_limit"]:
            with _GLOBAL_LOCK:
                self._global = _GLOBAL_LIMITS.setdefault(
                    int(settings["rate_limit"]), threading.BoundedSemaphore(int(settings["rate_limit"]))
                )
        self._state: dict[str, dict[str, Any]] = {}

    def create(self, instance_id: str | None = None, **kwargs):
        instance_id = instance_id or str(uuid.uuid4())
        self._state[instance_id] = {"response": "", "reward": []}
        return instance_id, ToolResponse()

    def execute(self, instance_id: str, parameters: Any, **kwargs):
        queries = parameters.get("query_list") if isinstance(parameters, dict) else None
        if not queries or not isinstance(queries, list):
            return ToolResponse(text=result_text(MISSING_QUERIES)), 0.0, {"status": "bad_parameters"}
        if not all(isinstance(q, str) and q.strip() for q in queries):
            return (
                ToolResponse(text=result_text("Error: every entry of 'query_list' must be a non-empty string.")),
                0.0,
                {"status": "bad_parameters"},
            )
        text, metrics = self.search(queries)
        self._state.setdefault(instance_id, {"response": "", "reward": []})["reward"].append(text.strip())
        return ToolResponse(text=text), 0.0, metrics

    def search(self, queries: list[str]) -> tuple[str, dict]:
        """(the model's text, metrics) of one batch of queries; never raises."""
        metrics = {"query_count": len(queries), "status": "unknown", "total_results": 0, "api_request_error": None}
        try:
            answer = self._request({"queries": queries, "topk": self.topk, "return_scores": True})
            results = answer.get("result") if isinstance(answer, dict) else None
            if results is None or not isinstance(results, list) or not all(isinstance(r, list) for r in results):
                raise SearchFailed(
                    f"the retrieval server's answer has no 'result' list of document lists: {str(answer)[:200]}",
                    retry=False,
                )
        except SearchFailed as err:
            metrics.update(status="api_error", api_request_error=str(err))
            return result_text(f"Search error: {err}"), metrics
        if not any(results):
            metrics["status"] = "no_results"
            return result_text(NO_RESULTS), metrics
        metrics.update(status="success", total_results=sum(len(r) for r in results))
        return result_text("\n---\n".join(passages_text(r) for r in results)), metrics

    def _request(self, payload: dict) -> Any:
        """post_json within the tool's limits, tried up to max_attempts times while a retry may help."""
        last = None
        for attempt in range(1, self.max_attempts + 1):
            with self._workers, self._global or contextlib.nullcontext():
                try:
                    return post_json(self.url, payload, self.timeout)
                except SearchFailed as err:
                    last = err
            if not last.retry or attempt == self.max_attempts:
                break
            log.warning("search: attempt %d/%d failed (%s); retrying", attempt, self.max_attempts, last)
            time.sleep(self.retry_delay * attempt)
        raise SearchFailed(f"{last} (after {attempt} attempt{'s' if attempt > 1 else ''})", retry=False)

    def calc_reward(self, instance_id: str, **kwargs):
        """The texts this instance's searches returned (verl's SearchTool returns them, not a number)."""
        return list(self._state.get(instance_id, {}).get("reward", []))

    def release(self, instance_id: str, **kwargs) -> None:
        self._state.pop(instance_id, None)
