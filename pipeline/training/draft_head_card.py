"""MODEL_CARD.md of a CTC draft head trained on a model's own transcripts ("Self-
Speculative Decoding for LLM-based ASR with CTC Encoder Drafts"), written from the
training run's metrics.json so the card and the weights never disagree."""
from __future__ import annotations


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _reasons(reasons: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in reasons.items()) if reasons else "none"


def worse_than_before(held: dict) -> bool:
    """Whether the trained head's held-out WER against AR is above the initial head's."""
    before, after = held["before"]["wer"], held["after"]["wer"]
    return before is not None and after is not None and after > before


def model_card(m: dict) -> str:
    model, sel, seg, fit, held = m["model"], m["selection"], m["segments"], m["fit"], m["heldout"]
    rule = (f"mean word confidence below {sel['min_confidence']}" if sel["confidence_rule"] == "applied"
            else f"the confidence threshold was {sel['confidence_rule']}")
    init = m["init"]
    lines = [
        f"# CTC draft head for {model['source']}",
        "",
        "A character CTC head (blank + printable ASCII) on the **frozen** encoder of",
        f"`{model['source']}` ({model['family']}, d_model {model['d_model']}, {model['encoder_layers']} encoder layers,",
        f"{'multilingual' if model['multilingual'] else 'English-only'}), the draft of self-speculative decoding",
        "(`--config ssd --set model.ctc_head=THIS_FOLDER`). It learnt the model's own greedy AR",
        "transcripts, so its drafts aim at what the decoder would write, not at a reference.",
        "",
        "## Data",
        f"- Transcripts: `{m['transcripts']['folder']}` ({m['transcripts']['how']}).",
        f"- Rows: {sel['rows']}; used {sel['kept']}; dropped {sel['rows'] - sel['kept']}: "
        f"{sel['errors']} with an error, {sel['filtered']} with a filter reason ({_reasons(sel['filter_reasons'])}), "
        f"{sel['low_confidence']} by the confidence rule ({rule}).",
        f"- Of the rows used: {seg['unmatched_recordings']} left out because their audio no longer cuts into the "
        f"row's segments; segments left out: {seg['empty_segments']} without text, {seg['filtered_segments']} "
        "with a segment filter reason.",
        f"- Training: {m['train_segments']} segments, {m['train_hours']} h; held out: {held['rows']} recordings "
        f"({held['segments']} segments, {m['heldout_hours']} h), chosen by id hash "
        f"(`--heldout-share {held['share']}`), never trained on. {m['too_short']} training segments had more "
        "characters than CTC can emit in their frames and were skipped.",
        "",
        "## Training",
        f"- Head: {m['head']['adapter_layers']} residual BiGRU layers, {m['head']['frame_stack']} frames stacked "
        f"per step, {m['parameters']:,} parameters; initialised from the shipped tiny.en head where shapes "
        f"match ({init['tensors']} of {init['of']} tensors{'' if init['tensors'] else ': a fresh head'}).",
        f"- {len(m['curve'])} of {fit['epochs']} epochs (lr {fit['lr']}, {fit['frame_budget']} frames a batch, "
        f"seed {fit['seed']}, --max-minutes {fit['max_minutes']}) on {fit['device']} "
        f"({fit.get('threads', 1)} CPU thread(s) for training).",
        f"- Minutes: transcription {m['minutes']['transcribe']}, encoder states {m['minutes']['states']}, "
        f"training {m['minutes']['train']}, total {m['minutes']['total']}.",
        "",
        "## Measured (held-out slice, greedy CTC draft against the model's own AR text)",
        "",
        "| | CTC WER vs AR | CTC CER vs AR | drafts equal to AR (normalised) |",
        "|---|---|---|---|",
        f"| before training (initial head) | {_pct(held['before']['wer'])} | {_pct(held['before']['cer'])} | "
        f"{_pct(held['before']['exact'])} |",
        f"| after training | {_pct(held['after']['wer'])} | {_pct(held['after']['cer'])} | "
        f"{_pct(held['after']['exact'])} |",
        "",
        "WER and CER after Whisper's English normaliser (jiwer). The reference is the model's AR",
        "transcript, not the truth: this says how often SSD's verification can accept the draft.",
        *([""] + ["**The trained head drafts worse than the head it started from on this slice**: more audio",
                  "is needed before this head pays; the initial head is the better draft here."]
          if worse_than_before(held) else []),
        "",
        "## Training curve",
        "",
        "| epoch | train CTC loss | held-out CER vs AR | minutes |",
        "|---|---|---|---|",
    ]
    lines += [f"| {p['epoch']} | {p['train_loss']} | {_pct(p.get('eval_cer'))} | {p['minutes']} |"
              for p in m["curve"]]
    lines += ["", "## Reproduce", "", "```", m["command"], "```", "",
              "## Limits",
              "- Characters outside printable ASCII are not in the head's alphabet: a transcript's other",
              "  characters are dropped from its target, so for non-Latin scripts the draft cannot match.",
              "- The held-out slice is the same corpus as the training rows: a new domain needs its own",
              "  measurement.", ""]
    return "\n".join(lines)
