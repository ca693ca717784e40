"""SGLang 0.5.23's command line, rebuilt from data, plus the simulator's own `--sim-*` knobs.

`sglang_0_5_23_flags.json` was dumped from SGLang's *own* parser (`extract_flags.py`, run once by hand on the
release wheel), so every flag name, alias, choice list, default and `nargs` is SGLang's. argparse then gives
the same verdicts SGLang would: an unknown or retired flag (`--mamba-scheduler-strategy`) is "unrecognized
arguments", a prefix of two flags (`--cuda-graph-max-bs`) is "ambiguous option", both with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from collections.abc import Callable, Sequence
from decimal import Decimal
from importlib import resources
from typing import Any

from fleetgen.sim.faults import FaultMode

logger = logging.getLogger("sglang.srt.arg_groups.argparse_actions")

FLAGS_FILE = "sglang_0_5_23_flags.json"


def load_flag_data() -> dict[str, Any]:
    """The extracted flag table: `{"sglang_version", "prog", "flags": [...]}`."""
    text = resources.files("fleetgen.sim").joinpath(FLAGS_FILE).read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def human_readable_int(value: str) -> int:
    """SGLang's integer parser: plain ints, SI suffixes (1k, 2.5M) and IEC suffixes (1Ki, 4Gi)."""
    value = value.strip()
    si_multiplier = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec_multiplier = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec_multiplier:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'."
                )
            return int(number) * iec_multiplier[suffix]
        return int(Decimal(number) * si_multiplier[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. "
            "Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive."
        ) from None


def nullable_str(value: str) -> str | None:
    """`""` and `"None"` mean None, as in SGLang."""
    if not value or value == "None":
        return None
    return value


def loads(value: str) -> Any:
    """JSON-valued flags (`--default-chat-template-kwargs '{"enable_thinking": false}'`)."""
    return json.loads(value)


CONVERTERS: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "human_readable_int": human_readable_int,
    "nullable_str": nullable_str,
    "json": loads,
}


def _deprecation_warning(option: str | None, new_flag: str | None) -> None:
    replacement = f" Use '{new_flag}' instead." if new_flag else ""
    logger.warning(
        f"\033[1;33m'{option}' is deprecated and will be removed in a future release.{replacement}\033[0m"
    )


