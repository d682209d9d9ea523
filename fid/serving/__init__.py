"""`fid serve`: a run's system kept loaded, answering questions over HTTP (fid.serving.server)."""
