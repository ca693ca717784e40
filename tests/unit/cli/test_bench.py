"""`fleetgen bench --job`: every request of the sweep samples as `fleetgen run`'s requests for the same job
file do, while bench keeps its own lengths; without a job file it samples greedily, as before."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from fleetgen.bench.stats import BenchLoad
from fleetgen.cli import _TOPICS
from fleetgen.cli.app import app
from fleetgen.cli.bench import sampling_of
from fleetgen.config import JobFile
from fleetgen.generate.work import SamplingParams
from fleetgen.http.request import REQUEST_FIELDS as OWN_FIELDS
from fleetgen.http.request import ChatRequests

TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
# Real sampling knobs of both engines, bench's own fields (which bench must keep), and names no engine knows.
EXTRA_KEYS = st.sampled_from(
    [
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "chat_template_kwargs",
        "separate_reasoning",
        "stop",
        *OWN_FIELDS,
    ]
) | st.text(min_size=1, max_size=12)
JOBS = st.builds(
    JobFile,
    model=st.none() | TEXT,
    max_tokens=st.integers(1, 1 << 20),
    temperature=st.floats(0, 1e3),
    top_p=st.floats(0, 1, exclude_min=True),
    top_k=st.none() | st.integers(-1, 1 << 16),
    seed=st.none() | st.integers(-(1 << 62), 1 << 62),
    samples=st.integers(1, 64),
    thinking=st.booleans(),
    system_prompt=st.none() | TEXT,
    extra_body=st.dictionaries(EXTRA_KEYS, JSON, max_size=6),
)


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in body.items() if key not in OWN_FIELDS}


@given(job=JOBS, model=TEXT, output_len=st.integers(1, 1 << 20))
def test_bench_with_a_job_sends_runs_sampling_and_its_own_lengths(
    job: JobFile, model: str, output_len: int
) -> None:
    params = SamplingParams.of(job)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
    run_body = ChatRequests(model, params.max_tokens, params.sampling).body(messages, 0)  # as the runner
    bench_body = BenchLoad(sampling=params.sampling).requests(model, output_len).body(messages)  # as bench
    assert _sampling(bench_body) == _sampling(run_body)
    # ...and that is the job file's every sampling setting (its extra_body wins, as in `run`):
    expected = {
        "temperature": job.temperature,
        "top_p": job.top_p,
        "chat_template_kwargs": {"enable_thinking": job.thinking},
        **({"top_k": job.top_k} if job.top_k is not None else {}),
        **job.extra_body,
        **({"seed": job.seed} if job.seed is not None else {}),
    }
    assert {k: bench_body[k] for k in expected if k not in OWN_FIELDS} == _sampling(expected)
    # Bench's own fields are bench's, whatever the job file says.
    assert (bench_body["model"], bench_body["max_tokens"]) == (model, output_len)
    assert bench_body["stream"] is True and bench_body["ignore_eos"] is True
    assert bench_body["stream_options"] == {"include_usage": True}
    assert bench_body["messages"] == messages
    # The run's own fields are the run's too: `--max-tokens` is the length, whatever extra_body names.
    assert (run_body["model"], run_body["max_tokens"], run_body["stream"]) == (model, job.max_tokens, False)
    assert run_body["messages"] == messages


@given(thinking=st.none() | st.booleans(), output_len=st.integers(1, 1 << 20))
def test_bench_without_a_job_samples_greedily_as_before(thinking: bool | None, output_len: int) -> None:
    sampling, model = sampling_of(None, thinking)
    body = BenchLoad(sampling=sampling).requests("m", output_len).body([])
    assert model is None and body["temperature"] == 0.0
    assert not {"top_p", "top_k", "seed", "min_p", "separate_reasoning"} & set(body)
    assert body.get("chat_template_kwargs") == (None if thinking is not False else {"enable_thinking": False})
    assert BenchLoad().requests("m", output_len).body([]) == BenchLoad(
        sampling=sampling_of(None, None)[0]
    ).requests("m", output_len).body([])


@pytest.mark.parametrize("flag", [None, True, False])
def test_thinking_flag_overrides_the_job_file_as_in_run(tmp_path: Path, flag: bool | None) -> None:
    job = tmp_path / "job.toml"
    job.write_text('model = "m1"\nthinking = false\ntop_p = 0.5\n', encoding="utf-8")
    sampling, model = sampling_of(job, flag)
    thinking = False if flag is None else flag
    fields = sampling.fields()
    assert model == "m1" and fields["top_p"] == 0.5
    assert fields["chat_template_kwargs"] == {"enable_thinking": thinking}


BAD_JOBS = [
    "top_p = 0\n",
    "temperature = -0.5\n",
    'top_k = "twenty"\n',
    "# ünïcode comment\nseed = 1.5\n",
    "[extra_body]\nmin_p = 0.1\n\n[oops]\nx = 1\n",
    "top_p = 0.9\ntop_p = 0.8\n",  # not TOML
    "samples = 0\nthinking = 'yes please'\n",
]


@pytest.mark.parametrize("text", BAD_JOBS)
def test_a_bad_job_file_is_refused_by_bench_exactly_as_by_run(tmp_path: Path, text: str) -> None:
    for topic in _TOPICS:
        importlib.import_module(f"fleetgen.cli.{topic}")
    job = tmp_path / "job.toml"
    job.write_text(text, encoding="utf-8")
    dead = "http://127.0.0.1:9"  # nothing listens: a refused job file must stop everything before any request
    ran = CliRunner().invoke(
        app,
        ["run", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "o"), "--endpoint", dead, "--job", str(job)],
    )
    bench = CliRunner().invoke(app, ["bench", "-e", dead, "--job", str(job)])
    assert (bench.exit_code, bench.output) == (ran.exit_code, ran.output)
    assert bench.exit_code == 2 and str(job) in bench.output and "127.0.0.1:9" not in bench.output