class DeprecatedStoreConst(argparse.Action):
    """A retired flag that still works: warns, then stores a fixed value (SGLang's two deprecated shapes)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        self.new_flag: str | None = kwargs.pop("new_flag", None)
        self.const_value: Any = kwargs.pop("const_value", True)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        _deprecation_warning(option, self.new_flag)
        setattr(namespace, self.dest, self.const_value)


def _add_flag(parser: argparse.ArgumentParser, flag: dict[str, Any]) -> None:
    """Register one extracted flag with the same action shape SGLang uses."""
    options, kind = flag["options"], flag["action"]
    common: dict[str, Any] = {"dest": flag["dest"], "default": flag["default"]}
    if kind == "store_true":
        parser.add_argument(*options, action="store_true", **common)
    elif kind == "boolean_optional":
        parser.add_argument(options[0], action=argparse.BooleanOptionalAction, **common)
    elif kind in ("deprecated_store_true", "deprecated_store_const"):
        nargs = 0 if kind == "deprecated_store_true" else None
        parser.add_argument(
            *options,
            action=DeprecatedStoreConst,
            nargs=nargs,
            choices=flag["choices"],
            new_flag=flag.get("new_flag"),
            const_value=flag.get("const", True),
            **common,
        )
    elif kind in ("store", "lora_paths"):
        converter = CONVERTERS[flag["type"] or "str"]
        parser.add_argument(
            *options,
            type=converter,
            nargs=flag["nargs"],
            choices=flag["choices"],
            required=flag["required"],
            **common,
        )
    else:
        raise AssertionError(f"unknown action kind {kind!r} in {FLAGS_FILE}")


# (flag, argparse kwargs): the simulator's own knobs; none of them exists in SGLang.
SIM_KNOBS: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        "--sim-decode-tps",
        {
            "type": float,
            "default": 0.0,
            "help": "Decode steps/s per request (= tokens/s without speculative decoding, "
            "× the accept length with it); 0 answers instantly.",
        },
    ),
    (
        "--sim-bandwidth-gbs",
        {
            "type": float,
            "default": 0.0,
            "help": "Simulated GPU memory bandwidth (GB/s): each step's time is a roofline over the bytes it "
            "reads (weights, each request's state and KV), so throughput depends on the batch; an H200 is "
            "about 4800. 0: pace by --sim-decode-tps instead.",
        },
    ),
    (
        "--sim-time-scale",
        {
            "type": float,
            "default": 1.0,
            "help": "Simulated seconds per wall-clock second (10: a step of 20 ms takes 2 ms); rates seen "
            "from outside are this many times the simulated GPU's.",
        },
    ),
    (
        "--sim-output-tokens",
        {
            "type": int,
            "default": 1800,
            "help": "Tokens per answer (reasoning + content) unless max_tokens cuts it.",
        },
    ),
    (
        "--sim-reasoning-fraction",
        {
            "type": float,
            "default": 0.75,
            "help": "Share of the output that is reasoning when thinking is on.",
        },
    ),
    (
        "--sim-start-delay",
        {"type": float, "default": 0.0, "help": "Seconds the startup takes (weight load, pools, warmup)."},
    ),
    (
        "--sim-fail-at-start",
        {
            "choices": ["oom", "valueerror"],
            "default": None,
            "help": "Fail like SGLang: pools do not fit (oom) or a rule fails.",
        },
    ),
    (
        "--sim-crash-after",
        {
            "type": int,
            "default": None,
            "help": "Serve N requests, then die hard (SIGKILL, as on a CUDA crash).",
        },
    ),
    (
        "--sim-no-spec",
        {
            "action": "store_true",
            "help": "Accept speculative flags but run (and report) no speculative decoding.",
        },
    ),
    (
        "--sim-accept-length",
        {
            "type": float,
            "default": 2.6,
            "help": "Mean speculative accept length (bonus token included); "
            "SGLANG_SIMULATE_ACC_LEN > 0 in the environment overrides it, as it forces SGLang's.",
        },
    ),
    (
        "--sim-gpu-memory-gib",
        {
            "type": float,
            "default": 80.0,
            "help": "Simulated GPU memory; capacity numbers are computed from it.",
        },
    ),
    (
        "--sim-weights-gib",
        {
            "type": float,
            "default": None,
            "help": "Weight size (default: the model folder's safetensors, else 51).",
        },
    ),
    ("--sim-architecture", {"default": None, "help": "Architecture when --model-path has no config.json."}),
    (
        "--sim-fault",
        {
            "choices": [mode.value for mode in FaultMode],
            "default": FaultMode.OK.value,
            "help": "Start under a whole-server fault (sim/faults.py); POST /sim/fault changes it.",
        },
    ),
    (
        "--sim-answer-digest",
        {
            "action": "store_true",
            "help": "Begin every answer with `sim-digest:HEX` of the request's system and user texts "
            "(sim/text.py prompt_digest), so a test can prove an answer belongs to its prompt.",
        },
    ),
)


def add_sim_knobs(parser: argparse.ArgumentParser) -> None:
    """Add the `--sim-*` knobs in their own help group."""
    group = parser.add_argument_group("simulation (fleetgen.sim only)")
    for flag, kwargs in SIM_KNOBS:
        group.add_argument(flag, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """SGLang 0.5.23's `sglang serve` parser (from data) with the `--sim-*` knobs added."""
    data = load_flag_data()
    parser = argparse.ArgumentParser(prog=data["prog"])
    for flag in data["flags"]:
        _add_flag(parser, flag)
    # SGLang registers `--config` by hand in add_cli_args; it is in the data like any other flag.
    add_sim_knobs(parser)
    return parser
