"""The lab: what trains, generates data for, or benchmarks the shipped models, and never
runs inside a transcription job.

A job (``jobs/transcribe.py`` and the other runtime commands, ``actors/``, the registered
decoder kinds and model families) never imports this package, even lazily;
``tests/test_architecture.py`` checks that over the import graph. What is here may import
the runtime library; the runtime must not import it back.

- ``tts/``: the synthetic speech corpus (TTS engines, text sources, augmentation, the
  corpus plan with held-out voices and texts): ``make-tts-corpus``, ``make-bench-sets``;
- ``ctc_features``, ``ctc_head_train``, ``ctc_head_card``: the embedded CTC draft head's
  frozen-encoder feature cache, training loop and model card (``train-ctc-head``);
- ``transducer_train``, ``tdt_loss``: the embedded transducer's training (``train-transducer``);
- ``optim``: the optimiser schedule and epoch bookkeeping both training jobs share;
- ``sample_text``: real English text available offline, for test and benchmark LMs;
- ``references/``: what tests and benchmarks compare the runtime decoders with
  (flashlight-text and pyctcdecode, KenLM, the per-utterance transducer ALSD, the
  token-map drafting replay).
"""
