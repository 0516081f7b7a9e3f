"""Language models for shallow fusion: KenLM-built token n-grams as dense GPU tensors
(NGPU-LM), the ARPA reader, phrase boosting trees and the KenLM reference."""
