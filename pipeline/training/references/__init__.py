"""Reference implementations the tests and benchmarks measure the runtime decoders
against: CPU CTC beam decoders (``ctc_decoders``), KenLM behind the NGPU-LM API
(``kenlm_ref``) and the per-utterance transducer ALSD (``transducer_alsd``). The
token-map drafting replay is runtime code (a job's summary reports it):
pipeline.decoding.drafting.token_map_replay."""
