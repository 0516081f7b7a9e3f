"""The decoding algorithms as pure functions and small stateful classes over tensors: greedy
CTC, greedy AR with KV-cache seeds, self-speculative decoding (gate, verification,
fallback), FLToP pruning and the FlexCTC batched beam search (ctc_beam/). Each module
names the paper and equation it implements."""
