"""The one writer task: rows queue up in memory and go to SQLite in batched transactions.

Every `INTERVAL_S` (or sooner when `MAX_ROWS` are waiting) the pending batch is written in one transaction
on a dedicated thread (SQLite's fsync must not stall the event loop), then `on_commit(batch, written)` runs on
the loop: progress counts rows only after they are on disk, and only those the store added (`Written`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from fleetgen.generate.ledger.store import BadRow, Batch, ErrorRow, ResultRow, SeriesRow, Store, Written

INTERVAL_S = 0.1  # a batch waits at most this long for more rows
MAX_ROWS = 512  # … or until this many are waiting


class StoreWriter:
    """Batches rows for `store`; `run()` is the writer task, `close()` flushes what is left and stops it."""

    def __init__(
        self,
        store: Store,
        on_commit: Callable[[Batch, Written], None],
        meta: Callable[[], dict[str, str]],
        *,
        replace_truncated: bool = False,  # `--redo-truncated`: a truncated answer is replaced on purpose
    ) -> None:
        self._write = partial(store.write_batch, replace_truncated=replace_truncated)
        self._on_commit = on_commit
        self._meta = meta
        self._batch = Batch()
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._closing = False
        self._last_meta: dict[str, str] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleetgen-store")

    def put(self, *rows: ResultRow | ErrorRow | BadRow | SeriesRow) -> None:
        """Queue rows for the next batch (each to its table)."""
        for row in rows:
            self._batch.add(row)
        self._wake.set()
        if len(self._batch) >= MAX_ROWS:
            self._full.set()

    async def run(self) -> None:
        """Write batches until closed and drained. A write error propagates (the job cannot go on)."""
        loop = asyncio.get_running_loop()
        try:
            while len(self._batch) or not self._closing:
                if not len(self._batch):
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if not self._closing and len(self._batch) < MAX_ROWS:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._full.wait(), INTERVAL_S)
                batch, self._batch = self._batch, Batch()
                self._full.clear()
                batch.meta.update(self._meta())
                self._last_meta = dict(batch.meta)
                written = await loop.run_in_executor(self._pool, self._write, batch)
                self._on_commit(batch, written)
            # The resume position moves on after the last batch commits: persist where it ended up.
            meta = self._meta()
            if meta != self._last_meta:
                await loop.run_in_executor(self._pool, self._write, Batch(meta=meta))
        finally:
            self._pool.shutdown(wait=True)

    def close(self) -> None:
        """Ask `run()` to write what is pending and return."""
        self._closing = True
        self._wake.set()
        self._full.set()
