"""From collected events to ranked diagnoses: which failure came first, what it explains.

Rules, in order:

1. Every (code, role) seen becomes one :class:`~.model.Diagnosis`, grouped over all ranks.
2. The root cause is the earliest root-cause diagnosis. "Earliest" compares times when every
   candidate's first event has a time of the same kind (timestamps carried forward per rank),
   otherwise reading order (file order, then line). Root causes below :data:`WEAK` confidence only
   win when there is no stronger one.
   A wrapper error whose reason follows it (``Code.cause_follows``: NCCL's "unhandled system error" then
   "Last error: ...") yields the lead to a more specific root cause recognised in those lines.
3. Cascades never become the root cause while one exists; they are attached to it
   (``explained_by``). Without a root cause the earliest cascade leads, with a note to look for
   the rank that failed first, and its confidence as an answer is :data:`CASCADE_AS_ANSWER` of the
   line's: a collective that timed out names where a failure showed, not its family (on the tuning
   half, cascades that led were right 2 times of 4), so a cascade is never a sure answer.
4. Confirmations raise the confidence of a compatible root cause (same family, or related codes)
   and attach to it; advice is listed last and is never a cause.
5. torchrun's summary (``Root Cause (first observed failure)``) raises confidence when it points
   at the same rank, and supplies ``first_failure`` when no signature matched.
6. ``unmatched_errors``: without a root cause, the most relevant error lines no signature matched;
   with one, only those it does not explain (a second, independent failure stays visible).
7. Symptoms become hypotheses (role ``hypothesis``), one per code, each with how to confirm it.
   Symptoms of one family support each other: the family's best hypothesis gets
   ``1 - prod(1 - c)`` over its codes, capped at :data:`~torchdoctor.signature.SYMPTOM_MAX`. With a
   root cause they are listed after it; without one, hypotheses and cascades (weighed as in rule 3)
   are ranked together, so ``diagnoses[0]`` is the best hypothesis and its confidence says how sure.
   Without any root cause, cascade or symptom, confirmations (torchrun's "exitcode: -9" alone) become
   the hypotheses (:func:`_confirmations_alone`).
8. When nothing names a cause (no root cause, cascade or hypothesis), the words of the log (its
   first :data:`~.collect.HEAD_BYTES` and the error lines kept) may still point at a family
   (:mod:`.cues`): a ``guess`` leads, with its words as the reason and a confidence of at most
   :data:`~.cues.MAX_CONFIDENCE`. A guess does not count as explained (exit code 1).
9. A sure root cause (confidence >= :data:`SURE`) that the words of the log all but rule out, while
   they point hard at another family, is demoted below :data:`SURE`, and the words' family is
   listed after it as a guess (:func:`_second_opinion`).
10. A hypothesis that leads (rule 7: a symptom, often a sentence of prose) whose family the words all but rule
    out, while they point hard at another family, yields the lead to that family's hypothesis, or to the
    words' guess (:func:`_words_over_symptom`). It yields just as well when the words merely rank first a
    family whose failures show as that symptom (:data:`~torchdoctor.families.SHOWS_AS`: ranks that took
    different paths hang in a collective): the cause behind the symptom leads. A cascade that leads keeps
    the lead: it is a line the failure printed, and the words of a machine log are not evidence against it.
11. An error whose usual cause differs on a run over several machines (``Code.across_nodes``) on a log that shows
    several nodes (ranks on several hosts, or the words of a multi-node run) is read as that cause, below
    :data:`SURE`: NCCL's generic errors ('unhandled system error', 'internal error', 'remote process exited') as the
    network between the nodes (TD489, dist-connect), 'invalid device ordinal' as the global rank used as the device
    index (TD479, dist-env). The code as printed follows, explained by it (:func:`_across_nodes`).
"""

from __future__ import annotations

import re
from typing import Any

from ..catalogue.log_dist import MULTI_NODE
from ..families import SHOWS_AS
from ..registry import Code, Hit
from ..signature import SYMPTOM_MAX
from ..stopping import signal_name
from .collect import MAX_GROUP_RANKS, Collector, Event, Group
from .cues import MAX_CONFIDENCE as WORDS_MAX
from .model import Diagnosis, ExplainReport, LineRef, UnmatchedError
from .normalize import RankFailure

