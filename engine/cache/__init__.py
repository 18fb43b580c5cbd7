"""The prefix cache: block pools, per-group managers and the hybrid coordinator."""
