"""News prose, the text of every synthetic dataset: whole sentences drawn from a fixed pool (seeded), exact
character counts or at least so many words, each entry in the reference's instruction scaffolding. The dataset
generator (``datagen``, ``visiongen``) writes it and the tiny model's tokenizer is trained on it."""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import lru_cache

from harness.contract.formats import RESPONSE_TEMPLATE

# The fixed scaffolding around input and response: 111 + 16 = 127 characters, the "+ 127
# (prompt)" of the reference dataset descriptions. tests/test_data.py holds us to that number.
PROMPT_HEAD = ("Below is the start of a news story. Write the next part of the story in the same style "
               "and length.\n\n### Input:\n")
PROMPT_MID = "\n" + RESPONSE_TEMPLATE + "\n"
SCAFFOLD_CHARS = len(PROMPT_HEAD) + len(PROMPT_MID)

# Word source for the datasets and for the tiny model's tokenizer (harness.data.tinymodel trains on
# news_corpus(), so its merges fit the data it will see).
_CITIES = ("Springfield", "Riverton", "Lakeview", "Northbridge", "Port Ellis", "Millbrook", "Eastwood",
           "Granite Falls", "Cedar Hill", "Westhaven", "Oakridge", "Fairmont", "Bayside", "Kingsford",
           "Ashford", "Silver Bay", "Highland Park", "Clearwater", "Brookfield", "Stonegate")
_TITLES = ("Mayor", "Senator", "Minister", "Professor", "Judge", "Governor", "Director", "Councillor",
           "Chief Inspector", "Dr.", "Commissioner", "Chancellor")
_SURNAMES = ("Alvarez", "Bennett", "Chen", "Dubois", "Evans", "Fischer", "Garcia", "Hughes", "Ivanova",
             "Johnson", "Kowalski", "Lindqvist", "Morgan", "Nakamura", "Okafor", "Patel", "Quinn", "Rossi",
             "Schmidt", "Tanaka", "Usman", "Varga", "Walsh", "Young", "Zhang")
_ORGS = ("city council", "central bank", "health ministry", "transport authority", "school board",
         "state legislature", "energy regulator", "planning committee", "finance ministry", "port authority",
         "water utility", "police department", "county court", "trade union", "chamber of commerce")
_COMPANIES = ("Northwind Energy", "Bluefield Motors", "Harbor Logistics", "Summit Foods", "Apex Telecom",
              "Greenline Rail", "Ironclad Steel", "Brightway Pharma", "Crescent Airlines", "Vista Software")
_SECTORS = ("energy", "housing", "transport", "education", "health care", "farming", "tourism", "technology",
            "manufacturing", "retail", "shipping", "banking")
_NOUNS = ("budget", "proposal", "report", "plan", "policy", "contract", "investigation", "reform", "project",
          "agreement", "inquiry", "programme", "strategy", "review", "ruling", "deal", "scheme", "forecast")
_VERBS = (("approve", "approved"), ("reject", "rejected"), ("announce", "announced"), ("delay", "delayed"),
          ("review", "reviewed"), ("unveil", "unveiled"), ("defend", "defended"), ("expand", "expanded"),
          ("suspend", "suspended"), ("revise", "revised"), ("fund", "funded"), ("challenge", "challenged"))
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_ADVERBIALS = ("after months of debate", "despite strong opposition", "amid rising costs",
               "following a public consultation", "ahead of the election", "in a closed session",
               "after a lengthy review", "under pressure from residents", "for the second time this year",
               "without a formal vote", "in response to the findings")
_SOURCES = ("officials familiar with the matter", "a spokesperson", "local media", "court documents",
            "a statement released by the office", "people close to the negotiations", "the latest figures",
            "an internal memo")
_ISSUES = ("the shortage of affordable homes", "long waiting times", "rising energy bills", "traffic congestion",
           "the lack of skilled workers", "flooding along the river", "falling school enrolment",
           "air quality near the port")
_INCIDENTS = ("a collision on the ring road", "a fire at a warehouse", "a gas leak near the station",
              "a storm that struck overnight", "a power cut in the old town")

