"""The execution layer: thin actor shells over the library's factories (each usable with Ray
Data or in-process), the Ray Data plan and the in-process runner."""
