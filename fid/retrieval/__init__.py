"""Retrieval: BM25, passage embeddings by shard, the faiss index, dense retrieval, and the
FiD-format ranked lists they write."""
