"""Benchmark runs in the store: the specs as stored (`specs`), a run's life on a worker from
queued to finished or failed, one for every kind of run (`lifecycle`, what-if runs' too), a
benchmark run's own (`benchmarks`), and how a queued run's message goes on the Celery broker
(`broker`). Over the store alone. The workers that run them are `jobs/`."""
