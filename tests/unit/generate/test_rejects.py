"""Refusals: one kind whatever its numbers; the job-file key a server's message names (issue 10 item 3).
The end-to-end cases (real sim and vLLM-CPU servers) are tests/integration/generate/test_run_rejected.py."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from fleetgen.generate.rejects import Refusal, Streak, signature, suspects
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


def ids(refusals: list[Refusal]) -> list[str]:
    return [w.record.record_id for _, w, _ in refusals]


def test_a_run_by_send_number_is_held_and_released_once_shown_per_record() -> None:
    streak = Streak(threshold=3)
    for _ in range(6):
        streak.sent()
    assert streak.refused(0, ("a", work(0), refusal("too long: 10 tokens"))) == []
    assert streak.refused(1, ("b", work(1), refusal("too long: 12 tokens"))) == []
    assert not streak.is_the_jobs
    released = streak.refused(2, ("a", work(2), refusal("n must be positive")))  # another kind after 0, 1:
    assert ids(released) == ["r0", "r1"]  # the records' own
    assert streak.refused(4, ("b", work(4), refusal("n must be positive"))) == []
    assert streak.refused(5, ("b", work(5), refusal("n must be positive"))) == []
    assert not streak.is_the_jobs  # 3 is in flight between them: it may yet succeed
    assert streak.refused(3, ("a", work(3), refusal("n must be positive"))) == []
    assert streak.is_the_jobs  # 2, 3, 4, 5: sent in a row, refused alike, whatever order they came back in
    error = streak.error(lambda _: BODY | {"n": 0})
    assert error.exit_code == 2 and "`extra_body.n` in the job file" in error.message
    assert error.context["server says"] == "HTTP 400: n must be positive"
    assert "4 requests sent in a row, by a, b" in str(error.context["refused"])
    assert ids(streak.release()) == ["r2", "r3", "r4", "r5"] and streak.held == {}


def test_refusals_that_arrive_first_wait_for_the_requests_sent_between_them() -> None:
    """The H200 case in small: every other record too long, the refusals back at once, the others in flight
    for minutes. No verdict; each refusal becomes an error row as the successes around it come in."""
    streak = Streak(threshold=3)
    for _ in range(9):
        streak.sent()
    for n in range(0, 9, 2):
        assert streak.refused(n, ("a", work(n), refusal(f"context {n}"))) == []
    assert not streak.is_the_jobs and sorted(streak.held) == [0, 2, 4, 6, 8]
    assert streak.ended(3) == []  # 2..4 cannot be a run now, but 0..2 and 4..6 still can (1 and 5 in flight)
    assert ids(streak.ended(1)) == ["r0", "r2"]
    assert ids(streak.ended(5)) == ["r4"] and ids(streak.ended(7)) == ["r6"]
    assert sorted(streak.held) == [8]  # 8, 9, 10 (not sent yet) may still be a run
    assert ids(streak.release()) == ["r8"]


def test_at_the_end_two_refusals_alike_are_the_jobs_one_is_a_records() -> None:
    """The end rule's test (the dispatcher adds: and nothing succeeded): a small job all refused alike."""
    streak = Streak(threshold=16)
    for _ in range(3):
        streak.sent()
    streak.refused(0, ("a", work(0), refusal("n must be positive")))
    assert not streak.is_one_repeated  # one refused record: its error row
    streak.refused(1, ("a", work(1), refusal("n must be positive")))
    assert streak.is_one_repeated
    assert "2 requests sent in a row" in str(streak.error(lambda _: BODY).context["refused"])
    assert ids(streak.refused(2, ("a", work(2), refusal("too long: 9 tokens")))) == ["r0", "r1"]
    assert not streak.is_one_repeated  # another kind after them: theirs were the records' own


# A send's outcome: refused with one of two signatures, or judged otherwise (a success, retries run out).
Outcome = str | None
REFUSALS = {"x": "n must be positive", "y": "too long: 7 tokens"}


def play(
    data: st.DataObject, outcomes: list[Outcome], threshold: int
) -> tuple[Streak, list[Refusal], list[tuple[set[int], set[int], bool]]]:
    """Send the requests in order and judge them in an order hypothesis draws, sends interleaved with the
    answers any way they can be (a request is judged only once sent). Returns the streak, what it released
    and, after each step, (what it holds, what the oracle says it must hold, whether a run is complete)."""
    streak = Streak(threshold)
    released: list[Refusal] = []
    states: list[tuple[set[int], set[int], bool]] = []
    judged: dict[int, Outcome] = {}
    while len(judged) < len(outcomes):
        waiting = sorted(streak.in_flight)
        if streak.num_sent < len(outcomes) and (not waiting or data.draw(st.booleans())):
            streak.sent()
            continue
        n = data.draw(st.sampled_from(waiting))
        judged[n] = outcomes[n]
        kind = outcomes[n]
        if kind is None:
            released += streak.ended(n)
        else:
            released += streak.refused(n, ("a", work(n), refusal(REFUSALS[kind])))
        states.append(
            (set(streak.held), oracle(judged, streak.num_sent, threshold), is_run(judged, threshold))
        )
    return streak, released, states


