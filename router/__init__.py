"""`junction route`: one OpenAI endpoint in front of a fleet of engines, each request sent to
the engine where its usable hybrid hit is longest.

It owns the fleet's view of every engine's cache: an index of the keys each engine holds, fed
by the engine's cache feed (`engine.feed`), scored with the engine's own lookup rule
(`engine.cache.lookup`), so the hit it predicts is the hit that engine's lookup gives. It owns
the policies (`policies.py`), the proxy to the chosen engine with failover (`proxy.py`), what
it decided and why (`decisions.py`, `GET /fleet`), and its metrics. It knows the engines only
over HTTP and the feed's schema; it writes nothing to the control plane.
"""
