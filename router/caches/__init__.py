"""What the router knows of the engines' caches: each engine's index of the keys its feed
announced (`index.py`), what its tiers and the fleet's shared store hold and the tier hit that
makes (`tiers.py`), the prefixes of requests that finished there and its feed has not confirmed
(`expected.py`), and where a prompt parts from what the rest of the fleet holds (`branches.py`).
"""
