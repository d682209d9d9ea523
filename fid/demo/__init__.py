"""The embedded demo: a synthetic open-domain QA world, its data files, and the tiny models
(tokenizers trained on the spot, random T5 and BERT) used where nothing can be downloaded."""
