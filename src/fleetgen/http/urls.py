"""Servers given by URL alone (`--endpoint`), named one way for `run`, `bench` and the dashboard (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BareURLs:
    """Servers given by URL alone (`--endpoint`), with no fleet file: no tunnels, no key, no plan."""

    urls: tuple[str, ...]

    def named(self) -> list[tuple[str, str]]:
        """Each URL with its name (`named_urls`)."""
        return named_urls(self.urls)


def named_urls(urls: Sequence[str]) -> list[tuple[str, str]]:
    """Bare `--endpoint` URLs as (name, URL), for `run`, `bench` and the dashboard alike: each named by its
    address (`host:port`), a URL given again by that address and its place (`host:port#2`)."""
    named: list[tuple[str, str]] = []
    for url in urls:
        address = url.split("://", 1)[-1].rstrip("/")
        seen = sum(1 for _, earlier in named if earlier == url.rstrip("/"))
        named.append((address if not seen else f"{address}#{seen + 1}", url.rstrip("/")))
    return named
