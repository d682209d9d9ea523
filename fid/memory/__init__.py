"""Memory plans: what a training step will hold per rank, predicted from the model's
config.json and the run's knobs before any weight is loaded (`fid plan-memory`)."""