_TEMPLATES = (
    "{title} {surname} said on {day} that the {org} would {verb} the {sector} {noun} {adverbial}.",
    "The {org} in {city} {verbed} a {money} {sector} {noun} on {day}, according to {sources}.",
    "In {city}, {sources} said the {noun} had been {verbed} {adverbial}.",
    "Analysts expect {sector} prices to rise by {pct} over the next {n} months.",
    "\"We will {verb} this {noun} {adverbial},\" {title} {surname} told reporters in {city}.",
    "Residents of {city} {verbed} the {org}'s {noun} at a public meeting on {day} evening.",
    "The {noun} follows a {pct} fall in {sector} spending last year, {sources} said.",
    "Shares in {company} rose {pct} on {day} after the firm {verbed} its annual {noun}.",
    "Police in {city} said {n} people were treated in hospital after {incident} on {day}.",
    "{company} said it would hire {count} workers in {city} by the end of {year}.",
    "Critics argue that the {noun} does little to address {issue} in {city}.",
    "The vote on the {sector} {noun} is expected in {month}, {sources} said.",
    "{title} {surname}, who has led the {org} since {year}, declined to comment on the {noun}.",
    "The {org} estimates that the {noun} will cost {money} over {n} years.",
    "Figures published on {day} showed {sector} output grew by {pct} in {month}.",
    "Opposition members called the {noun} {adj} and said the {org} had ignored {issue}.",
)
_ADJECTIVES = ("rushed", "unfair", "overdue", "costly", "reckless", "welcome", "modest", "ambitious", "vague")


def _sentence(rng: random.Random) -> str:
    verb, verbed = rng.choice(_VERBS)
    slots = {
        "title": rng.choice(_TITLES), "surname": rng.choice(_SURNAMES), "org": rng.choice(_ORGS),
        "city": rng.choice(_CITIES), "company": rng.choice(_COMPANIES), "sector": rng.choice(_SECTORS),
        "noun": rng.choice(_NOUNS), "verb": verb, "verbed": verbed, "day": rng.choice(_DAYS),
        "month": rng.choice(_MONTHS), "adverbial": rng.choice(_ADVERBIALS), "sources": rng.choice(_SOURCES),
        "issue": rng.choice(_ISSUES), "incident": rng.choice(_INCIDENTS), "adj": rng.choice(_ADJECTIVES),
        "n": rng.randint(2, 40), "count": f"{rng.randint(1, 9)},{rng.randint(0, 999):03d}",
        "pct": f"{rng.randint(1, 19)}.{rng.randint(0, 9)} percent", "year": rng.randint(1998, 2026),
        "money": f"${rng.randint(2, 950)} million",
    }
    return rng.choice(_TEMPLATES).format(**slots)


_POOL_SIZE = 8192


@lru_cache(maxsize=4)
def sentence_pool(seed: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """A fixed pool of sentences and their whitespace-separated word counts.

    Entries are drawn from a pool rather than built word by word: the long ids need ~67
    million words, and picking whole sentences keeps generation to seconds.
    """
    rng = random.Random(f"sbench-news-pool:{seed}")
    sentences = tuple(_sentence(rng) for _ in range(_POOL_SIZE))
    return sentences, tuple(len(s.split()) for s in sentences)


def news_corpus(n_chars: int, *, seed: int = 0) -> Iterator[str]:
    """Yield whole dataset-style entries (scaffolding included) until ``n_chars`` characters."""
    rng = random.Random(f"sbench-news-corpus:{seed}")
    pool, _ = sentence_pool(seed)
    total = 0
    while total < n_chars:
        text = PROMPT_HEAD + chars_text(rng, pool, 512) + PROMPT_MID + chars_text(rng, pool, 1024)
        total += len(text)
        yield text


def chars_text(rng: random.Random, pool: tuple[str, ...], n: int) -> str:
    """Exactly ``n`` characters of news prose: whole sentences, the last one cut at ``n``."""
    parts: list[str] = []
    length = -1
    while length < n:
        s = pool[rng.randrange(len(pool))]
        parts.append(s)
        length += len(s) + 1
    text = " ".join(parts)[:n]
    # A cut right after a word would leave a trailing blank; end the sentence instead.
    return text[:-1] + "." if text.endswith(" ") else text


_PARAGRAPH_RHYTHM = (5, 3, 7, 4, 6, 8, 4, 5)


def words_text(rng: random.Random, pool: tuple[str, ...], counts: tuple[int, ...], min_words: int) -> str:
    """News paragraphs with at least ``min_words`` whitespace-separated words (counted exactly)."""
    picks: list[str] = []
    words = 0
    size = len(pool)
    while words < min_words:
        # Draw in chunks: one rng call per ~16 words would dominate the run time otherwise.
        for j in rng.choices(range(size), k=max(16, (min_words - words) // 14 + 1)):
            picks.append(pool[j])
            words += counts[j]
            if words >= min_words:
                break
    paragraphs, i, k = [], 0, 0
    while i < len(picks):
        step = _PARAGRAPH_RHYTHM[k % len(_PARAGRAPH_RHYTHM)]
        paragraphs.append(" ".join(picks[i:i + step]))
        i, k = i + step, k + 1
    return "\n\n".join(paragraphs)


def entry(input_text: str, response: str) -> str:
    return PROMPT_HEAD + input_text + PROMPT_MID + response
