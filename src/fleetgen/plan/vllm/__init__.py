"""vLLM's plan: `memory` (its GPU- and CPU-memory arithmetic, its paged pool), `throughput` (its
settings for a job) and `planner` (its `Planner`)."""
