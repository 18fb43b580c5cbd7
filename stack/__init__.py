"""`junction up`: the whole stack (control plane, one engine, dashboard, Celery worker and beat)
on one machine, from one command."""