WEAK = 0.5
ROLE_ORDER = {"root-cause": 0, "cascade": 1, "confirmation": 2, "advice": 3, "symptom": 4}
SURE = 0.8
"""Answers at or above this confidence are meant to be right at least 95% of the time."""
DOUBT_BELOW = 0.05
DOUBT_OTHER = 0.5
DOUBTED = 0.75
"""Rule 9: a sure answer whose family the word model gives under DOUBT_BELOW, while it gives another
family at least DOUBT_OTHER, drops to DOUBTED (cross-validated on the tuning half: of 88 sure
answers, 2 had the words disagree, 1 that way, and it was the one wrong)."""
WORDS_LEAD = 0.7
SYMPTOM_AGAINST = 0.1
"""Rule 10: the words take the lead from a hypothesis when they give another family at least WORDS_LEAD and the
hypothesis' family at most SYMPTOM_AGAINST (10-fold CV on the tuning half of 669 reports: 5 answers changed, all
from wrong to right; on 43 reports gathered afterwards and measured before the word model read them, none
changed)."""
ACROSS_NODES = 0.7
"""Rule 11: the confidence of a generic NCCL error read as the network between nodes (tuning half of 725 reports:
such errors on logs that show several nodes were settled as dist-connect 3 times of 4)."""
_MULTI_NODE = re.compile(MULTI_NODE)
CASCADE_AS_ANSWER = 0.7
"""A cascade's confidence as an answer when no root cause was found (rules 3 and 7)."""
SHOW_UNMATCHED = 8
"""Unmatched error lines reported, most relevant first (see :mod:`.relevance`)."""
MAX_RANKS_REPORTED = 4096


def _uses_time(groups: list[Group]) -> bool:
    """Times decide only when every group's first event has a time, all of one kind."""
    kinds = {g.earliest_time.time[0] if g.earliest_time is not None and g.earliest_time.time else None for g in groups}
    return len(kinds) == 1 and None not in kinds


def _order_key(groups: list[Group]) -> Any:
    if _uses_time(groups):
        return lambda g: (g.earliest_time.time[1], g.earliest_time.seq)
    return lambda g: g.first.seq


def _first_event(g: Group, by_time: bool) -> Event:
    return g.earliest_time if by_time and g.earliest_time is not None else g.first


def _compatible(a: Code, b: Code) -> bool:
    return a.family == b.family or a.code in b.related or b.code in a.related


def _boost(confidence: float, support: float) -> float:
    return min(0.99, 1 - (1 - confidence) * (1 - support))


def _cause_that_follows(chosen: Group, strong: list[Group], codes: dict[str, Code]) -> Group:
    """Rule 2b: a wrapper error (``Code.cause_follows``: NCCL's 'unhandled system error') gives the lead to a more
    specific root cause recognised in the lines printed right after it (its 'Last error:' reason)."""
    window = codes[chosen.code].cause_follows
    if not window:
        return chosen
    src, line = chosen.first.seq
    after = [
        g
        for g in strong
        if g is not chosen
        and not codes[g.code].cause_follows
        and g.first.seq[0] == src
        and 0 < g.first.seq[1] - line <= window
    ]
    return min(after, key=lambda g: g.first.seq) if after else chosen


