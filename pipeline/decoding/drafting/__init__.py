"""Drafts that greedy decoding verifies: the token map of "Model-free Speculative Decoding
for Transformer-based ASR with Token Map Drafting" (offline, online, its pay-off policy
and replay), CTC drafts in speculative rounds after SSD eq. 6, and candidate trees."""
