"""`shardscribe bench lm`: NGPU-LM batched advance against the KenLM loop, same states.

"FlexCTC: GPU-powered CTC Beam Decoding", §II-D: the point of NGPU-LM is answering
"scores of every next token for N states" in one batched call instead of N x V KenLM calls. For a character LM (V = 95, the
CTC head's vocabulary) and a BPE LM (V = 1024, a byte-level BPE trained here on the same
text), both built by lmplz from Python's pydoc text, it times ``advance`` for N in
{32, 256, 2048} states reached by random walks, against ``KenLMReference.advance`` (the
KenLM wrapper: BaseScore per pair plus state interning) and a bare BaseScore loop (no
tensors, no interning: KenLM's floor from Python). Ours is timed on both scatter paths
(flat: the default on CPU; sync-free padded: the default on CUDA). Scores of all sides
are compared.
Memory: compiled tensor bytes against the ARPA file size.

Summary: ``max_abs_diff_vs_kenlm`` (nats, over all timed calls), ``speedup_vs_kenlm``
(wrapper time / ours, N=256, V=1024, CPU), ``speedup_vs_kenlm_raw_loop``.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from ...pipeline.timing import timed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="32,256,2048", help="numbers of states N")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (KenLM uses one)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats of our advance")


def _train_bpe(lines: list[str], vocab_size: int, path: Path) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(lines, trainer)
    tok.save(str(path))
    return str(path)


def _states(lm, ref, n: int, steps: int, seed: int):
    """N states reached by random walks from BOS (half greedy steps for long contexts)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ours, theirs = lm.init_states(n, True), ref.init_states(n, True)
    rows = torch.arange(n)
    for _ in range(steps):
        scores, nxt = lm.advance(ours)
        labels = torch.where(torch.rand(n, generator=gen) < 0.5, scores.argmax(1),
                             torch.randint(0, lm.vocab_size, (n,), generator=gen))
        ours = nxt[rows, labels]
        _, theirs = ref.advance_labels(theirs, labels)
    return ours, theirs


def _time(fn, repeats: int, device: str = "cpu") -> tuple[float, object]:
    """Median seconds of ``repeats`` runs after one warm-up run, and the last output."""
    out = fn()  # warm-up
    times = []
    for _ in range(repeats):
        out, secs = timed(fn, device=device)
        times.append(secs)
    return statistics.median(times), out


def _raw_kenlm_loop(ref, states) -> float:
    import kenlm

    model, words = ref.model, ref.words

    def loop():
        for sid in states.tolist():
            state = ref._states[sid]
            for word in words:
                model.BaseScore(state, word, kenlm.State())

    return timed(loop, device="cpu")[1]


def run(args: argparse.Namespace) -> dict:
    import torch

    from ...pipeline.lm.build import build_lm
    from ...pipeline.training.references.kenlm_ref import KenLMReference
    from ...pipeline.lm.ngpu_lm import NGramLM
    from ...pipeline.training.sample_text import pydoc_sentences

    torch.set_num_threads(args.threads)
    quick = bool(getattr(args, "quick", False))
    sizes = [int(s) for s in args.sizes.split(",")]
    repeats = args.repeats or (5 if quick else 20)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    lines = pydoc_sentences()
    rows, worst = [], 0.0
    headline = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        text = tmp / "text.txt"
        text.write_text("\n".join(lines) + "\n")
        bpe = _train_bpe(lines, 1024, tmp / "bpe1024.json")
        specs = [("chars", "chars", 6), ("bpe1024", bpe, 4 if quick else 5)]
        for name, tokenizer, order in specs:
            info = build_lm([text], order, tokenizer, tmp / name)
            lm = NGramLM.load(info["tensors"])
            ref = KenLMReference(info["arpa"], info["vocab_size"])
            devices = ["cpu"] + ([device] if device != "cpu" else [])
            for n in sizes:
                ours_states, ref_states = _states(lm, ref, n, steps=8, seed=n)
                (ref_scores, _), kenlm_s = timed(ref.advance, ref_states, device="cpu")
                raw_s = _raw_kenlm_loop(ref, ref_states)
                for dev in devices:
                    dev_lm = lm if dev == "cpu" else lm.to(dev)
                    dev_states = ours_states.to(dev)
                    ours_s, (scores, _) = _time(lambda: dev_lm.advance(dev_states), repeats, dev)
                    padded_s, (padded, _) = _time(
                        lambda: dev_lm.graph.advance(dev_states, sync_free=True), repeats, dev)
                    diff = max((scores.float().cpu() - ref_scores).abs().max().item(),
                               (padded.float().cpu() - ref_scores).abs().max().item())
                    worst = max(worst, diff)
                    queries = n * lm.vocab_size
                    row = {"lm": name, "V": lm.vocab_size, "order": order, "N": n, "device": dev,
                           "ours_ms": ours_s * 1e3, "sync_free_ms": padded_s * 1e3, "kenlm_ms": kenlm_s * 1e3, "kenlm_raw_ms": raw_s * 1e3,
                           "ours_qps": queries / ours_s, "kenlm_qps": queries / kenlm_s,
                           "speedup": kenlm_s / ours_s, "speedup_raw": raw_s / ours_s,
                           "max_abs_diff": diff, "arpa_MB": info["arpa_bytes"] / 2**20,
                           "tensor_MB": info["tensor_bytes"] / 2**20,
                           "mem_ratio": info["tensor_bytes"] / info["arpa_bytes"]}
                    rows.append(row)
                    if name == "bpe1024" and n == 256 and dev == "cpu":
                        headline = row
    summary = {"max_abs_diff_vs_kenlm": worst,
               "speedup_vs_kenlm": headline.get("speedup"),
               "speedup_vs_kenlm_raw_loop": headline.get("speedup_raw"),
               "threads": args.threads}
    return {"rows": rows, "summary": summary}