def _diagnosis(g: Group, code: Code, first: Event, extra: dict[str, str] | None = None) -> Diagnosis:
    """``extra``: values for the code's placeholders that the line itself does not give (rule 11's reading)."""
    # a value the log does not show (a placeholder, a cut line) is said to be unknown, never left as {name}
    unknown = dict.fromkeys(code.placeholders(), "?")
    given = {k: v for k, v in (extra or {}).items() if k in unknown}
    values = {**unknown, **given, "rank": str(first.ref.rank) if first.ref.rank is not None else "?", **first.values}
    if first.ref.host:
        values.setdefault("host", first.ref.host)
    finding = code.finding(Hit(values))
    evidence = [first.ref] + [e.ref for e in g.evidence if e.ref != first.ref]
    notes: list[str] = []
    if first.how == "cut-traceback":
        notes.append(
            f"read from the last source line of a traceback cut before its exception line ({first.ref.location})"
        )
    if first.how == "cut-line":
        notes.append(
            f"the line is cut short ({first.ref.location}): recognised from what it holds; values past the cut are unknown"
        )
    if first.joined is not None:
        notes.append(
            f"a wrapped line: joined with its continuation at {first.joined.location}, "
            "which has no rank prefix of its own"
        )
    return Diagnosis(
        code=code.code,
        name=code.name,
        family=code.family,
        role=g.role,
        confidence=g.confidence,
        rank=first.ref.rank,
        host=first.ref.host,
        title=code.title,
        message=finding.message,
        fix=finding.fix,
        evidence=evidence[:6],
        ranks=sorted(g.ranks),
        count=g.count,
        values=dict(first.values),
        traceback=list(first.traceback),
        time=first.time[1] if first.time else None,
        notes=notes,
    )


def triage(col: Collector, codes: dict[str, Code], sources: list[str]) -> ExplainReport:
    groups = list(col.groups.values())
    by_role: dict[str, list[Group]] = {r: [] for r in ROLE_ORDER}
    for g in groups:
        by_role.setdefault(g.role, []).append(g)
    roots = by_role["root-cause"]
    strong = [g for g in roots if g.confidence >= WEAK] or roots
    by_time = bool(strong) and _uses_time(strong)
    chosen = min(strong, key=_order_key(strong)) if strong else None
    wrapped = chosen
    chosen = _cause_that_follows(chosen, strong, codes) if chosen is not None else None

    diagnoses: list[Diagnosis] = []
    root_diag: Diagnosis | None = None
    if chosen is not None:
        first = _first_event(chosen, by_time)
        root_diag = _diagnosis(chosen, codes[chosen.code], first)
        if wrapped is not chosen and wrapped is not None:
            root_diag.notes.append(f"the reason printed with {wrapped.code}'s error, which names no cause itself")
        diagnoses.append(root_diag)
        between = _across_nodes(root_diag, chosen, first, col, codes)
        if between is not None:
            diagnoses.insert(0, between)
            root_diag = between
    other_roots = sorted((g for g in roots if g is not chosen), key=lambda g: g.first.seq)
    diagnoses += [_diagnosis(g, codes[g.code], g.first) for g in other_roots]
    for d in diagnoses[1:]:
        if d.explained_by is not None:
            continue
        if root_diag is not None and wrapped is not None and wrapped is not chosen and d.code == wrapped.code:
            d.explained_by = root_diag.code
            d.notes.append(f"the error that printed {root_diag.code}'s reason")
        else:
            d.notes.append(f"seen after the root cause {root_diag.code}" if root_diag else "")

    cascades = sorted(by_role["cascade"], key=_order_key(by_role["cascade"])) if by_role["cascade"] else []
    for g in cascades:
        d = _diagnosis(g, codes[g.code], g.first)
        if root_diag is not None:
            d.explained_by = root_diag.code
            d.notes.append(f"a symptom: explained by {root_diag.code} on rank {_rank_text(root_diag.rank)}")
        else:
            # as an answer it says where a failure showed, not what caused it: never a sure one (rule 3)
            d.confidence = round(d.confidence * CASCADE_AS_ANSWER, 2)
            d.notes.append(
                "a symptom of a failure elsewhere: no root cause was found in these logs; "
                "look at the rank that failed first (its own log may be missing)"
            )
        diagnoses.append(d)

    for g in sorted(by_role["confirmation"], key=lambda g: g.first.seq):
        d = _diagnosis(g, codes[g.code], g.first)
        target = next(
            (r for r in diagnoses if r.role == "root-cause" and _compatible(codes[r.code], codes[g.code])), None
        )
        if target is not None:
            target.confidence = _boost(target.confidence, 0.5 * g.confidence)
            target.notes.append(f"confirmed by {g.code} ({g.count} line{'s' if g.count != 1 else ''})")
            d.explained_by = target.code
        diagnoses.append(d)
    for g in sorted(by_role["advice"], key=lambda g: g.first.seq):
        d = _diagnosis(g, codes[g.code], g.first)
        d.notes.append("advice printed next to the failure: context, not a cause")
        diagnoses.append(d)

    hypotheses = _hypotheses(by_role["symptom"], codes)
    if root_diag is None and not hypotheses and not cascades:
        hypotheses = _confirmations_alone(diagnoses, codes)
    if root_diag is None and hypotheses:
        lead = [d for d in diagnoses if d.role == "cascade"]
        rest = [d for d in diagnoses if d.role != "cascade"]
        ranked = sorted(lead + hypotheses, key=lambda d: -d.confidence)  # cascades already weighed
        diagnoses = ranked + rest
    else:
        diagnoses += hypotheses

    if not any(d.role in ("root-cause", "cascade", "hypothesis") for d in diagnoses):
        word_guess = _word_guess(col, codes)
        if word_guess is not None:
            diagnoses.insert(0, word_guess)
    elif diagnoses[0].role == "root-cause" and diagnoses[0].confidence >= SURE:
        _second_opinion(diagnoses, col, codes)
    elif root_diag is None and diagnoses[0].role == "hypothesis":
        diagnoses = _words_over_symptom(diagnoses, col, codes)

    failures = col.failures
    elastic_root = next((f for f in failures if f.root), None)
    if root_diag is not None and elastic_root is not None and elastic_root.rank == root_diag.rank:
        root_diag.confidence = _boost(root_diag.confidence, 0.3)
        root_diag.notes.append("torchrun's summary names the same rank as the first failure")
    for d in diagnoses:
        d.notes = [n for n in d.notes if n]

    unmatched = _unmatched(col, root_diag is not None)
    ranks = _ranks(col, failures)
    for d in diagnoses:
        if d.host is None and d.rank is not None and d.rank in ranks:
            d.host = ranks[d.rank]["host"]
    report = ExplainReport(
        diagnoses=diagnoses,
        first_failure=_first_failure(root_diag, elastic_root, unmatched, diagnoses),
        ranks=ranks,
        unmatched_errors=unmatched,
        sources=sources,
        lines=col.lines,
        bytes=col.bytes,
        notes=list(col.notes),
        scanner=col.scanner,
    )
    if len(col.ranks) > MAX_RANKS_REPORTED:
        report.notes.append(f"{len(col.ranks)} ranks had events; `ranks` lists the first {MAX_RANKS_REPORTED}")
    report.skipped_repeats = col.skipped_repeats
    for d in diagnoses:
        if len(d.ranks) >= MAX_GROUP_RANKS:
            d.notes.append(f"seen on more ranks than the {MAX_GROUP_RANKS:,} listed")
    if col.cut_lines:
        report.notes.append(
            f"{col.cut_lines} line(s) longer than 64 KiB were read as their first and last 32 KiB "
            "(a progress bar redrawn with \\r ends in what the terminal showed last)"
        )
    if col.ranks_dropped:
        report.notes.append(
            f"{col.ranks_dropped} events on ranks past the first {len(col.ranks)} are counted but not listed per rank"
        )
    return report


