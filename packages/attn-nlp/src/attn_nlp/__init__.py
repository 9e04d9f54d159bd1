"""attn_nlp: encoder-decoder Transformer, generation, Marian weights, LM and classifier."""
