"""`junction serve`'s parser, its refusal of bad geometry, and the core staying web-free."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys

from engine.engine import Engine
from engine.setup.options import EXIT_BAD_INPUT, configs_from_args
from serve.cli import add_serve_parser, cmd_serve


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="junction")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_serve_defaults_and_options():
    args = parse(["serve"])
    cache, _, model = configs_from_args(args)
    assert (args.host, args.port, model.name) == ("127.0.0.1", 8000, "junction-hybrid-tiny")
    assert args.runner == "torch" and args.func is cmd_serve
    assert (cache.num_blocks, cache.num_mamba_blocks, model.model_dir) == (4096, 512, None)
    args = parse(
        ["serve", "--port", "9001", "--engine-id", "e7", "--control-plane", "http://cp:8080"]
        + ["--token", "t", "--block-size", "32", "--mamba-block-size", "64", "--runner", "ledger"]
    )
    assert (args.port, args.engine_id, args.control_plane, args.token) == (
        9001,
        "e7",
        "http://cp:8080",
        "t",
    )
    assert (args.block_size, args.mamba_block_size, args.runner) == (32, 64, "ledger")


def test_the_prefix_wait_is_an_option_and_the_hello_geometry_reports_it():
    _, scheduler, _ = configs_from_args(parse(["serve"]))
    assert scheduler.max_prefix_wait_steps == 32
    _, scheduler, _ = configs_from_args(parse(["serve", "--max-prefix-wait-steps", "0"]))
    assert scheduler.max_prefix_wait_steps == 0
    engine = Engine(runner="null", scheduler_config=scheduler)
    assert engine.cache_geometry().max_prefix_wait_steps == 0


def test_bad_geometry_is_refused_before_serving(capsys):
    assert cmd_serve(parse(["serve", "--block-size", "0"])) == EXIT_BAD_INPUT
    assert "block_size must be a positive integer" in capsys.readouterr().err


def test_the_core_and_the_command_line_import_no_web_library():
    code = (
        "import sys, engine.engine, serve.replay_cli, serve.cli; "
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'prometheus_client', 'starlette') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_taken_port_is_said_before_the_model_loads(capsys):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert cmd_serve(parse(["serve", "--port", str(port)])) == EXIT_BAD_INPUT
    # one line, naming the port, and nothing of the model (whose card is said once it loads)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"junction serve: cannot listen on 127.0.0.1:{port}: "), line
    assert line.endswith("pick another --port (or --host)"), line


def test_the_tier_options_and_their_errors(monkeypatch, tmp_path, capsys):
    """`--host-cache-bytes` defaults to a share of free memory in `serve` and takes bytes;
    a disk tier needs its bytes; a directory written for another geometry is refused with one
    line naming `--disk-cache-dir` before serving."""
    from engine.setup.options import tier_config_from_args

    args = parse(["serve", "--runner", "null"])
    cache, _, model = configs_from_args(args)
    auto = tier_config_from_args(args, cache, model)
    assert auto.host_cache_bytes > 0 and auto.disk_cache_dir is None
    args = parse(["serve", "--host-cache-bytes", "1GiB", "--disk-cache-dir", str(tmp_path)])
    try:
        tier_config_from_args(args, cache, model)
    except ValueError as error:
        assert "--disk-cache-bytes" in str(error) and "JUNCTION_DISK_CACHE_BYTES" in str(error)
    else:
        raise AssertionError("a disk tier without its bytes was taken")
    monkeypatch.setenv("JUNCTION_HOST_CACHE_BYTES", "0")
    args = parse(["serve", "--disk-cache-dir", str(tmp_path), "--disk-cache-bytes", "64MiB"])
    tiers = tier_config_from_args(args, cache, model)
    assert (tiers.host_cache_bytes, tiers.disk_cache_bytes) == (0, 64 << 20)
    bad = parse(["serve", "--host-cache-bytes", "lots"])
    try:
        tier_config_from_args(bad, cache, model)
    except ValueError as error:
        assert "--host-cache-bytes" in str(error) and "'lots'" in str(error)
    else:
        raise AssertionError("a bad --host-cache-bytes was taken")
    # the directory is claimed by one geometry, then refused to another
    Engine(cache, runner="null", tiers=tiers)
    other = ["--block-size", "32", "--runner", "null", "--port", str(free_port())]
    argv = ["serve", *other, "--disk-cache-dir", str(tmp_path), "--disk-cache-bytes", "64MiB"]
    assert cmd_serve(parse(argv)) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    refusal = [line for line in err if "--disk-cache-dir" in line]
    assert len(refusal) == 1 and "written for another model or cache geometry" in refusal[0]
    assert "block_size" in refusal[0] or "attention_block_size" in refusal[0]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
