"""fleetgen.sim — a SIMULATION of an SGLang 0.5.23 server, for tests, benchmarks and rehearsals without GPUs.

Run `python -m fleetgen.sim <SGLang flags> [--sim-* knobs]`. Nothing here loads a model or touches a GPU:
it accepts SGLang's real command line (rebuilt from SGLang's own parser, `sglang_0_5_23_flags.json`), applies
the startup rules fleetgen depends on with SGLang's exact error texts, prints SGLang's startup and decode log
lines, and serves SGLang's HTTP surface (health, server/model info, metrics, OpenAI chat) with synthetic
answers. Its log says SIMULATION on the first line.

Modules: `flags` (parser from data), `extract_flags` (one-off dump of SGLang's parser), `model` (model shape),
`resolve` (startup rules), `memory` (pool arithmetic), `startup` (log lines, failures), `text` (synthetic
generations, test directives), `chat` (response bodies), `engine` (simulated scheduler), `metrics`,
`state` (info endpoints), `server` (aiohttp routes), `run` (the process's life).
"""
