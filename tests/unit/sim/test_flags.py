"""fleetgen.sim's SGLang 0.5.23 parser, rebuilt from the flag table dumped from SGLang's own parser (the table
itself is checked against the installed SGLang 0.5.23 in tests/integration/sim/test_flags_real.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgen.sim.configfile import merge_config
from fleetgen.sim.flags import build_parser, human_readable_int, load_flag_data


def parse_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_table_is_sglang_0_5_23() -> None:
    data = load_flag_data()
    assert data["sglang_version"] == "0.5.23"
    assert data["prog"] == "sglang serve"
    options = {opt for flag in data["flags"] for opt in flag["options"]}
    assert {
        "--mamba-radix-cache-strategy",
        "--cuda-graph-max-bs-decode",
        "--speculative-algorithm",
    } <= options
    assert "--mamba-scheduler-strategy" not in options


def test_real_flags_parse_with_sglang_defaults() -> None:
    ns = build_parser().parse_args(
        [
            "--model",
            "/m",
            "--tp",
            "2",
            "--context-length",
            "32k",
            "--no-enable-tf32-matmul",
            "--mamba-radix-cache-strategy",
            "extra_buffer",
            "--sim-decode-tps",
            "5",
        ]
    )
    assert ns.model_path == "/m"
    assert ns.tp_size == 2  # `--tp` is an unambiguous prefix of --tp-size, as argparse allows in SGLang
    assert ns.context_length == 32000
    assert ns.enable_tf32_matmul is False
    assert ns.mamba_radix_cache_strategy == "extra_buffer"
    assert ns.port == 30000 and ns.decode_log_interval == 40 and ns.stream_interval == 1
    assert ns.sim_decode_tps == 5.0


def test_renamed_mamba_flag_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    last = parse_error(["--model-path", "/m", "--mamba-scheduler-strategy", "extra_buffer"], capsys)
    assert last == "sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer"


def test_split_cuda_graph_flag_is_ambiguous(capsys: pytest.CaptureFixture[str]) -> None:
    last = parse_error(["--model-path", "/m", "--cuda-graph-max-bs", "16"], capsys)
    assert last == (
        "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
    )


def test_bad_choice_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    last = parse_error(["--model-path", "/m", "--mamba-radix-cache-strategy", "bogus"], capsys)
    assert last.startswith(
        "sglang serve: error: argument --mamba-radix-cache-strategy: invalid choice: 'bogus'"
    )


def test_model_path_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    last = parse_error([], capsys)
    assert "the following arguments are required: --model-path/--model" in last


def test_deprecated_flag_still_works_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    ns = build_parser().parse_args(["--model-path", "/m", "--disable-cuda-graph"])
    assert ns.disable_cuda_graph is True
    assert "'--disable-cuda-graph' is deprecated" in caplog.text


@pytest.mark.parametrize(
    ("text", "value"), [("12", 12), ("1k", 1000), ("2.5M", 2_500_000), ("4Ki", 4096), ("1Gi", 2**30)]
)
def test_human_readable_int(text: str, value: int) -> None:
    assert human_readable_int(text) == value


def test_config_file_merges_like_sglang(tmp_path: Path) -> None:
    """`--config FILE.yaml` as SGLang 0.5.23 merges it: the file's flags first (the command line wins),
    `true` → a bare store_true flag, the key readable only from the file (never on the argv)."""
    parser = build_parser()
    cfg = tmp_path / "c.yaml"
    cfg.write_text('api-key: "sk-\\"quoted\\"-0123456789"\nenable-metrics: true\nport: 1\n')
    argv = ["--model-path", "/m", "--config", str(cfg), "--port", "2"]
    merged = merge_config(parser, argv)
    assert merged[:5] == ["--api-key", 'sk-"quoted"-0123456789', "--enable-metrics", "--port", "1"]
    ns = parser.parse_args(merged)
    assert ns.api_key == 'sk-"quoted"-0123456789' and ns.enable_metrics and ns.port == 2
    assert merge_config(parser, ["--port", "2"]) == ["--port", "2"]
    for bad, words in [
        (tmp_path / "c.txt", "must be YAML"),
        (tmp_path / "missing.yaml", "not found"),
    ]:
        with pytest.raises(ValueError, match=words):
            merge_config(parser, ["--config", str(bad)])
    with pytest.raises(ValueError, match="Multiple config files"):
        merge_config(parser, ["--config", str(cfg), "--config", str(cfg)])
