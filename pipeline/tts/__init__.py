"""Synthetic speech corpus for training the embedded CTC draft head (issue 3)."""