def _hypotheses(groups: list[Group], codes: dict[str, Code]) -> list[Diagnosis]:
    """Symptom groups as hypotheses, strongest first; a family's symptoms support its best one."""
    out: list[Diagnosis] = []
    for g in groups:
        d = _diagnosis(g, codes[g.code], g.first)
        d.role = "hypothesis"
        d.confirm = g.first.signature.confirm if g.first.signature is not None else ""
        out.append(d)
    by_family: dict[str, list[Diagnosis]] = {}
    for d in out:
        by_family.setdefault(d.family, []).append(d)
    # families tied at the cap are ordered by their single strongest symptom (the most telling sentence)
    own = {id(d): d.confidence for d in out}
    strongest = {family: max(d.confidence for d in ds) for family, ds in by_family.items()}
    for family, ds in by_family.items():
        if len(ds) < 2:
            continue
        best = max(ds, key=lambda d: d.confidence)
        # one sentence is one piece of evidence, however many of the family's signatures read it
        per_line: dict[tuple[str, int] | int, float] = {}
        for d in ds:
            key = (d.evidence[0].file, d.evidence[0].line) if d.evidence else id(d)
            per_line[key] = max(per_line.get(key, 0.0), d.confidence)
        doubt = 1.0
        for c in per_line.values():
            doubt *= 1 - c
        best.confidence = min(SYMPTOM_MAX, 1 - doubt)
        best.notes.append(f"{len(ds)} symptoms point at {family}: " + ", ".join(d.code for d in ds))
    for d in out:
        d.notes.append("a hypothesis from a symptom: the log does not prove it; check it before acting")
    return sorted(
        out, key=lambda d: (-d.confidence, -strongest[d.family], -own[id(d)], d.evidence[0].line if d.evidence else 0)
    )


