"""fleetgen.sim — a SIMULATION of an SGLang 0.5.23 server, for tests, benchmarks and rehearsals without GPUs.

Run `python -m fleetgen.sim <SGLang flags> [--sim-* knobs]`. Nothing here loads a model or touches a GPU:
it accepts SGLang's real command line (rebuilt from SGLang's own parser, `sglang_0_5_23_flags.json`), applies
the startup rules fleetgen depends on with SGLang's exact error texts, prints SGLang's startup and decode log
lines, and serves SGLang's HTTP surface (health, server/model info, metrics, OpenAI chat) with synthetic
answers. Its log says SIMULATION on the first line.

Throughput: with `--sim-bandwidth-gbs B` (an H200 is ~4800) a decode step takes a roofline's time over the
bytes it reads, so tokens/s depend on the batch as on a GPU: they grow with the running requests the Mamba
arithmetic admits and saturate; speculative decoding pays its draft passes and state copies
(`SGLANG_SIMULATE_ACC_LEN` forces the accept length, as in SGLang). `--sim-time-scale S` runs the simulated
clock S times faster than the wall's, for quick CI runs (rates seen from outside are then S times the
simulated GPU's). Without a bandwidth, `--sim-decode-tps` paces every request at a fixed rate (0: instant).

Modules: `flags` (parser from data), `extract_flags` (one-off dump of SGLang's parser), `model` (model shape),
`resolve` (startup rules), `memory` (pool arithmetic), `startup` (log lines, failures), `text` (synthetic
generations, test directives, the answer digest), `faults` (whole-server faults: `POST /sim/fault`), `chat`
(request checks, response bodies), `sampling` (SGLang's sampling refusals), `engine` (simulated scheduler),
`stepmodel` (step times), `counters` (numbers, decode log line), `metrics`, `state` (info endpoints),
`server` (aiohttp routes), `run` (the process's life).
"""
