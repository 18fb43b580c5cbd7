"""`junction up --model DIR`: the engine serves a small random Bamba checkpoint in its own chat
template, prints its model and cache geometry at start, and says both in its hello to the
control plane; a hub id that is not in the local cache is refused before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import openai

from tests.api.processes import free_port
from tests.engine.model.hf_checkpoints import build_checkpoint
from tests.polling import wait_for
from tests.stack.test_up import Up


def test_junction_up_serves_a_checkpoint(tmp_path: Path) -> None:
    checkpoint = build_checkpoint("BambaForCausalLM", tmp_path / "bamba-tiny")
    ports = {"api": free_port(), "engine": free_port(), "dashboard": free_port()}
    up = Up(
        tmp_path,
        *("--api-port", str(ports["api"]), "--engine-port", str(ports["engine"])),
        *("--dashboard-port", str(ports["dashboard"]), "--device", "cpu", "--no-jobs"),
        *("--model", str(checkpoint), "--", "--kv-cache-memory", "16MiB"),
    )
    try:
        up.wait_for_line("URLs", lambda line: line == "Junction is up:", 240)
        assert "model bamba-tiny (BambaForCausalLM, 2 attention + 3 Mamba layers" in up.log
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{ports['engine']}/v1", api_key="x")
        reply = client.chat.completions.create(
            model="bamba-tiny", messages=[{"role": "user", "content": "Hello!"}], max_tokens=4
        )
        assert reply.usage.completion_tokens >= 1
        token = (tmp_path / "junction-api-token").read_text().strip()
        # named from --model, not engine-0: another model's history stays apart
        url = f"http://127.0.0.1:{ports['api']}/api/v1/engines/bamba-tiny"

        def said_hello() -> bool:
            response = httpx.get(url, headers={"Authorization": f"Bearer {token}"})
            return response.status_code == 200 and bool(response.json()["model"])

        wait_for("the engine's hello in the store", said_hello)
        model = httpx.get(url, headers={"Authorization": f"Bearer {token}"}).json()["model"]
        assert (model["name"], model["architecture"]) == ("bamba-tiny", "BambaForCausalLM")
        assert model["geometry"]["cache_bytes"] <= 16 * 2**20
    finally:
        code = up.interrupt()
    assert code == 0, up.log[-4000:]


def test_junction_up_refuses_a_hub_id_before_starting_anything(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "up", "--model", "ibm-ai-platform/Bamba-9B"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "--model ibm-ai-platform/Bamba-9B: no such directory" in line
    assert "started" not in done.stdout and not (tmp_path / "junction.db").exists()
