"""Benchmark jobs: the Celery app (`jobs.app`), its tasks (`jobs.tasks`), the plain functions
they call (`jobs.runs`, callable without a worker) and `junction worker` / `beat` (`jobs.cli`).
"""
