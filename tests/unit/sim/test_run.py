"""The sim process's own command line (`sim/run.py`): what SGLang itself would have been given."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleetgen.sim.flags import SIM_KNOBS, build_parser
from fleetgen.sim.run import sglang_argv

SGLANG_ARGS = [["--model-path", "/m"], ["--port", "8000"], ["--enable-metrics"], ["--context-length", "256"]]
KNOB_ARGS = [[flag] if kwargs.get("action") == "store_true" else [flag, "1"] for flag, kwargs in SIM_KNOBS]


@given(st.lists(st.sampled_from(SGLANG_ARGS + KNOB_ARGS), max_size=12))
def test_the_launch_command_keeps_every_sglang_flag_and_drops_every_sim_knob(groups: list[list[str]]) -> None:
    """Bare knobs (`--sim-answer-digest`, `--sim-no-spec`) take no value: the flag after them is kept."""
    argv = [arg for group in groups for arg in group]
    kept = [arg for group in groups if not group[0].startswith("--sim-") for arg in group]
    assert sglang_argv(argv) == kept


def test_every_bare_knob_parses_without_a_value() -> None:
    """The knobs `sglang_argv` treats as bare are exactly those argparse takes without a value."""
    parser = build_parser()
    for flag, kwargs in SIM_KNOBS:
        if kwargs.get("action") == "store_true":
            assert vars(parser.parse_args(["--model-path", "/m", flag]))[flag[2:].replace("-", "_")] is True