def _confirmations_alone(diagnoses: list[Diagnosis], codes: dict[str, Code]) -> list[Diagnosis]:
    """Rule 7b: confirmations with nothing to confirm (torchrun's 'exitcode: -9' and no error of the worker) are the
    best lead there is: they become hypotheses, strongest first, instead of leaving the lead to the words."""
    out = [
        _as_hypothesis(d, codes)
        for d in sorted((d for d in diagnoses if d.role == "confirmation"), key=lambda d: -d.confidence)
    ]
    for d in out:
        diagnoses.remove(d)
    return out


def _as_hypothesis(d: Diagnosis, codes: dict[str, Code]) -> Diagnosis:
    """A confirmation with no failure line to confirm, read as the hypothesis it supports."""
    d.role = "hypothesis"
    d.notes.append("a confirmation with no failure line to confirm: the likeliest reading, not a proof")
    d.confirm = d.confirm or (
        f"Look for what this line usually follows ({codes[d.code].title}) where this log cannot show it: the "
        "host's kernel log (`dmesg -T`), the scheduler's accounting, the other ranks' logs."
    )
    return d


def _log_words(col: Collector) -> str:
    return "\n".join([t for _, _, t in col.head] + [u.ref.text for u in col.unmatched.items.values()])


def _word_guess(col: Collector, codes: dict[str, Code], family: str | None = None) -> Diagnosis | None:
    """Rule 8: nothing recognised; the words of the log (its first part, and the error lines kept)
    point at a family (:mod:`.cues`). A ``guess``: low confidence, its words as the reason. With
    ``family``, the guess for that family (rule 9's alternative)."""
    from . import cues

    kept = [(u.ref, u.ref.text) for u in col.unmatched.items.values()]
    g = cues.guess(_log_words(col), allowed_codes=codes.keys(), family=family)
    if g is None:
        return None
    code = codes[g.code]
    evidence: list[LineRef] = []
    for name, first, chunk in col.head:
        for i, line in enumerate(chunk.splitlines()):
            if len(evidence) < 3 and line.strip() and len(cues.tokens(line) & set(g.cues)) >= 2:
                evidence.append(LineRef(name, first + i, line.strip()[:500]))
    places = {(e.file, e.line) for e in evidence}
    evidence += [
        ref
        for ref, t in kept
        if len(evidence) < 3 and (ref.file, ref.line) not in places and cues.tokens(t) & set(g.cues)
    ]
    values = dict.fromkeys(code.placeholders(), "?")
    finding = code.finding(Hit(values))
    confirm = next((s.confirm for s in code.signatures if s.confirm), "")
    return Diagnosis(
        code=code.code,
        name=code.name,
        family=code.family,
        role="guess",
        confidence=g.confidence,
        rank=None,
        host=None,
        title=code.title,
        message=f"If it is {code.title}: {code.meaning}",
        fix=finding.fix,
        evidence=evidence,
        count=0,
        notes=[
            f"no line was recognised: a guess from the words of the log ({', '.join(g.cues)}); "
            "treat it as a lead, not a diagnosis"
        ],
        confirm=confirm
        or f"find the failing line in the full log and run `torchdoctor explain` on it; "
        f"`torchdoctor codes {code.code}` shows what that failure prints",
    )


