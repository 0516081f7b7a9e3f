"""A Spanish and French measurement set for `--model base --language auto` (docs/languages.md,
"Language detection"), and the measurement itself.

20 sentences per language, written for this set (not from any tuning set): 10 short ones
(3-6 words) and 10 longer ones, each with an English translation (the reference for
`--task translate`). Rendered with espeak-ng, alternating two voices per language (the
language's default voice and a variant), one WAV per sentence. A test helper, never
imported by the pipeline.

    .venv/bin/python tests/language_set.py render DIR
    .venv/bin/python -m shardscribe.jobs.cli transcribe --input DIR --output OUT --runner local --model base --language auto
    .venv/bin/python tests/language_set.py score OUT [--translate]
    .venv/bin/python tests/language_set.py render --long DIR    # recordings of 32 s or more
    .venv/bin/python tests/language_set.py score --segments OUT
    .venv/bin/python tests/language_set.py render --tune DIR    # the tuning set (TUNE)

TUNE is a separate set for choosing the parameters of a detector (12 Spanish and 12
French sentences, other than the 40 above, in three other voices per language), so that
the 40 report a result they were not tuned on; `score` scores either set's rows.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

# (sentence, English translation)
SPANISH = [
    ("El tren llega tarde.", "The train arrives late."),
    ("Mi hermana vive en Sevilla.", "My sister lives in Seville."),
    ("¿Dónde está la biblioteca?", "Where is the library?"),
    ("Hace mucho calor hoy.", "It is very hot today."),
    ("Necesito comprar pan y leche.", "I need to buy bread and milk."),
    ("Los niños juegan en el parque.", "The children play in the park."),
    ("Cerramos la tienda a las ocho.", "We close the shop at eight."),
    ("Me gusta mucho esta canción.", "I like this song very much."),
    ("El médico llegará pronto.", "The doctor will arrive soon."),
    ("Abre la ventana, por favor.", "Open the window, please."),
    ("El próximo lunes empezamos las obras en la calle principal, así que habrá mucho ruido "
     "durante toda la semana.",
     "Next Monday we start the works on the main street, so there will be a lot of noise all week."),
    ("Mi abuelo cultivaba tomates y pimientos en un pequeño huerto detrás de la casa.",
     "My grandfather grew tomatoes and peppers in a small garden behind the house."),
    ("Si quieres llegar a tiempo al aeropuerto, tienes que salir antes de las seis de la mañana.",
     "If you want to get to the airport on time, you have to leave before six in the morning."),
    ("La reunión de vecinos se ha aplazado porque el presidente está enfermo.",
     "The neighbours' meeting has been postponed because the president is ill."),
    ("Después de cenar, siempre damos un paseo por la playa con el perro.",
     "After dinner, we always take a walk on the beach with the dog."),
    ("El museo abre sus puertas gratis el primer domingo de cada mes.",
     "The museum opens its doors for free on the first Sunday of every month."),
    ("Cuando era pequeño, pasaba los veranos en el pueblo de mis padres.",
     "When I was little, I spent the summers in my parents' village."),
    ("La empresa ha contratado a veinte personas nuevas para el departamento de ventas.",
     "The company has hired twenty new people for the sales department."),
    ("No olvides apagar las luces y cerrar la puerta con llave cuando salgas.",
     "Don't forget to turn off the lights and lock the door when you leave."),
    ("Según el pronóstico, mañana nevará en las montañas del norte.",
     "According to the forecast, tomorrow it will snow in the northern mountains."),
]

FRENCH = [
    ("Le café est froid.", "The coffee is cold."),
    ("Nous partons demain matin.", "We leave tomorrow morning."),
    ("Où est la gare?", "Where is the station?"),
    ("Il pleut depuis trois jours.", "It has been raining for three days."),
    ("Ma voisine adore les chats.", "My neighbour loves cats."),
    ("Fermez la porte, s'il vous plaît.", "Close the door, please."),
    ("Le boulanger ouvre à sept heures.", "The baker opens at seven."),
    ("Je cherche mes lunettes.", "I am looking for my glasses."),
    ("Les enfants dorment déjà.", "The children are already asleep."),
    ("Cette robe coûte trop cher.", "This dress costs too much."),
    ("Chaque été, nous louons une petite maison au bord de la mer en Bretagne.",
     "Every summer, we rent a small house by the sea in Brittany."),
    ("Le musée sera fermé pendant deux mois pour des travaux de rénovation.",
     "The museum will be closed for two months for renovation work."),
    ("Si tu finis tes devoirs avant le dîner, nous pourrons regarder un film ensemble.",
     "If you finish your homework before dinner, we can watch a film together."),
    ("Mon grand-père racontait toujours des histoires de son enfance à la campagne.",
     "My grandfather always told stories of his childhood in the countryside."),
    ("Le train pour Lyon partira avec vingt minutes de retard à cause de la neige.",
     "The train to Lyon will leave twenty minutes late because of the snow."),
    ("Elle a appris le piano toute seule en regardant des vidéos sur internet.",
     "She learned the piano on her own by watching videos on the internet."),
    ("La mairie a décidé de planter des arbres dans toutes les rues du quartier.",
     "The town hall has decided to plant trees in all the streets of the neighbourhood."),
    ("Pendant les vacances, les magasins du centre-ville ferment plus tôt le soir.",
     "During the holidays, the shops in the town centre close earlier in the evening."),
    ("Nous avons mangé une excellente soupe de poisson dans un petit restaurant du port.",
     "We ate an excellent fish soup in a small restaurant at the harbour."),
    ("Il faut réserver les billets au moins une semaine avant le concert.",
     "You have to book the tickets at least a week before the concert."),
]

# Two voices per language: the default and a variant (espeak-ng's "+variant" voices).
VOICES = {"es": ("es", "es+f2"), "fr": ("fr", "fr+m3")}
SETS = {"es": SPANISH, "fr": FRENCH}
SPEED = 150

# The tuning set: 6 short (3-6 words) and 6 longer sentences per language, none of the
# above, each rendered in one of three voices none of the above use (in turn).
TUNE_SPANISH = [
    ("El perro duerme en el sofá.", "The dog sleeps on the sofa."),
    ("¿Cuánto cuesta este libro?", "How much does this book cost?"),
    ("Vamos a la playa.", "Let's go to the beach."),
    ("Mi coche es rojo.", "My car is red."),
    ("Ella trabaja en un hospital.", "She works in a hospital."),
    ("Tengo mucha hambre.", "I am very hungry."),
    ("Esta mañana he perdido el autobús y he llegado tarde a la oficina.",
     "This morning I missed the bus and arrived late at the office."),
    ("Los estudiantes tienen que entregar el trabajo antes del viernes por la tarde.",
     "The students have to hand in the work before Friday afternoon."),
    ("En invierno me gusta leer novelas junto a la chimenea con una taza de chocolate.",
     "In winter I like to read novels by the fireplace with a cup of chocolate."),
    ("El ayuntamiento va a construir un nuevo puente sobre el río.",
     "The town council is going to build a new bridge over the river."),
    ("Mis primos vienen a visitarnos todos los años en Navidad.",
     "My cousins come to visit us every year at Christmas."),
    ("Hemos comprado fruta fresca en el mercado del barrio esta mañana.",
     "We bought fresh fruit at the neighbourhood market this morning."),
]

TUNE_FRENCH = [
    ("Le chien dort sur le canapé.", "The dog sleeps on the sofa."),
    ("Combien coûte ce livre?", "How much does this book cost?"),
    ("Allons à la plage.", "Let's go to the beach."),
    ("Ma voiture est rouge.", "My car is red."),
    ("Elle travaille dans un hôpital.", "She works in a hospital."),
    ("J'ai très faim.", "I am very hungry."),
    ("Ce matin, j'ai raté le bus et je suis arrivé en retard au bureau.",
     "This morning I missed the bus and arrived late at the office."),
    ("Les étudiants doivent rendre leur travail avant vendredi après-midi.",
     "The students have to hand in their work before Friday afternoon."),
    ("En hiver, j'aime lire des romans près de la cheminée avec une tasse de chocolat.",
     "In winter I like to read novels by the fireplace with a cup of chocolate."),
    ("La commune va construire un nouveau pont sur la rivière.",
     "The town is going to build a new bridge over the river."),
    ("Mes cousins viennent nous rendre visite chaque année à Noël.",
     "My cousins come to visit us every year at Christmas."),
    ("Nous avons acheté des fruits frais au marché du quartier ce matin.",
     "We bought fresh fruit at the neighbourhood market this morning."),
]
TUNE_VOICES = {"es": ("es+m1", "es+f4", "es-419+m2"), "fr": ("fr+f2", "fr+m7", "fr-be+f3")}
TUNE_SETS = {"es": TUNE_SPANISH, "fr": TUNE_FRENCH}


def clips(tune: bool = False) -> list[tuple[str, str, str, str, str]]:
    """(file id, language, voice, sentence, English) for every clip of the set (``tune``:
    of the tuning set, ids ``tune_<lang>_<k>.wav``)."""
    sets, voices, head = (TUNE_SETS, TUNE_VOICES, "tune_") if tune else (SETS, VOICES, "")
    out = []
    for lang, sentences in sets.items():
        for i, (text, english) in enumerate(sentences):
            voice = voices[lang][i % len(voices[lang])]
            out.append((f"{head}{lang}_{i:02d}.wav", lang, voice, text, english))
    return out


def _espeak(text: str, voice: str, path: Path) -> Path:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise RuntimeError("espeak-ng is missing: run scripts/setup.sh")
    subprocess.run([exe, "-v", voice, "-s", str(SPEED), "-w", str(path), text], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return path


def render(folder: Path, only: list[str] | None = None, tune: bool = False) -> list[Path]:
    """The set's WAVs in ``folder`` (``only``: those file ids; ``tune``: the tuning set's)."""
    folder.mkdir(parents=True, exist_ok=True)
    return [_espeak(text, voice, folder / name) for name, _, voice, text, _ in clips(tune)
            if only is None or name in only]


def render_long(folder: Path, gap_s: float = 0.6, min_s: float = 32.0) -> list[Path]:
    """Longer recordings in ``folder``: each language's sentences in each of its two voices,
    joined in order, ``gap_s`` of silence apart, into recordings of at least ``min_s``
    seconds (VAD then cuts each into a 30-s segment and the rest), named
    ``long_<lang>_<k>.wav``; the rest that is too short is left out."""
    import tempfile

    import numpy as np
    import soundfile as sf

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for lang, sentences in SETS.items():
        parts, seconds, k = [], 0.0, 0
        for voice, (text, _) in ((v, s) for v in VOICES[lang] for s in sentences):
            with tempfile.TemporaryDirectory() as tmp:
                audio, rate = sf.read(_espeak(text, voice, Path(tmp) / "x.wav"), dtype="float32")
            parts += [audio, np.zeros(int(gap_s * rate), dtype=np.float32)]
            seconds += len(audio) / rate + gap_s
            if seconds >= min_s:
                path = folder / f"long_{lang}_{k}.wav"
                sf.write(path, np.concatenate(parts), rate)
                paths.append(path)
                parts, seconds, k = [], 0.0, k + 1
    return paths


def score_segments(rows: list[dict]) -> dict:
    """Per language, over the segments of ``render_long``'s recordings: how many were
    decoded in the recording's language (and what the others were)."""
    out = {}
    for lang in SETS:
        segs = [(r["id"], k, sg["language"]) for r in rows if r["id"].startswith(f"long_{lang}_")
                for k, sg in enumerate(r["segments"])]
        out[lang] = {"recordings": len({i for i, _, _ in segs}), "segments": len(segs),
                     "language_right": sum(x == lang for _, _, x in segs),
                     "wrong": {f"{i}#{k}": x for i, k, x in segs if x != lang}}
    return out


