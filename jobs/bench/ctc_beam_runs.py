"""How the CTC beam benches (`bench ctc-beam`, on stored log-probs or a CTC checkpoint) run
our search: FlexCTC ("FlexCTC: GPU-powered CTC Beam Decoding", eq. 1) over utterances
batched by length as the ``ctc_beam`` kind batches them, and FLToP's own operating point
("FLToP CTC: Frame-Level Token Pruning via Relative Threshold", section 4.3)."""
from __future__ import annotations

# FLToP's (N, R) of its own paper (section 4.3: N = 4 tokens, R = 0.007), taken as
# published, not tuned here. ln(0.007) = -4.96: it keeps a token within the same 5 nats
# of the frame's best that pyctcdecode's default token_min_logp (-5) keeps, so at this
# point both decoders prune a frame alike. The shipped conf keeps the more conservative
# (8, 5e-4), which holds the exact search's WER (docs/ctc_beam.md).
FLTOP_PAPER = (4, 0.007)


def decode_ours(search, log_probs, lengths, batch: int, boost=None, rows=None):
    """All utterances in batches of ``batch`` (sorted by length, as the pipeline does), each
    utterance's frames handed over as its own tensor, as the ``ctc_beam`` kind does on a
    CPU (a view here: the other decoders also get each utterance's array as it is).
    ``rows``: those views made beforehand (``utterance_rows``), as the other decoders'
    arrays are, so a timed call does not include slicing them."""
    import torch

    order = torch.argsort(lengths, descending=True)
    tokens = [None] * len(lengths)
    beams = []
    for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        if log_probs.device.type == "cpu":
            res = search([rows[i] if rows is not None else log_probs[i, :int(lengths[i])] for i in idx.tolist()],
                         boost=boost)
        else:
            res = search(log_probs[idx, :int(lengths[idx].max())], lengths[idx], boost=boost)
        for j, i in enumerate(idx.tolist()):
            tokens[i] = res.tokens[j]
        if res.avg_beams is not None:
            beams += res.avg_beams.tolist()
    return tokens, (sum(beams) / len(beams) if beams else None)


def utterance_rows(log_probs, lengths) -> list:
    """Each utterance's [T_b, V+1] frames, a view of ``log_probs`` [B, T, V+1]."""
    return [log_probs[i, :int(lengths[i])] for i in range(len(lengths))]
