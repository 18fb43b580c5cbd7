"""Benchmark runs in the store: the specs as stored (`specs`), a run's life from queued to
finished or failed (`benchmarks`), and how a queued run's message goes on the Celery broker
(`broker`). The workers that run them are `jobs/`."""
