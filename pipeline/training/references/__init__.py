"""Reference implementations the tests and benchmarks measure the runtime decoders
against: CPU CTC beam decoders (``ctc_decoders``), KenLM behind the NGPU-LM API
(``kenlm_ref``), the per-utterance transducer ALSD (``transducer_alsd``) and the
token-map drafting replay (``token_map_replay``)."""
