#!/usr/bin/env bash
# The embedded-defaults demo: the control plane on a SQLite file, the example traces replayed on
# the ledger runner with their events streamed to it, then what the store holds.
set -euo pipefail
cd "$(dirname "$0")/.."
J=.venv/bin/junction
PORT=${JUNCTION_DEMO_PORT:-8765}
export JUNCTION_DATABASE_URL=${JUNCTION_DATABASE_URL:-sqlite:///./junction-demo.db}
# no built-in token: this run's own, unless one is set
export JUNCTION_API_TOKEN=${JUNCTION_API_TOKEN:-$(.venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(32))')}
export JUNCTION_LOG_LEVEL=warning

$J api --port "$PORT" &
API=$!
trap 'kill $API 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null && break
    sleep 0.2
done

for trace in examples/*.jsonl; do
    name=$(basename "$trace" .jsonl)
    echo "== $trace"
    $J replay "$trace" --runner ledger --block-size 16 --mamba-block-size 512 \
        --prefix-match-unit 16 --junction-checkpoints --engine-id "demo-$name" \
        --control-plane "http://127.0.0.1:$PORT" --out /dev/null
done

echo "== the control plane at http://127.0.0.1:$PORT ($JUNCTION_DATABASE_URL)"
.venv/bin/python - "$PORT" <<'PY'
import os
import sys

import httpx

base = f"http://127.0.0.1:{sys.argv[1]}/api/v1"
api = httpx.Client(headers={"Authorization": f"Bearer {os.environ['JUNCTION_API_TOKEN']}"})
for engine in api.get(f"{base}/engines").json():
    engine_id = engine["engine_id"]
    rate = api.get(f"{base}/engines/{engine_id}/hit-rate").json()
    requests = api.get(f"{base}/engines/{engine_id}/requests").json()
    rows = requests.get("requests", requests) if isinstance(requests, dict) else requests
    hits = ", ".join(f"{r['request_id']}: {r['num_cached_tokens']}" for r in rows)
    print(f"{engine_id}: hit tokens per request {{{hits}}}; totals {rate.get('total')}")
PY
