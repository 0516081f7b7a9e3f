"""Synthetic speech corpus for training the embedded CTC draft head: TTS engines, text
sources, augmentation and the corpus plan with held-out voices and texts."""
