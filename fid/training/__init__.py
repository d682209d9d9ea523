"""Training: the one loop every model trains with (`loop.py`), the tasks it trains (`reader.py`,
`retriever.py`), a run end to end (`runs.py`: state folder, resume, export), checkpoints and
their manifests, resume policy, the state folder's lock, optimiser and FSDP sharding."""
