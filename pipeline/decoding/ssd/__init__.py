"""Self-speculative decoding: "Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts" (eqs. 3, 5, 6-7) and what this project adds to it.

- ``decoder``: the decoder itself, gate (eq. 3), verification (eq. 5) and AR fallback from
  the verified prefix (eqs. 6-7): ``SelfSpeculativeDecoder``, ``SSDRow``.
- ``verify``: the one-pass teacher-forced verification of eq. 5 (``verify_drafts``).
- ``packed_verify``: eq. 5 for every clip of a packed encoder window in one pass.
- ``gate_calibration``: the gate's τ_CTC learnt online from verification outcomes.
- ``verify_policy``: whether a batch's draft and verification pay (break-even).
- ``pack_gate_policy``: whether a batch's packed gate pays (break-even).

The fallback decodes with pipeline.decoding.ar.greedy and its drafters
(pipeline.decoding.drafting.drafters); the decoder kind that runs all this in a job is
pipeline.kinds.ssd.
"""
