"""Build token-level n-gram LMs with KenLM's lmplz, and compile them to NGPU-LM tensors.

"FlexCTC: GPU-powered CTC Beam Decoding with advanced Contextual Abilities", §IV-A, trains
the fusion LM on the ASR model's own token ids (6-gram subword LMs built with KenLM, the
same ARPA for NGPU-LM and the CPU decoders). Each text line is tokenised with the
decoder's tokenizer, written as ``chr(id + 100)`` characters (``arpa.tokens_line``) and
fed to ``lmplz -S <mem> --discount_fallback``; the ARPA is then compiled to safetensors
beside it (``lm.ngpu.safetensors``) so decoders load it quickly.

Tokenizers: ``"chars"`` is the CTC head's character set (``pipeline.text.charset``: CTC id
``c`` in 1..95 is LM token ``c - 1``; the blank has no LM token); anything else is a
``tokenizer.json`` file, a directory holding one, or a local transformers model
directory/id (never downloaded). BPE LM token ids are the tokenizer's own ids, except for a
transformers CTC checkpoint directory (its config names a ``...ForCTC`` architecture): its
LM tokens are its non-blank CTC tokens in order (``pipeline.text.ctc_vocabulary``: CTC id
below the blank unchanged, above it minus one), the ids the CTC beam search feeds the LM,
and text is folded to the vocabulary's case where it has only one.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import TENSORS_NAME
from .arpa import MAX_VOCAB, tokens_line
from .ngpu_lm import NGramLM

ARPA_NAME = "lm.arpa"
INFO_NAME = "lm.json"
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class TextTokenizer:
    """Text -> LM token ids. ``leading_space``: BPE decoders (Whisper) write a space before
    the first word of a transcript, so LM training lines get one too."""

    name: str
    vocab_size: int
    _encode: object
    leading_space: bool = False

    def encode(self, text: str) -> list[int]:
        text = text.strip()
        if self.leading_space and text:
            text = " " + text
        return list(self._encode(text))


def load_tokenizer(spec: str) -> TextTokenizer:
    if spec == "chars":
        from ..text import charset

        return TextTokenizer("chars", len(charset.CHARS), charset.lm_token_ids)
    path = Path(spec)
    from ..models.transducer.embedded import is_embedded_transducer_dir

    if is_embedded_transducer_dir(path):       # a train-transducer directory: its tokens are the characters
        return load_tokenizer("chars")
    from ..text.ctc_vocabulary import TokenizerVocabulary, is_ctc_checkpoint

    if is_ctc_checkpoint(path):
        # Checked before tokenizer.json: a Parakeet directory holds one too, but its raw ids
        # count the blank, which the search never feeds the LM. No leading space: a CTC
        # model spells a transcript's first word like any other (a Metaspace tokenizer adds
        # its own word marker).
        vocab = TokenizerVocabulary.from_pretrained(str(path))
        return TextTokenizer(spec, vocab.size - 1, vocab.lm_token_ids)
    if path.is_dir() and (path / "tokenizer.json").is_file():
        path = path / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
        vocab = tok.get_vocab_size(with_added_tokens=True)
        return TextTokenizer(str(path), vocab, lambda s: tok.encode(s, add_special_tokens=False).ids, True)
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(spec, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - turn any loader failure into one clear message
        raise ValueError(f"tokenizer {spec!r}: not 'chars', not a tokenizer.json file or directory, "
                         f"and not a locally available transformers model ({exc})") from exc
    return TextTokenizer(spec, len(tok), lambda s: tok.encode(s, add_special_tokens=False), True)


def kenlm_bin_dir() -> Path:
    if os.environ.get("SHARDSCRIBE_KENLM_DIR"):
        return Path(os.environ["SHARDSCRIBE_KENLM_DIR"]) / "bin"
    from ..cache import cache_dir

    return cache_dir() / "kenlm" / "bin"


def find_lmplz(build: bool = True) -> Path:
    """lmplz from the build_kenlm.sh cache, else PATH; compiles it once if allowed."""
    candidate = kenlm_bin_dir() / "lmplz"
    if candidate.is_file():
        return candidate
    on_path = shutil.which("lmplz")
    if on_path:
        return Path(on_path)
    script = REPO_ROOT / "scripts" / "build_kenlm.sh"
    if build and script.is_file():
        subprocess.run(["bash", str(script)], check=True, stdout=subprocess.DEVNULL)
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("KenLM's lmplz is not built: run `bash scripts/setup.sh --dev` "
                            "(the KenLM toolchain, then scripts/build_kenlm.sh)")


def write_token_corpus(lines, tokenizer: TextTokenizer, path: Path) -> int:
    if tokenizer.vocab_size > MAX_VOCAB:
        raise ValueError(f"vocabulary of {tokenizer.vocab_size} tokens cannot be written as chr(id + 100)")
    count = 0
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for line in lines:
            ids = tokenizer.encode(line)
            if ids:
                fh.write(tokens_line(ids) + "\n")
                count += 1
    return count


def run_lmplz(corpus: Path, arpa: Path, order: int, memory: str = "1G", prune: list[int] | None = None) -> None:
    """``prune``: lmplz count thresholds per order (e.g. [0, 0, 1]: drop singleton 3-grams)."""
    lmplz = find_lmplz()
    command = [str(lmplz), "-o", str(order), "-S", memory, "--discount_fallback"]
    if prune:
        command += ["--prune", *(str(int(p)) for p in prune)]
    with tempfile.TemporaryDirectory() as tmp, open(corpus, "rb") as src, open(arpa, "wb") as dst:
        proc = subprocess.run(command + ["-T", tmp], stdin=src, stdout=dst, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        raise RuntimeError(f"lmplz failed ({proc.returncode}): {proc.stderr.decode(errors='replace')[-2000:]}")


def read_lines(paths) -> list[str]:
    lines: list[str] = []
    for p in paths:
        with open(p, encoding="utf-8") as fh:
            lines += [line for line in fh.read().splitlines() if line.strip()]
    return lines


def build_lm(text_files, order: int, tokenizer: str, output_dir, memory: str = "1G",
             prune: list[int] | None = None, vocab_size: int | None = None) -> dict:
    """Tokenise, run lmplz, compile. Returns the info dict written to ``lm.json``.
    ``vocab_size`` widens the LM vocabulary to the decoder's output size where that is
    larger than the tokenizer's (Whisper's logits include timestamp tokens)."""
    tok = load_tokenizer(tokenizer)
    if vocab_size is not None and vocab_size < tok.vocab_size:
        raise ValueError(f"--vocab-size {vocab_size} is smaller than the tokenizer's {tok.vocab_size}")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        sentences = write_token_corpus(read_lines(text_files), tok, corpus)
        if sentences == 0:
            raise ValueError("no text lines left after tokenisation")
        run_lmplz(corpus, out / ARPA_NAME, order, memory, prune)
    info = compile_arpa(out / ARPA_NAME, out, vocab_size or tok.vocab_size, tokenizer=tok.name)
    info["sentences"] = sentences
    _write_info(out, info)
    return info


def compile_arpa(arpa_path, output_dir, vocab_size: int | None, tokenizer: str | None = None) -> dict:
    """Compile an existing token-level ARPA; a word-level ARPA is refused with a clear error."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    lm = NGramLM.from_arpa(str(arpa_path), vocab_size)
    lm.save(str(out / TENSORS_NAME))
    arpa_dst = out / ARPA_NAME
    if Path(arpa_path).resolve() != arpa_dst.resolve():
        shutil.copyfile(arpa_path, arpa_dst)
    info = {"arpa": str(arpa_dst), "tensors": str(out / TENSORS_NAME), "order": lm.order,
            "vocab_size": lm.vocab_size, "tokenizer": tokenizer, "token_encoding": "chr(id + 100)",
            "states": lm.graph.num_states, "arcs": int(lm.graph.arc_key.numel()),
            "arpa_bytes": arpa_dst.stat().st_size, "tensor_bytes": lm.graph.nbytes()}
    _write_info(out, info)
    return info


def _write_info(out: Path, info: dict) -> None:
    (out / INFO_NAME).write_text(json.dumps(info, indent=2) + "\n")
