"""What-if replays on the store's side: each finished request's salted chain kept at ingest
(`chains`), an engine's recording read back for a replay (`recording`), and the what-if runs'
life from queued to done or failed (`runs`). The replay itself is the engine's
(`whatif`), run by a Celery worker (`jobs.whatif`); no chain is ever served."""
