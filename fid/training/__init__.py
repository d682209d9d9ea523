"""Training loops: one generic loop (`loop.py`) and the tasks it trains (reader, ...)."""