def _second_opinion(diagnoses: list[Diagnosis], col: Collector, codes: dict[str, Code]) -> None:
    """Rule 9: a sure root cause (>= :data:`SURE`) whose family the words of the log all but rule out,
    while they point hard at another family, is no longer sure: its confidence drops below
    :data:`SURE` and the words' family follows as a ``guess`` (unless a symptom or confirmation already
    names it). A line the signature knows can be the last link of a chain the report's words
    describe: ``No space left on device`` from a full /dev/shm reads like a full disk."""
    top = diagnoses[0]
    opinion = _words_opinion(col)
    if opinion is None:
        return
    other, probs, words = opinion
    if other == top.family or probs.get(top.family, 0.0) >= DOUBT_BELOW or probs[other] < DOUBT_OTHER:
        return
    top.confidence = min(top.confidence, DOUBTED)
    top.notes.append(f"the words of the log point elsewhere ({other}: {words}); the matched line may be a consequence")
    if any(d.family == other for d in diagnoses):
        return  # already listed (a hypothesis from a symptom line, a confirmation)
    alt = _word_guess(col, codes, family=other)
    if alt is not None:
        alt.notes = [
            f"{top.code} was recognised, but the words of the log ({words}) point at this family: an alternative "
            "to rule out"
        ]
        diagnoses.append(alt)


def _words_opinion(col: Collector) -> tuple[str, dict[str, float], str] | None:
    """The family the word model ranks first for the log's words, every family's probability, and the words
    that back the first one (its six strongest); None without a model."""
    from . import cues

    m = cues.model()
    if not m.get("families"):
        return None
    probs, supports = cues.family_probabilities(_log_words(col), m)
    best = max(probs, key=lambda f: probs[f])
    return best, probs, ", ".join(t for _, t in supports[best][:6])


def _words_over_symptom(diagnoses: list[Diagnosis], col: Collector, codes: dict[str, Code]) -> list[Diagnosis]:
    """Rule 10: a hypothesis that leads (a symptom, no root cause) whose family the words of the log give at most
    :data:`SYMPTOM_AGAINST`, while they give another family at least
    :data:`WORDS_LEAD`, yields the lead to that family: its own hypothesis (or cascade, or a confirmation read as a
    hypothesis) when one is listed, else the words' guess. "Training hangs" is said of many causes; the rest of
    the report often names which one."""
    top = diagnoses[0]
    opinion = _words_opinion(col)
    if opinion is None:
        return diagnoses
    other, probs, words = opinion
    behind = top.family in SHOWS_AS.get(other, ())  # the words name a cause that shows as this very symptom
    if other == top.family or (
        not behind and (probs[other] < WORDS_LEAD or probs.get(top.family, 0.0) > SYMPTOM_AGAINST)
    ):
        return diagnoses
    roles = ("hypothesis", "cascade", "confirmation")
    lead = next((d for d in diagnoses if d.family == other and d.role in roles), None)
    if lead is not None and lead.role == "confirmation":  # torchrun's "exitcode: -9" where the words say host-oom
        _as_hypothesis(lead, codes)  # no root cause here, so it confirms nothing yet (explained_by is None)
    if lead is None:
        lead = _word_guess(col, codes, family=other)
        if lead is None:
            return diagnoses
        lead.notes = [f"the words of the log ({words}) point at this family more than at {top.code}'s: the lead"]
    else:
        lead.confidence = max(lead.confidence, min(WORDS_MAX, round(probs[other], 2)))
        lead.notes.append(f"the words of the log ({words}) point at this family: the lead")
    if behind:
        lead.notes.append(f"{other} usually shows as {top.family}: the cause behind the symptom {top.code} describes")
        top.notes.append(f"the symptom; the words of the log name the cause behind it ({other})")
    else:
        top.notes.append(f"the words of the log all but rule this family out and point at {other}")
    top.confidence = min(top.confidence, lead.confidence)
    return [lead] + [d for d in diagnoses if d is not lead]


def _several_nodes(col: Collector) -> str | None:
    """How the log shows a run over several machines: ranks on several hosts, or the words of one (``--nnodes 2``,
    "two machines", "multi-node"); None when it shows neither."""
    hosts = sorted({r.host for r in col.ranks.values() if r.host})
    if len(hosts) >= 2:
        return f"ranks on {len(hosts)} hosts ({', '.join(hosts[:3])}{', ...' if len(hosts) > 3 else ''})"
    m = _MULTI_NODE.search(_log_words(col))
    return f"the log says '{m.group(0)}'" if m else None


