"""The models: the FiD reader (a wrapped Hugging Face T5) and the bi-encoder retriever, their
model folders (checks, loading) and the import of released facebookresearch/FiD checkpoints.
Models do no distributed work and read no configs."""
