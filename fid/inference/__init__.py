"""A trained reader at work: answer generation and cross-attention passage scoring (the
retriever's teacher), over question sets in batches of similar length."""
