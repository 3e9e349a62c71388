"""A deterministic synthetic English corpus: trains the reference tokenizer and makes prompts.

No download: words and sentence shapes are listed here, and a seeded generator strings them together.
"""

from __future__ import annotations

import random

WORDS = """
the of and to in is that for it as was with be by on not he this are or his from at which but have an
they you were her she there been one all we their has would when if so no will more can said who about
what some them other than into only its time could new these two may first then do any like my now over
such our man me even most made after also did many before must through back years where much your way well
down should because each just those people how too little state good very make world still own see men work
long get here between both life being under never day same another know while last might us great old year
off come since against go came right used take three model token tokens prompt prefill decode cache block
blocks batch server request requests latency throughput bandwidth memory compute layer layers attention
head heads query key value vector matrix tensor engine instance instances cluster node nodes network queue
schedule scheduler stream streaming first output input length sequence sequences transfer bytes fast slow
GPU GPUs CPU Triton disaggregated colocated percentile goal target rate second seconds millisecond budget
""".split()

PUNCT = [",", ".", ".", ";", ":", "?", "!"]
EXTRA = "0123456789 ()[]{}<>/\\|-_=+*&^%$#@~`'\"\n\t"


def sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
    words[0] = words[0].capitalize()
    if rng.random() < 0.3:
        words.insert(rng.randint(1, len(words) - 1), str(rng.randint(0, 4096)))
    return " ".join(words) + rng.choice(PUNCT)


def text(num_sentences: int, seed: int) -> str:
    rng = random.Random(seed)
    parts = []
    for i in range(num_sentences):
        parts.append(sentence(rng))
        parts.append("\n" if i % 7 == 6 else " ")
    return "".join(parts)


def training_corpus() -> str:
    return text(3000, seed=1234) + EXTRA
