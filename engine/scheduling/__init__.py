"""A step's scheduling: the waiting and running queues and the token budget (`scheduler.py`),
a request's chunk plan for a step (`planner.py`) over the pure rules of where chunks stop and
which positions keep a state (`chunking.py`), in-flight sharing (`inflight.py`), arrival order
(`arrivals.py`), whether a request can ever fit (`capacity.py`), the block events a step emits
(`step_events.py`), a finished request's record (`records.py`), and what the scheduler hands
the runner and gets back (`outputs.py`).
"""
