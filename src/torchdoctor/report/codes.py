"""Docs generated from the catalogue: ``torchdoctor codes`` and ``docs/codes.md``."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from typing import IO, Any

from rich.table import Table
from rich.text import Text

from ..families import FAMILIES
from ..registry import AREAS, Code
from .text import stripped


def _placeholders_to_words(template: str) -> str:
    return template.replace("{", "‹").replace("}", "›")


#: How far apart two numbers of the same hundred may be and still be suggested for each other.
NEAR = 10


def _preflight_variant(c: Code) -> Code | None:
    """The preflight variant of a code declared in a log module (see ``catalogue.PREFLIGHT_VARIANTS``)."""
    from ..catalogue import PREFLIGHT_VARIANTS, load

    load()
    return PREFLIGHT_VARIANTS.get(c.code)


def is_preflight(c: Code) -> bool:
    return c.check is not None or _preflight_variant(c) is not None


def _one_edit(a: str, b: str) -> bool:
    """Same length, and one digit changed or two neighbouring digits swapped."""
    if len(a) != len(b) or a == b:
        return False
    diff = [i for i in range(len(a)) if a[i] != b[i]]
    if len(diff) == 1:
        return True
    return len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]


def near_codes(number: int, known: Sequence[str], limit: int = 3) -> list[str]:
    """Codes close to ``TD<number>``, likeliest first: the last two digits swapped, then codes of the same
    hundred within :data:`NEAR` or one digit away (nearer numbers first), then the first two digits
    swapped. Another hundred is another domain: never suggested but for such a swap."""
    want = f"{number:03d}"
    scored: list[tuple[int, int, str]] = []
    for code in known:
        digits = code[2:]
        if not digits.isdigit():
            continue
        distance = abs(int(digits) - number)
        swapped = digits == want or (_one_edit(want, digits) and sorted(want) == sorted(digits))
        if swapped and digits[0] == want[0]:
            scored.append((0, distance, code))
        elif digits[0] == want[0] and (distance <= NEAR or _one_edit(want, digits)):
            scored.append((1, distance, code))
        elif swapped:
            scored.append((2, distance, code))
    return [code for _, _, code in sorted(scored)[:limit]]


def suggest(key: str, codes: Sequence[Code]) -> tuple[list[str], str]:
    """Suggestions for an unknown code or name, and the hint that ends the one-line error."""
    k = key.strip()
    known = sorted(c.code for c in codes)
    listing = "`torchdoctor codes` lists them all"
    m = re.fullmatch(r"(?i)(?:td)?\s*-?\s*(\d*)", k)
    if m and (m.group(1) or k.lower().startswith("td")):
        digits = m.group(1)
        if len(digits) > 3:
            return [], f"; codes have three digits (TD101 to {known[-1]}): {listing}"
        if not digits:
            return [], f"; codes are TD followed by three digits (TD101 to {known[-1]}): {listing}"
        if len(digits) < 3:
            prefix = "TD" + digits
            starting = [c for c in known if c.startswith(prefix)]
            if not starting:
                return [], f"; no code starts with {prefix}: {listing}"
            more = (
                f" ({len(starting)} codes start with {prefix}: `torchdoctor codes --prefix {prefix}`)"
                if len(starting) > 3
                else ""
            )
            return starting[:3], f"; did you mean {', '.join(starting[:3])}?{more}"
        close = near_codes(int(digits), known)
        if close:
            return close, f"; did you mean {', '.join(close)}?"
        hundred = [c for c in known if c[2] == digits[0]]
        where = (
            f"the TD{digits[0]}xx codes are {hundred[0]} to {hundred[-1]}: `torchdoctor codes --prefix TD{digits[0]}`"
            if hundred
            else f"there are no TD{digits[0]}xx codes"
        )
        return [], f"; no code is close to it ({where}); {listing}"
    names = {c.name: c.code for c in codes}
    close = difflib.get_close_matches(k.lower(), list(names), n=3, cutoff=0.6)
    if close:
        return close, f"; did you mean {', '.join(close)}?"
    return [], f"; no code or name is close to it: {listing}"


def code_dict(c: Code) -> dict[str, Any]:
    return {
        "code": c.code,
        "name": c.name,
        "family": c.family,
        "severity": c.severity.label,
        "area": c.area,
        "status": c.status,
        "title": c.title,
        "preflight": is_preflight(c),
        "message": c.message,
        "fix": c.fix,
        "meaning": c.meaning,
        "why": c.why,
        "false_positives": c.false_positives,
        "related": list(c.related),
    }


def write_list(codes: Sequence[Code], out: IO[str]) -> None:
    table = Table(title=f"{len(codes)} codes", title_justify="left", header_style="bold")
    for col in ("code", "name", "family", "severity", "title"):
        table.add_column(col, no_wrap=col != "title")
    for c in codes:
        table.add_row(c.code, c.name, c.family, c.severity.label, c.title)
    with stripped(out) as console:
        console.print(table)
        console.print(Text("one code in full: torchdoctor codes TDnnn (or its name)", style="dim"))


def write_one(c: Code, out: IO[str]) -> None:
    with stripped(out) as console:
        console.print(Text(f"{c.code} {c.name}", style="bold"))
        console.print(Text(f"{c.title}", style="italic"))
        meta = f"family: {c.family} · severity: {c.severity.label} · area: {AREAS[c.area]} · status: {c.status}"
        console.print(Text(meta, style="dim"))
        sections = [
            ("What it means", c.meaning),
            ("Why it happens", c.why),
            ("What you will see", _placeholders_to_words(c.message)),
            ("How to fix", _placeholders_to_words(c.fix)),
        ]
        variant = _preflight_variant(c)
        if variant is not None and c.check is None:
            sections += [
                ("What `torchdoctor check` says before the run", _placeholders_to_words(variant.message)),
                ("How to fix it before the run", _placeholders_to_words(variant.fix)),
            ]
        sections.append(("Known false positives", c.false_positives))
        for heading, body in sections:
            console.print()
            console.print(Text(heading, style="bold underline"))
            console.print(Text(body.strip()))
        if c.related:
            console.print()
            console.print(Text("Related: " + ", ".join(c.related), style="dim"))


def markdown(codes: Sequence[Code]) -> str:
    lines = [
        "# torchdoctor codes",
        "",
        "<!-- Generated by `torchdoctor codes --format markdown` from src/torchdoctor/catalogue/. Do not edit by hand: CI checks it is current. -->",
        "",
        "Every finding torchdoctor reports carries one of these codes and one family from the failure-families table.",
        "",
        "| code | name | family | severity | title |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| [{c.code}](#{c.code.lower()}-{c.name}) | `{c.name}` | `{c.family}` | {c.severity.label} | {c.title} |"
        for c in codes
    ]
    lines += ["", "## Families", "", "| family | what went wrong |", "|---|---|"]
    lines += [f"| `{slug}` | {desc} |" for slug, desc in FAMILIES.items()]
    anchors = {c.code: f"{c.code.lower()}-{c.name}" for c in codes}
    for c in codes:
        lines += [
            "",
            f"## {c.code} {c.name}",
            "",
            f"**{c.title}**. Family `{c.family}`, severity {c.severity.label}, area {AREAS[c.area].lower()}"
            + (", preflight check" if is_preflight(c) else "")
            + (f", status {c.status}" if c.status != "stable" else "")
            + ".",
            "",
            "### What it means",
            "",
            c.meaning.strip(),
            "",
            "### Why it happens",
            "",
            c.why.strip(),
            "",
            "### What you will see",
            "",
            "> " + c.message.strip().replace("\n", "\n> "),
            "",
            "### How to fix",
            "",
            "```",
            c.fix.strip(),
            "```",
        ]
        variant = _preflight_variant(c)
        if variant is not None and c.check is None:
            lines += [
                "",
                "### What `torchdoctor check` says before the run",
                "",
                "> " + variant.message.strip().replace("\n", "\n> "),
                "",
                "```",
                variant.fix.strip(),
                "```",
            ]
        lines += [
            "",
            "### Known false positives",
            "",
            c.false_positives.strip(),
        ]
        if c.related:
            lines += ["", "Related: " + ", ".join(f"[{r}](#{anchors.get(r, r.lower())})" for r in c.related)]
    return "\n".join(lines) + "\n"


def write_json(codes: Sequence[Code], out: IO[str]) -> None:
    json.dump({"schema_version": 1, "codes": [code_dict(c) for c in codes]}, out, indent=2)
    out.write("\n")
