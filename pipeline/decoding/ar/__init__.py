"""Greedy autoregressive decoding of an attention decoder (the AR baseline of every seed
system; "Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts", eq. 6):
the eager loop with its drafters (greedy), the static-cache loop (static) and its CUDA
graphs (graphs)."""
