"""Structured domain sentences: maintenance reports, commands and measurements.

Not a paper algorithm: text for the CTC draft head of "Self-Speculative Decoding for
LLM-based ASR with CTC Encoder Drafts" and later the token-map drafter of "Model-free
Speculative Decoding for Transformer-based ASR with Token Map Drafting". Each sentence
comes in two forms:
- ``text``: the transcript as Whisper tiny.en writes it (cased, punctuated, digits for
  numbers, "%" for percent, other units spelt out), checked by rendering with espeak-ng,
  flite and festival and decoding with Whisper: "three point five millimeters" comes back as
  "3.5 millimeters", "forty five percent" as "45%";
- ``spoken``: the same sentence with every number in words, because the engines misread
  digits and symbols (espeak-ng says "mm" as "em em", flite drops some digit strings).
"""
from __future__ import annotations

import random

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
         "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
         "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def int_to_words(n: int) -> str:
    """English words for 0 <= n < 1,000,000 (American style, no "and")."""
    if n < 0 or n >= 1_000_000:
        raise ValueError(f"{n} out of range")
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + int_to_words(rest))
    rest = n % 1000
    return int_to_words(n // 1000) + " thousand" + ("" if rest == 0 else " " + int_to_words(rest))


def number_to_words(digits: str) -> str:
    """Words for "12", "3.5", "0.25": decimals are read digit by digit after "point"."""
    whole, _, frac = digits.partition(".")
    words = int_to_words(int(whole))
    if frac:
        words += " point " + " ".join(_ONES[int(d)] for d in frac)
    return words


EQUIPMENT = ["pump", "valve", "compressor", "conveyor", "boiler", "generator", "fan",
             "filter", "bearing", "motor", "gearbox", "chiller", "heat exchanger", "turbine",
             "hydraulic press", "cooling tower", "mixer", "crane", "forklift", "transformer"]
PLACES = ["the north wing", "the loading dock", "the boiler room", "line two", "line three",
          "the east yard", "the paint shop", "the main hall", "the roof", "the basement",
          "the packing area", "the control room", "building four", "the warehouse"]
PEOPLE = ["Maria", "John", "the night shift", "the day shift", "the contractor", "Ahmed",
          "Sarah", "the inspector", "Tom", "the supervisor", "Priya", "the operator"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
ACTIONS = ["Replace", "Inspect", "Tighten", "Lubricate", "Calibrate", "Clean", "Check",
           "Test", "Isolate", "Restart", "Drain", "Refill", "Adjust", "Shut down"]
FAULTS = ["a small leak", "a loud rattle", "excessive vibration", "a burning smell",
          "a cracked housing", "a loose belt", "low oil", "a blocked intake", "corrosion",
          "a worn seal", "an intermittent fault", "a tripped breaker"]
# (quantity, unit in words as Whisper writes it, spoken unit, low, high, decimals)
MEASURES = [
    ("pressure", "PSI", "P S I", 10, 150, 0),
    ("pressure", "bar", "bar", 1, 12, 1),
    ("temperature", "degrees", "degrees", 15, 120, 0),
    ("voltage", "volts", "volts", 3, 480, 1),
    ("current", "amps", "amps", 1, 60, 1),
    ("speed", "RPM", "R P M", 300, 3600, 0),
    ("flow rate", "liters per minute", "liters per minute", 2, 90, 1),
    ("gap", "millimeters", "millimeters", 1, 25, 1),
    ("weight", "kilograms", "kilograms", 2, 900, 0),
    ("level", "%", "percent", 5, 100, 0),
    ("humidity", "%", "percent", 20, 95, 0),
    ("torque", "newton meters", "newton meters", 10, 250, 0),
]


def _number(rng: random.Random, low: float, high: float, decimals: int) -> str:
    if decimals and rng.random() < 0.6:
        value = rng.uniform(low, high)
        return f"{value:.{decimals}f}"
    return str(rng.randint(int(low), int(high)))


def _measure(rng: random.Random) -> tuple[str, str, str]:
    """(quantity, text value+unit, spoken value+unit)."""
    quantity, unit, spoken_unit, low, high, dec = rng.choice(MEASURES)
    num = _number(rng, low, high, dec)
    text = f"{num}%" if unit == "%" else f"{num} {unit}"
    return quantity, text, f"{number_to_words(num)} {spoken_unit}"


def _tag(rng: random.Random) -> tuple[str, str]:
    n = str(rng.randint(1, 40))
    return n, number_to_words(n)


def domain_sentence(rng: random.Random) -> dict:
    """One sentence: {"text", "spoken", "kind"}."""
    eq = rng.choice(EQUIPMENT)
    num, num_w = _tag(rng)
    quantity, m_text, m_spoken = _measure(rng)
    place, who, day = rng.choice(PLACES), rng.choice(PEOPLE), rng.choice(DAYS)
    action, fault = rng.choice(ACTIONS), rng.choice(FAULTS)
    kind = rng.choice(["command", "report", "measure", "setpoint", "schedule"])
    if kind == "command":
        t = f"{action} the {eq} {{n}} in {place}."
    elif kind == "report":
        t = rng.choice([f"{who.capitalize()} reported {fault} on {eq} {{n}}.",
                        f"The {eq} in {place} shows {fault}.",
                        f"We found {fault} on the {eq} near {place}."])
    elif kind == "measure":
        t = rng.choice([f"The {quantity} on {eq} {{n}} is {{m}}.",
                        f"{quantity.capitalize()} reads {{m}} at {place}.",
                        f"The {eq} {quantity} dropped to {{m}} this morning."])
    elif kind == "setpoint":
        t = rng.choice([f"Set the {quantity} of {eq} {{n}} to {{m}}.",
                        f"Keep the {quantity} below {{m}} until {day}."])
    else:
        t = rng.choice([f"{action} the {eq} before {day} morning.",
                        f"{who.capitalize()} will service {eq} {{n}} on {day}.",
                        f"Schedule a check of the {eq} in {place} for {day}."])
    text = t.format(n=num, m=m_text)
    spoken = t.format(n=num_w, m=m_spoken)
    text = text[0].upper() + text[1:]
    return {"text": text, "spoken": spoken, "kind": kind}


def domain_sentences(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    seen, out = set(), []
    for _ in range(n * 20):
        s = domain_sentence(rng)
        if s["text"] not in seen:
            seen.add(s["text"])
            out.append(s)
            if len(out) == n:
                break
    return out
