"""Data in the formats users bring, and the pipeline's own: downloads and extraction, question
files (NQ-open, DPR qas, TriviaQA, FiD json/jsonl), DPR passage TSVs, FiD-format examples, split
preparation, and the reader's token batches."""
