"""Self-speculative decoding with CTC drafts: "Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts", eqs. 3, 5, 6, 7.

1. Gate (eq. 3): a non-empty greedy CTC draft whose max frame entropy over VALID frames is
   below tau_ctc is the final transcript.
2. Verify (eq. 5): other drafts are re-tokenised with the decoder's tokenizer and scored
   in one batched teacher-forced pass (pipeline.decoding.ssd.verify).
3. Fall back (eqs. 6-7): rejected rows continue greedy AR decoding from the verified
   prefix (tokens < j), not from scratch, starting from the verification pass's KV cache
   cropped to the prefix (``DecodeSeed``): no second prefill, and in-process the
   cross-attention K/V are not recomputed from the encoder states either.

Beyond the paper (off by default): ``verify_max_entropy``, a ceiling on the max frame
entropy above which verification is skipped and the row goes straight to AR from
scratch. Such drafts are so uncertain that the verified prefix is short (mean j ~1.5 at
high_accuracy with our head) and verification is almost pure cost. Rows below the
ceiling are decoded exactly as without it; rows above it get exactly full AR.
Also beyond the paper: verification applies the output projection in chunks of draft
positions and stops at a row's first failure (``verify_chunk``), with the same decisions.

Beyond the paper, off by default: ``lookahead`` K > 0 turns the fallback into speculative
rounds over the rest of the draft (pipeline.decoding.drafting.drafters.CTCLookahead). After each
token it commits, the fallback re-finds its place in the draft
(pipeline.decoding.drafting.draft_sync) and feeds up to K draft tokens with it in one pass.
``lookahead_rule`` "greedy" keeps a guess exactly when it is the decoder's own argmax, so
the text is the plain fallback's; "tau_slm" keeps it when its probability is above
tau_slm, eq. 5's rule applied again after each correction (a re-synchronising verifier:
the draft is not abandoned at its first error).

Beyond the paper, on by default on CUDA (``use_cuda_graphs``): the fallback's plain greedy
rows, seeded or prefilled, continue over a static KV cache whose step is replayed as a
CUDA graph (pipeline.decoding.ar.static); the seeds' K/V are copied into that cache, so
the fallback still starts from the verification pass's state, with the same tokens.

Beyond the paper, off by default: ``map_drafting``, the fallback drafts from a token map
("Model-free Speculative Decoding for Transformer-based ASR with Token Map Drafting",
pipeline.decoding.drafting.drafters.TokenMapDrafter); with ``lookahead`` the rest of the CTC draft is
one more candidate, verified in the same tree pass (greedy rule only).

Beyond the paper, off by default: ``gate_verify_tau``. A draft the gate accepts is also
verified (eq. 5 at this threshold, usually far below tau_slm, with eq. 5's end-of-text
check) before it is final, in the verification pass of the rows the gate rejected; one
that fails continues from its prefix at tau_slm, found in that same pass. The embedded
head's max entropy is poorly calibrated (synthetic training speech), so the gate alone
admits drafts with misspelt words that the decoder finds all but impossible; this catches
them at the cost of scoring the gated rows too. The pipeline's packed gate does the same
check on packed windows (pipeline.decoding.ssd.packed_verify), where it costs a pass per
window, not per row.

Beyond the paper, off by default: ``verify_rule`` "greedy". Verification keeps a draft token
only where it is the decoder's own argmax (pipeline.decoding.ssd.verify), and the gate is
off (every non-empty draft is verified), so SSD's text is greedy AR's whatever the head. A
head fitted to one corpus drafts text close to the decoder's but seldom equal to it; at
tau_slm its near misses are accepted and the WER rises, under this rule they are not.

The split into `first_pass` and `fallback` lets the pipeline run them in two actor pools
with the encoder states travelling between them as CPU arrays (the paper's CPU offload).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..ar.greedy import DecodeSeed, greedy_decode, seeds_from_cache
from ..ar.graphs import StaticDecoding
from ..drafting.draft_sync import LOOKAHEAD_RULES
from ..drafting.drafters import NO_DRAFT, CTCLookahead
from .verify import verify_drafts

if TYPE_CHECKING:
    from ...models.base import ARDecoderModel

CTC_GATE, LLM_VERIFY, AR_FALLBACK = "ctc_gate", "llm_verify", "ar_fallback"
# A segment SSD decoded as plain greedy AR, without a draft (pipeline.decoding.ssd.verify_policy).
AR_UNDRAFTED = "ar"
# Draft positions per chunk of the verification's output projection (see ssd.verify):
# most rejected drafts fail within the first few tokens.
VERIFY_HEAD_CHUNK = 8


@dataclass
class SSDRow:
    """The outcome (or pending state) of one segment."""
    stage: str | None                 # None while waiting for the fallback
    text: str
    max_entropy: float
    draft_text: str
    draft_tokens: list[int] = field(default_factory=list)  # decoder tokens of the draft
    prefix: list[int] = field(default_factory=list)        # verified prefix (tokens < j)
    min_prob: float | None = None
    generated: int = 0                # tokens produced by AR fallback
    tokens: list[int] = field(default_factory=list)        # final decoder tokens (not for ctc_gate)
    seed: DecodeSeed | None = field(default=None, repr=False)  # decoder state after the prefix
    probe: bool = False               # accepted by a calibrated gate, verified anyway (a label)

    @property
    def prefix_len(self) -> int | None:
        return None if self.stage == CTC_GATE else len(self.prefix)


def gate(max_entropy: torch.Tensor, nonempty: torch.Tensor, tau_ctc: float) -> torch.Tensor:
    """Eq. 3: accept the CTC draft when max_t H_t < tau_ctc (non-empty drafts only)."""
    return nonempty & (max_entropy < tau_ctc)


class SelfSpeculativeDecoder:
    def __init__(self, adapter: ARDecoderModel, tau_ctc: float, tau_slm: float, max_new_tokens: int = 224,
                 reuse_kv: bool = True, verify_max_entropy: float | None = None,
                 verify_chunk: int | None = VERIFY_HEAD_CHUNK, lookahead: int = 0,
                 lookahead_rule: str = "greedy", gate_verify_tau: float | None = None, map_drafting=None,
                 gate_calibration=None, use_cuda_graphs: bool = True, verify_rule: str = "tau_slm"):
        if lookahead_rule not in LOOKAHEAD_RULES:
            raise ValueError(f"lookahead_rule must be one of {LOOKAHEAD_RULES}, got {lookahead_rule!r}")
        if verify_rule not in LOOKAHEAD_RULES:
            raise ValueError(f"verify_rule must be one of {LOOKAHEAD_RULES}, got {verify_rule!r}")
        if verify_rule == "greedy" and (gate_calibration is not None or lookahead_rule != "greedy"):
            raise ValueError("verify_rule greedy keeps greedy AR's text: no calibrated gate, lookahead_rule greedy")
        self.adapter = adapter
        self.tau_ctc = tau_ctc
        self.tau_slm = tau_slm
        self.max_new_tokens = max_new_tokens
        self.reuse_kv = reuse_kv
        self.verify_max_entropy = verify_max_entropy
        self.verify_chunk = verify_chunk
        self.lookahead = lookahead
        self.lookahead_rule = lookahead_rule
        self.gate_verify_tau = gate_verify_tau
        self.exact = verify_rule == "greedy"
        if map_drafting is not None and lookahead and lookahead_rule != "greedy":
            raise ValueError("token-map drafting verifies greedily: it cannot join lookahead_rule tau_slm")
        # pipeline.decoding.drafting.drafters.TokenMapDrafter (its policy kept across calls), or None
        self.map_drafting = map_drafting
        # pipeline.decoding.ssd.gate_calibration.GateCalibration: tau_ctc learnt from verification
        # outcomes as the job runs (tau_ctc is then its cap); None: tau_ctc is fixed.
        self.gate_calibration = gate_calibration
        # decoder.use_cuda_graphs: the fallback's plain greedy rows (seeded or not) over a
        # static KV cache, replayed as CUDA graphs on a GPU (pipeline.decoding.ar.graphs)
        self.static = StaticDecoding() if use_cuda_graphs else None

    def _verifies(self, row: SSDRow) -> bool:
        if not row.draft_text.strip():
            return False
        return self.verify_max_entropy is None or row.max_entropy < self.verify_max_entropy

    def gate_rows(self, draft_texts: list[str], max_entropy: torch.Tensor) -> list[SSDRow]:
        """Eq. 3: one row per draft, final (ctc_gate) where the gate accepts it, else pending."""
        nonempty = [bool(t.strip()) for t in draft_texts]
        if self.exact:
            # every draft is verified: an unverified draft is not greedy AR's text
            gated, probes = [False] * len(draft_texts), [False] * len(draft_texts)
        elif self.gate_calibration is not None:
            gated, probes = self.gate_calibration.decide(max_entropy.float().cpu().numpy(), nonempty)
            gated = (gated & ~probes).tolist()
            probes = probes.tolist()
        else:
            gated = gate(max_entropy, torch.tensor(nonempty, device=max_entropy.device), self.tau_ctc).tolist()
            probes = [False] * len(draft_texts)
        return [SSDRow(stage=CTC_GATE if g else None, text=t.strip() if g else "", max_entropy=float(h), draft_text=t,
                       probe=p)
                for g, p, t, h in zip(gated, probes, draft_texts, max_entropy.tolist())]

    @torch.inference_mode()
    def first_pass(self, encoder_states: torch.Tensor, draft_texts: list[str],
                   max_entropy: torch.Tensor) -> list[SSDRow]:
        """Gate, then verify the rest."""
        return self.verify_rows(encoder_states, self.gate_rows(draft_texts, max_entropy))

    @torch.inference_mode()
    def verify_rows(self, encoder_states: torch.Tensor, rows: list[SSDRow]) -> list[SSDRow]:
        """Eq. 5 for the pending rows among ``rows`` (``encoder_states[i]`` is row i's), in
        place. Gated rows are left as they are, unless ``gate_verify_tau``: then they are
        scored in the same pass, stay final where every token is above that threshold and
        end-of-text follows, and otherwise become pending from their prefix at tau_slm."""
        ad = self.adapter
        check_gated = self.gate_verify_tau is not None
        calibration = self.gate_calibration
        todo = [i for i, r in enumerate(rows)
                if (r.stage is None and self._verifies(r)) or (check_gated and r.stage == CTC_GATE)]
        if todo:
            # Greedy AR writes at most max_new_tokens after the prompt and never past the
            # decoder's last position: a longer draft could not be its output, and would
            # index positions the model does not have. Its first `cap` tokens are verified;
            # the fallback finishes the row from there within the same budget.
            caps = [max(0, min(self.max_new_tokens, ad.max_positions - len(p)))
                    for p in ad.batch_prompts(encoder_states[todo])]
            drafts = [ad.tokenize(rows[i].draft_text)[:c] for i, c in zip(todo, caps)]
            gated = [rows[i].stage == CTC_GATE for i in todo]
            # A calibrated gate labels each draft it did not accept at its own (lower)
            # threshold in the same pass; acceptance at tau_slm is then j = K on top of it.
            label_tau = calibration.label_tau if calibration is not None else self.tau_slm
            accept_tau = torch.tensor([self.gate_verify_tau if g else label_tau for g in gated]) \
                if check_gated or calibration is not None else None
            ver = verify_drafts(ad, encoder_states[todo], drafts, self.tau_slm, head_chunk=self.verify_chunk,
                                accept_tau=accept_tau, greedy=self.exact)
            js = ver.first_reject.tolist()
            plausible = ver.accepted.tolist()
            for n, i in enumerate(todo):
                row = rows[i]
                row.draft_tokens, row.min_prob = drafts[n], float(ver.min_prob[n])
                if gated[n] and plausible[n]:
                    continue
                row.prefix = drafts[n][:js[n]]
                if plausible[n] and (gated[n] or js[n] == len(drafts[n])):
                    row.stage, row.text, row.tokens = LLM_VERIFY, ad.text(drafts[n]), drafts[n]
                elif gated[n]:
                    row.stage, row.text = None, ""
            if calibration is not None:
                labelled = [n for n in range(len(todo)) if not gated[n]]
                calibration.observe([rows[todo[n]].max_entropy for n in labelled],
                                    [not plausible[n] for n in labelled])
            if self.reuse_kv:
                rejected = [n for n, i in enumerate(todo) if rows[i].stage is None]
                lead = ver.lead.tolist()
                seeds = seeds_from_cache(
                    ver.cache, rejected, [lead[n] for n in rejected], [ver.prompt_end + js[n] for n in rejected],
                    ver.next_token[rejected].tolist())
                for n, seed in zip(rejected, seeds):
                    rows[todo[n]].seed = seed
        return rows

    @torch.inference_mode()
    def fallback(self, encoder_states: torch.Tensor, rows: list[SSDRow], timer: dict | None = None,
                 cross_out: list | None = None) -> list[SSDRow]:
        """Finish pending rows (``encoder_states`` holds exactly those rows, in order).
        ``cross_out``: filled with the cross-attention K/V the decoding used, per layer, in
        ``rows`` order (``greedy_decode``'s), or left empty where a group has none."""
        if not rows:
            return rows
        # Seeded rows skip the prefill; the others (empty or unverified drafts, seeds not
        # available) are prefilled as usual, in their own batch.
        seeded = [i for i, r in enumerate(rows) if r.seed is not None and self.reuse_kv]
        plain = [i for i, r in enumerate(rows) if r.seed is None or not self.reuse_kv]
        gen: list[list[int]] = [[] for _ in rows]
        crosses = []
        for group, seeds in ((seeded, True), (plain, False)):
            if not group:
                continue
            cross: list | None = [] if cross_out is not None else None
            out = greedy_decode(self.adapter, encoder_states[group], prefixes=[rows[i].prefix for i in group],
                                max_new_tokens=self.max_new_tokens,
                                seeds=[rows[i].seed for i in group] if seeds else None,
                                drafter=self._drafter([rows[i] for i in group]), cross_out=cross, timer=timer,
                                static=self.static)
            for i, tokens in zip(group, out):
                gen[i] = tokens
            crosses.append((group, cross))
        if cross_out is not None and crosses and all(c for _, c in crosses):
            cross_out[:] = _in_row_order(crosses, len(rows))
        for row, tokens in zip(rows, gen):
            # AR's budget counts the verified prefix: a row that runs to the limit ends
            # where plain greedy AR would, not max_new_tokens after its prefix
            tokens = tokens[:max(0, self.max_new_tokens - len(row.prefix))]
            row.seed = None
            row.stage, row.generated = AR_FALLBACK, len(tokens)
            row.tokens = row.prefix + tokens
            row.text = self.adapter.text(row.tokens)
        return rows

    def _drafter(self, rows: list[SSDRow]):
        """The fallback's drafter for ``rows``: the rest of each row's draft after its prefix
        (with ``lookahead``), the token map (with ``map_drafting``), both, or neither."""
        lookahead = CTCLookahead([r.draft_tokens for r in rows], [len(r.prefix) for r in rows], self.lookahead,
                                 accept_prob=self.tau_slm if self.lookahead_rule == "tau_slm" else None) \
            if self.lookahead > 0 else None
        if self.map_drafting is not None:
            return self.map_drafting.with_lookahead(lookahead)
        return lookahead if lookahead is not None else NO_DRAFT

    def decode(self, encoder_states: torch.Tensor, draft_texts: list[str],
               max_entropy: torch.Tensor) -> list[SSDRow]:
        rows = self.first_pass(encoder_states, draft_texts, max_entropy)
        pending = [i for i, r in enumerate(rows) if r.stage is None]
        if pending:
            self.fallback(encoder_states[pending], [rows[i] for i in pending])
        return rows


def _in_row_order(groups: list[tuple[list[int], list]], n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the groups' cross-attention K/V put back in row order (no copy when one
    group holds every row in order)."""
    if len(groups) == 1 and groups[0][0] == list(range(n)):
        return groups[0][1]
    device = groups[0][1][0][0].device
    index = [torch.tensor(rows, device=device) for rows, _ in groups]
    out = []
    for li in range(len(groups[0][1])):
        k0, v0 = groups[0][1][li]
        keys, values = k0.new_empty((n, *k0.shape[1:])), v0.new_empty((n, *v0.shape[1:]))
        for idx, (_, cross) in zip(index, groups):
            keys[idx], values[idx] = cross[li]
        out.append((keys, values))
    return out
