"""Engines without physical block ids (vLLM and SGLang through `junction attach`): their
hash-keyed cache applied at ingest (`blocks`), read back paged and summarized (`reads`),
read as prefix trees with the junctions worth a Mamba state (`analysis`), and what would keep
a state there (`remedies`)."""
