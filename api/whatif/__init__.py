"""What-if replays on the store's side: an engine's recording read back for a replay from the
chains miss attribution kept at ingest (`recording`, over `api.attribution.request_chains`),
and the what-if runs' life from queued to done or failed (`runs`, over `api.runs.lifecycle`).
The replay itself is the engine's (`whatif`), run by a Celery worker (`jobs.whatif`);
no chain is ever served."""
