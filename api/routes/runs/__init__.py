"""The routes of the jobs a worker runs: benchmark runs (`benchmarks`) and what-if replays
(`whatif`), each queued here and run by `junction worker`."""
