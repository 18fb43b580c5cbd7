"""A vLLM or SGLang engine's cache, drawn (the Peer cache page): its cached prefix tree laid out
along the token axis (`tree`) and drawn with its Mamba states and suggested junctions
(`prefix_tree`), from `GET .../peer-tree`; and from `GET .../peer-summary`, the blocks each
tier holds per group (`tiers`), the blocks stored and removed per second and the gaps in that
stream (`churn`), and the token hit rate its scraped counters give (`hit_rate`). Pure functions
of the REST bodies."""