def _across_nodes(d: Diagnosis, g: Group, first: Event, col: Collector, codes: dict[str, Code]) -> Diagnosis | None:
    """Rule 11: an error whose usual cause is another one on a run over several machines (``Code.across_nodes``:
    NCCL's 'unhandled system error', 'internal error', 'remote process exited' -> the network between the nodes;
    'invalid device ordinal' -> the global rank used as the device index) on a log that shows several nodes is read
    as that code: the lead, never sure; the error as it was printed follows, explained by it."""
    target = codes.get(codes[d.code].across_nodes)
    if target is None:
        return None
    seen = _several_nodes(col)
    if seen is None:
        return None
    lead = _diagnosis(g, target, first, extra={"evidence": f"{d.code}'s line on a run over several nodes"})
    lead.confidence = min(d.confidence, ACROSS_NODES)
    lead.notes.append(f"{d.code} ({codes[d.code].title}) on a run over several nodes: {seen}")
    d.explained_by = target.code
    d.notes.append(f"the error as printed; on a run over several nodes read as {target.code}")
    return lead


def _rank_text(rank: int | None) -> str:
    return "?" if rank is None else str(rank)


def _unmatched(col: Collector, named_cause: bool) -> list[UnmatchedError]:
    """The most relevant error lines no signature matched; with a named root cause, only those it
    does not explain (not next to a matched line, not a launcher's "process died" wrapper)."""
    items = col.unmatched.ranked(named_cause)[:SHOW_UNMATCHED]
    return [
        UnmatchedError(ref=u.ref, score=u.score, count=u.count, ranks=sorted(u.ranks), traceback=list(u.traceback))
        for u in items
    ]


def _first_failure(
    root: Diagnosis | None,
    elastic: RankFailure | None,
    unmatched: list[UnmatchedError],
    diagnoses: list[Diagnosis],
) -> dict[str, Any] | None:
    if root is not None:
        ref: LineRef = root.evidence[0]
        return {
            "source": "diagnosis",
            "code": root.code,
            "rank": ref.rank,
            "host": ref.host or root.host,
            "file": ref.file,
            "line": ref.line,
            "time": root.time,
            "text": ref.text[:500],
        }
    if elastic is not None:
        out = {"source": "torchrun-summary", "code": None, **elastic.to_dict()}
        out["text"] = out.pop("message")
        out["time"] = elastic.time[1] if elastic.time else None
        return out
    top = next((u for u in unmatched if u.score >= 3), None)
    if top is not None:
        return {
            "source": "unmatched-error",
            "code": None,
            "rank": top.ref.rank,
            "host": top.ref.host,
            "file": top.ref.file,
            "line": top.ref.line,
            "time": None,
            "text": top.ref.text[:500],
        }
    return None


def _ranks(col: Collector, failures: list[RankFailure]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for rank, rec in sorted(col.ranks.items())[:MAX_RANKS_REPORTED]:
        out[rank] = {
            "host": rec.host,
            "codes": rec.codes,
            "first": _event_dict(rec.first) if rec.first else None,
            "timeline": [_event_dict(e) for e in sorted(rec.timeline, key=_timeline_key)],
            "exitcode": None,
            "signal": None,
        }
    for f in failures:
        if f.rank is None:
            continue
        entry = out.setdefault(
            f.rank, {"host": None, "codes": {}, "first": None, "timeline": [], "exitcode": None, "signal": None}
        )
        entry["host"] = entry["host"] or f.host
        entry["exitcode"] = f.exitcode
        entry["signal"] = signal_name(f.exitcode)
        if f.root:
            entry["torchrun_root_cause"] = True
    return out


def _event_dict(e: Event) -> dict[str, Any]:
    return {
        "code": e.code,
        "role": e.role,
        "file": e.ref.file,
        "line": e.ref.line,
        "time": e.time[1] if e.time else None,
        "text": e.ref.text[:300],
    }


def _timeline_key(e: Event) -> Any:
    return (e.time[0], e.time[1], e.seq) if e.time else ("", 0.0, e.seq)
