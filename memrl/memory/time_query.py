"""Time expressions in questions: the period a question names, and the rescoring that favours facts dated in it.

A question names a period absolutely (``in May 2023``, ``2022``) or relative to the date it was asked (``two weeks
ago``, ``in the past three months``, ``last month``). :func:`time_rescore` adds :data:`TIME_WEIGHT` to facts
dated in a named year/month and multiplies the score of facts dated in a relative period by
``1 + RANGE_BOOST``.
"""

from __future__ import annotations

import datetime as dt
import re

from memrl.memory.store import FactRecord, Ranked

_MONTHS = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
_YEAR = re.compile(r"\b(19|20)\d{2}\b")
_NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
_COUNT = {"a": 1, "an": 1, **{w: i for i, w in enumerate(_NUMBERS, start=1)}}
_UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}
_COUNT_RE = rf"(a|an|{'|'.join(_NUMBERS)}|\d+)"
_AGO = re.compile(rf"\b{_COUNT_RE}\s+(day|week|month|year)s?\s+ago\b")  # "two weeks ago"
_SPAN = re.compile(
    rf"\b(?:last|past|previous)\s+(?:{_COUNT_RE}\s+)?(day|week|month|year)s?\b"
)  # "past 3 months"
# Dates as the adapters write them: LongMemEval "2023/05/21 (Sun) 19:50", LoCoMo "1:56 pm on 8 May, 2023".
_DATE_FORMATS = (
    (re.compile(r"\d{4}/\d{1,2}/\d{1,2}"), "%Y/%m/%d"),
    (re.compile(r"\d{1,2} [A-Za-z]+,? \d{4}"), "%d %B %Y"),
    (re.compile(r"\d{4}-\d{2}-\d{2}"), "%Y-%m-%d"),
)

# In-range facts are worth 1 + RANGE_BOOST times their score: a boost in proportion to relevance. An additive
# bonus (as for named months) lifts every in-range filler fact above the out-of-range evidence a question lists.
RANGE_BOOST = 0.5
# Bonus of facts dated in the year/month a question names; fused scores run from about 0.01 to 0.14, so it lifts
# a fact of that period over candidates of similar rank, not over a far better match.
TIME_WEIGHT = 0.05


def query_periods(text: str) -> tuple[set[str], set[str]]:
    """Years and month names a query mentions (lower-cased)."""
    low = text.lower()
    years = {m.group(0) for m in _YEAR.finditer(low)}
    months = {m for m in _MONTHS if re.search(rf"\b{m}\b", low)}
    return years, months


def parse_date(stamp: str | None) -> dt.date | None:
    """The calendar date in a timestamp string, or None when it has none that memrl reads."""
    for pattern, fmt in _DATE_FORMATS:
        m = pattern.search(stamp or "")
        if m:
            try:
                return dt.datetime.strptime(m.group(0).replace(",", ""), fmt).date()
            except ValueError:
                continue
    return None


def _count(word: str | None) -> int:
    return 1 if word is None else int(word) if word.isdigit() else _COUNT[word]


def relative_period(query: str, asked_at: str | None) -> tuple[dt.date, dt.date] | None:
    """The date range a question's relative time names, from the date it was asked: "two weeks ago" is the
    week around 14 days before (a span's quarter on each side, at least two days), "in the past three months"
    / "last month" the 90 / 30 days before. None when the question names none or its date is unknown."""
    asked = parse_date(asked_at)
    if asked is None:
        return None
    low = query.lower()
    m = _AGO.search(low)
    if m:
        days = _count(m.group(1)) * _UNIT_DAYS[m.group(2)]
        slack = dt.timedelta(days=max(2, days // 4))
        centre = asked - dt.timedelta(days=days)
        return centre - slack, min(asked, centre + slack)
    m = _SPAN.search(low)
    if m:
        return asked - dt.timedelta(days=_count(m.group(1)) * _UNIT_DAYS[m.group(2)]), asked
    return None


def time_rescore(
    ranked: Ranked, records: dict[int, FactRecord], query: str, asked_at: str | None = None
) -> Ranked:
    """Multiply the fused score of facts dated in the range the query's relative time names from ``asked_at``
    by ``1 + RANGE_BOOST``; add ``TIME_WEIGHT`` × (dated in the year/month the query names). Scores stay
    "higher = better"."""
    if not ranked:
        return ranked
    years, months = query_periods(query)
    period = relative_period(query, asked_at)
    out = []
    for fid, score in ranked:
        rec = records[fid]
        stamp = (rec.timestamp or "").lower()
        bonus = 0.0
        if (years or months) and stamp:
            hit_year = not years or any(y in stamp for y in years)
            hit_month = not months or any(m in stamp for m in months)
            bonus += TIME_WEIGHT * float(hit_year and hit_month)
        if period is not None:
            day = parse_date(rec.timestamp)
            if day is not None and period[0] <= day <= period[1]:
                score *= 1.0 + RANGE_BOOST
        out.append((fid, score + bonus))
    return sorted(out, key=lambda kv: -kv[1])