def oracle(judged: dict[int, Outcome], num_sent: int, threshold: int) -> set[int]:
    """The refusals a run may still hold, by brute force: some `threshold` consecutive numbers around each are
    all refused alike or not judged yet (in flight or not sent)."""

    def may(n: int, kind: Outcome) -> bool:
        return n >= 0 and (n not in judged or judged[n] == kind)

    return {
        r
        for r, kind in judged.items()
        if kind is not None
        and any(
            all(may(n, kind) for n in range(start, start + threshold))
            for start in range(r - threshold + 1, r + 1)
        )
    }


def is_run(judged: dict[int, Outcome], threshold: int) -> bool:
    """Some `threshold` consecutive numbers are all judged refused alike."""
    return any(
        judged.get(start) is not None
        and all(judged.get(n) == judged[start] for n in range(start, start + threshold))
        for start in judged
    )


@given(st.data(), st.integers(2, 6))
def test_every_request_refused_alike_stops_the_job_within_threshold_sends(
    data: st.DataObject, threshold: int
) -> None:
    """(1) Every send refused one way, answered in any order: the verdict comes once the first `threshold`
    sends are judged, at the latest, and none of the refusals was written as an error row."""
    num = data.draw(st.integers(threshold, 4 * threshold))
    streak = Streak(threshold)
    for _ in range(num):
        streak.sent()
    judged: set[int] = set()
    for n in data.draw(st.permutations(range(num))):
        assert streak.refused(n, ("a", work(n), refusal(f"n must be positive, not {n}"))) == []
        judged.add(n)
        if judged >= set(range(threshold)):
            assert streak.is_the_jobs
    assert "n must be positive" in str(streak.error(lambda _: BODY).context["server says"])


@given(st.data(), st.integers(2, 5))
def test_refusals_never_threshold_in_a_row_are_each_one_error_row(
    data: st.DataObject, threshold: int
) -> None:
    """(2)+(3) Refused sends never `threshold` consecutive ones (every k-th record bad, or any such pattern,
    two kinds of refusal), judged in any order with the other requests in flight meanwhile: never the job's
    verdict; what is held is at every step exactly what a run may still hold; by the end every refusal was
    released once and nothing else was."""
    k = data.draw(st.integers(2, threshold + 3))
    num = data.draw(st.integers(1, 6 * threshold))
    outcomes: list[Outcome] = [
        data.draw(st.sampled_from(["x", "y"])) if n % k == 0 else None for n in range(num)
    ]
    if k > threshold:  # sparse enough for any pattern: a few bad records anywhere
        outcomes = [o or data.draw(st.sampled_from([None, None, "x", "y"])) for o in outcomes]
    assume(not is_run(dict(enumerate(outcomes)), threshold))
    streak, released, states = play(data, outcomes, threshold)
    for held, must, _ in states:
        assert held == must
    assert not streak.is_the_jobs
    released += streak.release()
    refused = [n for n, kind in enumerate(outcomes) if kind is not None]
    assert sorted(ids(released)) == sorted(f"r{n}" for n in refused)  # each once: none lost, none twice


@given(st.data(), st.integers(2, 5))
def test_the_verdict_is_exactly_a_complete_run(data: st.DataObject, threshold: int) -> None:
    """Any outcomes, any order: the streak calls it the job's just when some `threshold` consecutive sends are
    judged refused alike, holds exactly what a run may still hold, and never releases a refusal twice."""
    outcomes: list[Outcome] = data.draw(st.lists(st.sampled_from([None, "x", "y"]), min_size=1, max_size=40))
    streak, released, states = play(data, outcomes, threshold)
    verdicts = [run for _, _, run in states]
    first = verdicts.index(True) if True in verdicts else len(states)
    assert all(held == must for held, must, _ in states[:first])  # until the job stops
    assert streak.is_the_jobs == any(verdicts)
    assert len(ids(released)) == len(set(ids(released)))
    if not streak.is_the_jobs:
        assert streak.held.keys().isdisjoint(int(i[1:]) for i in ids(released))
