"""HTTP to one engine: health, its own view (/server_info, /v1/models), /metrics, one chat request.

aiohttp errors are translated here, once, into `EndpointError` carrying the URL. Metric text is parsed with
prometheus_client's reference parser; samples are summed over label sets (per-position and per-DP-rank
series add up to the engine-wide figure).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from fleetgen.engines.base import MetricNames
from fleetgen.errors import EndpointError

# A repetitive prompt: n-gram / EAGLE drafts get accepted on it, so a speculative step is observable.
PROBE_PROMPT = "Count: one two three four, one two three four, one two three four, one two three four,"
PROBE_MAX_TOKENS = 24


@dataclass
class EngineClient:
    """A small client for one engine's HTTP surface at `base_url` (the local end of a tunnel, usually)."""

    base_url: str
    session: aiohttp.ClientSession
    api_key: str | None = None
    timeout_s: float = 30.0

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def _request(
        self, method: str, path: str, body: Mapping[str, Any] | None = None
    ) -> tuple[int, str]:
        url = self.base_url.rstrip("/") + path
        try:
            async with self.session.request(
                method,
                url,
                json=body,
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as resp:
                return resp.status, await resp.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EndpointError(
                f"{method} {url} failed: {type(exc).__name__}: {exc}", context={"url": url}
            ) from exc

    async def is_healthy(self, path: str) -> bool:
        """True on HTTP 200; False while the engine refuses connections or answers 503 (still loading)."""
        try:
            status, _ = await self._request("GET", path)
        except EndpointError:
            return False
        return status == 200

    async def get_text(self, path: str) -> str:
        status, text = await self._request("GET", path)
        if status != 200:
            url = self.base_url + path
            raise EndpointError(f"GET {url} answered HTTP {status}", context={"url": url, "body": text[:500]})
        return text

    async def get_json(self, path: str) -> Any:
        text = await self.get_text(path)
        try:
            return json.loads(text)
        except ValueError as exc:
            raise EndpointError(
                f"GET {self.base_url}{path} did not return JSON", context={"body": text[:500]}
            ) from exc

    async def first_json(self, paths: tuple[str, ...]) -> tuple[str, Any]:
        """The first of `paths` that answers JSON (SGLang renamed /get_server_info to /server_info)."""
        errors: list[str] = []
        for path in paths:
            try:
                return path, await self.get_json(path)
            except EndpointError as exc:
                errors.append(exc.message)
        raise EndpointError(
            "the engine's info endpoint did not answer: " + "; ".join(errors), context={"url": self.base_url}
        )

    async def chat(self, model: str, prompt: str = PROBE_PROMPT, max_tokens: int = PROBE_MAX_TOKENS) -> Any:
        """One real chat completion at temperature 0; raises EndpointError unless it returns a choice."""
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        status, text = await self._request("POST", "/v1/chat/completions", body)
        url = self.base_url + "/v1/chat/completions"
        if status != 200:
            raise EndpointError(
                f"the test chat request failed with HTTP {status}", context={"url": url, "body": text[:500]}
            )
        try:
            data = json.loads(text)
            data["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise EndpointError(
                "the test chat request returned no choice", context={"url": url, "body": text[:500]}
            ) from exc
        return data


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {sample name: value summed over label sets}."""
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    except ValueError as exc:
        raise EndpointError(f"unparseable /metrics text: {exc}") from exc
    return totals


def info_labels(text: str, name: str) -> dict[str, str]:
    """The labels of an info-style sample (`vllm:cache_config_info{block_size="800",…} 1.0`); {} if absent."""
    if not name:
        return {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    return dict(sample.labels)
    except ValueError as exc:
        raise EndpointError(f"unparseable /metrics text: {exc}") from exc
    return {}


def capacity_from_metrics(names: MetricNames, text: str) -> dict[str, float]:
    """Capacity the engine exports in /metrics labels (vLLM: KV tokens, max concurrency at max-model-len)."""
    labels = info_labels(text, names.capacity_info)
    found: dict[str, float] = {}
    for label, what in names.capacity_labels:
        try:
            value = float(labels[label])
        except (KeyError, ValueError):
            continue
        if value > 0:
            found[what] = value
    return found


def accept_length(names: MetricNames, samples: Mapping[str, float], info: Any = None) -> float | None:
    """Mean tokens accepted per speculative step, or None when no step happened (or spec is off).

    SGLang: the `spec_accept_length` gauge, else `avg_spec_accept_length` in /server_info's internal states.
    vLLM: 1 + accepted / drafts from the spec-decode counters (its own definition of mean acceptance length).
    """
    if names.spec_accept_length and samples.get(names.spec_accept_length, 0.0) > 0:
        return samples[names.spec_accept_length]
    drafts = samples.get(names.spec_num_drafts_total, 0.0) if names.spec_num_drafts_total else 0.0
    if drafts > 0:
        return 1.0 + samples.get(names.spec_num_accepted_tokens_total, 0.0) / drafts
    for state in internal_states(info):
        value = state.get("avg_spec_accept_length")
        if isinstance(value, int | float) and value > 0:
            return float(value)
    return None


def internal_states(info: Any) -> list[dict[str, Any]]:
    """SGLang's per-DP-rank `internal_states` from /server_info (empty for other engines)."""
    if not isinstance(info, dict):
        return []
    states = info.get("internal_states")
    return [s for s in states if isinstance(s, dict)] if isinstance(states, list) else []