def score(rows: list[dict], translate: bool = False) -> dict:
    """Per language: rows whose language is right (and what the others got), loops (a
    text whose compression ratio is above Whisper's 2.4), and the corpus CER of the texts
    against the sentences (Whisper's basic normaliser: case and punctuation, diacritics
    kept), over all rows and without the loops (a loop's hundreds of characters outweigh
    the rest); with ``translate``, the corpus WER against the English translations
    (Whisper's English normaliser) instead, and the rows of ASCII text."""
    from transformers.models.whisper.english_normalizer import BasicTextNormalizer

    import jiwer
    from shardscribe.pipeline.filters import compression_ratio
    from shardscribe.pipeline.metrics import corpus_wer

    basic = BasicTextNormalizer()
    truth = {name: (lang, text, english) for name, lang, _, text, english in clips() + clips(tune=True)}
    out = {}
    for lang in SETS:
        mine = sorted((r for r in rows if truth.get(r["id"], (None,))[0] == lang), key=lambda r: r["id"])
        loops = {r["id"] for r in mine if compression_ratio(r["text"] or "") > 2.4}
        entry = {"rows": len(mine), "language_right": sum(r["language"] == lang for r in mine),
                 "wrong": {r["id"]: r["language"] for r in mine if r["language"] != lang}, "loops": len(loops)}
        if translate:
            # English text has no accents nor another script (a coarse check, with the WER)
            entry["ascii_rows"] = sum(bool((r["text"] or "").strip()) and (r["text"] or "").isascii() for r in mine)
        column = 2 if translate else 1
        for name, part in (("", mine), ("_without_loops", [r for r in mine if r["id"] not in loops])):
            refs = [truth[r["id"]][column] for r in part]
            hyps = [r["text"] or "" for r in part]
            if translate:
                entry["wer_vs_english" + name] = corpus_wer(refs, hyps)
            else:
                entry["cer" + name] = jiwer.cer([basic(t).strip() for t in refs], [basic(t).strip() for t in hyps])
        out[lang] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render")
    r.add_argument("folder", type=Path)
    r.add_argument("--long", action="store_true", help="the joined recordings of 32 s or more (render_long)")
    r.add_argument("--tune", action="store_true", help="the tuning set (TUNE_SPANISH, TUNE_FRENCH)")
    s = sub.add_parser("score")
    s.add_argument("output", type=Path)
    s.add_argument("--translate", action="store_true")
    s.add_argument("--segments", action="store_true", help="per segment of the joined recordings")
    args = parser.parse_args(argv)
    if args.command == "render":
        if args.long:
            render_long(args.folder)
        else:
            render(args.folder, tune=args.tune)
        return 0
    import pyarrow.parquet as pq

    rows = pq.read_table(args.output, columns=["id", "language", "text", "segments"]).to_pylist()
    result = score_segments(rows) if args.segments else score(rows, args.translate)
    json.dump(result, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
