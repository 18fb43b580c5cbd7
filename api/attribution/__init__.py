"""Miss attribution: why each finished request missed what it missed. The online oracle at
ingest (`record`), over the salted match-unit hashes each engine's sequences held
(`shared_units`, `unit_salt`); each request's salted chain, kept in the same transaction for
what-if replays (`request_chains`); the split of missed tokens by reason (`misses`); the hit
rate's time buckets (`hit_rate`); and the suggested junctions many requests share
(`junctions`). Over the store alone."""
