"""The word guess: what explain says when no line is recognised (prose, a paste without its error)."""

from __future__ import annotations

import json
import subprocess
import sys

from torchdoctor.explain import cues, explain

from .conftest import REPO

PROSE_SHM = (
    "Training inside docker with num_workers=8 dies after a few batches. The dataloader worker "
    "gets killed, shared memory looks tiny, the container was started without --ipc=host or --shm-size."
)


def test_the_committed_model_is_what_the_labelled_texts_give() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train_cues.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_the_model_is_never_trained_on_the_frozen_half() -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    import train_cues

    assert all("frozen" not in root.parts for root in train_cues.LABELLED)
    frozen = {p.read_bytes() for p in (REPO / "tests" / "eval" / "world" / "frozen").glob("*/*.log")}
    assert frozen
    used = {(t, f) for t, f, _ in train_cues.documents()}
    bodies = {train_cues.body(p) for p in (REPO / "tests" / "eval" / "world" / "frozen").glob("*/*.log")}
    assert not {t for t, _ in used} & bodies


def test_prose_gets_a_low_confidence_guess_with_its_words() -> None:
    g = cues.guess(PROSE_SHM)
    assert g is not None
    # "the dataloader worker gets killed" is host-oom's commonest phrase in real reports, "shared memory",
    # "--shm-size" shm-exhausted's: the model weighs both (measured on real texts, not on this one)
    assert g.family in ("shm-exhausted", "host-oom")
    m = cues.model()
    probs = cues.probabilities({f: s for f, (s, _) in cues.family_scores(cues.tokens(PROSE_SHM), m).items()})
    assert "shm-exhausted" in sorted(probs, key=lambda f: -probs[f])[:2]
    assert cues.MIN_CONFIDENCE <= g.confidence <= cues.MAX_CONFIDENCE
    assert g.cues
    assert all(c in cues.tokens(PROSE_SHM) for c in g.cues)


def test_words_of_no_family_give_no_guess() -> None:
    assert cues.guess("The weather was lovely and we walked along the river until dinner.") is None
    assert cues.guess("") is None


PROSE_CKPT = (
    "When I save the checkpoint with torch.save to the shared directory the file is sometimes corrupted "
    "and torch.load fails with a zip archive error at the end of each epoch on the cluster"
)
"""No signature recognises this (no error line, no symptom phrase): only its words speak."""


def test_a_guess_leads_only_when_nothing_was_recognised_and_does_not_count_as_explained() -> None:
    report = explain(PROSE_CKPT)
    top = report.diagnoses[0]
    assert top.role == "guess"
    g = cues.guess(PROSE_CKPT)
    assert g is not None and (top.code, top.family) == (g.code, g.family)
    assert top.confidence <= cues.MAX_CONFIDENCE
    assert int(report.exit_code) == 1
    assert top.confirm
    assert any("guess from the words" in n for n in top.notes)
    recognised = explain("RuntimeError: received 0 items of ancdata\n" + PROSE_CKPT)
    assert recognised.diagnoses[0].role == "root-cause"
    assert all(d.role != "guess" for d in recognised.diagnoses)


def test_the_cli_prints_a_guess_in_every_format_with_exit_code_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "report.txt"
    log.write_text(PROSE_CKPT, encoding="utf-8")
    outs = {}
    for fmt in ("json", "text", "markdown"):
        proc = subprocess.run(
            [sys.executable, "-m", "torchdoctor", "explain", str(log), "--format", fmt],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 1, proc.stderr
        outs[fmt] = proc.stdout
    doc = json.loads(outs["json"])
    assert doc["diagnoses"][0]["role"] == "guess"
    assert doc["diagnoses"][0]["confidence"] <= cues.MAX_CONFIDENCE
    code = doc["diagnoses"][0]["code"]
    assert code in outs["text"] and "guess" in outs["text"].lower()
    assert code in outs["markdown"] and "guess" in outs["markdown"].lower()


DISK_FULL = "OSError: [Errno 28] No space left on device"
SHM_WORDS = (
    "Training in a docker container with 8 dataloader workers, shared memory /dev/shm is only 64M "
    "(docker default shm-size)\n"
)


def test_a_sure_answer_the_words_rule_out_is_no_longer_sure() -> None:
    alone = explain(DISK_FULL).diagnoses[0]
    assert alone.code == "TD654" and alone.confidence >= 0.8
    assert not any("point elsewhere" in n for n in alone.notes)
    report = explain(SHM_WORDS + DISK_FULL)
    top = report.diagnoses[0]
    assert top.code == "TD654" and top.confidence < 0.8
    assert any("point elsewhere (shm-exhausted" in n for n in top.notes)
    # the words' family is listed after it: here a symptom line already names it, so no guess is added
    assert [d.family for d in report.diagnoses[1:]] == ["shm-exhausted"]
    assert report.diagnoses[1].role == "hypothesis"
    from torchdoctor.registry import log_codes

    without_symptom = [c for c in log_codes() if c.code != "TD158"]  # nothing recognised names shm-exhausted
    report = explain(SHM_WORDS + DISK_FULL, codes=without_symptom)
    assert report.diagnoses[0].code == "TD654" and report.diagnoses[0].confidence < 0.8
    alternatives = [d for d in report.diagnoses if d.role == "guess"]
    assert [d.family for d in alternatives] == ["shm-exhausted"]
    assert "TD654 was recognised" in alternatives[0].notes[0]


HANG_PROSE = "Multi-GPU training hangs forever at the end of the first epoch, no error.\n"
WRITE_WORDS = (
    "Every rank appends to the same metrics.jsonl from a callback; the jsonl ends up with interleaved lines.\n"
)


def _words_model(weights: dict[str, float]) -> dict[str, object]:
    """A word model of three families where only ``weights`` speak (for concurrent-write)."""
    return {
        "families": {
            "dist-hang": {"bias": 0.0, "weights": {}},
            "nccl": {"bias": 0.0, "weights": {}},
            "concurrent-write": {"bias": 0.0, "weights": weights},
        },
        "codes": {"concurrent-write": {"TD659": {"docs": 1, "cues": {}}}},
    }


def test_words_that_rule_out_a_symptoms_family_take_the_lead(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Rule 10: a hang said in prose is a symptom of many causes; when the rest of the report points hard at one
    family and all but rules out the hang's, that family leads (as a guess when no line named it) and the hang
    follows, no surer than the new lead. Words that do not rule the symptom out change nothing."""
    from torchdoctor.explain.triage import SYMPTOM_AGAINST, WORDS_LEAD

    as_is = explain(HANG_PROSE + WRITE_WORDS).diagnoses
    assert as_is[0].code == "TD455" and as_is[0].role == "hypothesis"

    listed = next(d for d in as_is if d.family == "concurrent-write")  # a line of the report named it too
    monkeypatch.setattr(cues, "model", lambda: _words_model({"jsonl": 4.0, "interleaved": 4.0, "appends": 1.0}))
    report = explain(HANG_PROSE + WRITE_WORDS)
    lead, rest = report.diagnoses[0], report.diagnoses[1:]
    assert (lead.code, lead.role) == (listed.code, "hypothesis")  # its own hypothesis, moved up
    assert lead.confidence == max(listed.confidence, cues.MAX_CONFIDENCE) and WORDS_LEAD <= cues.MAX_CONFIDENCE
    assert "point at this family: the lead" in lead.notes[-1]
    hang = next(d for d in rest if d.code == "TD455")
    assert hang.confidence <= lead.confidence and "rule this family out" in hang.notes[-1]

    # no line names the words' family: their guess leads
    bar = "The progress bar stops moving.\n"
    monkeypatch.setattr(cues, "model", lambda: _words_model({}))
    before = [d.code for d in explain(HANG_PROSE + bar).diagnoses]
    assert before[0] == "TD455" and "TD659" not in before
    monkeypatch.setattr(cues, "model", lambda: _words_model({"progress": 4.0, "moving": 4.0}))
    report = explain(HANG_PROSE + bar)
    assert [(d.code, d.role) for d in report.diagnoses] == [("TD659", "guess")] + [
        (code, "hypothesis") for code in before
    ]
    assert "point at this family more than at TD455" in report.diagnoses[0].notes[0]

    # weak words: the other family's probability stays under WORDS_LEAD (or the hang's over SYMPTOM_AGAINST)
    monkeypatch.setattr(cues, "model", lambda: _words_model({"jsonl": 0.5, "interleaved": 0.6}))
    probs = cues.probabilities({"dist-hang": 0.0, "nccl": 0.0, "concurrent-write": 1.1})
    assert probs["concurrent-write"] < WORDS_LEAD or probs["dist-hang"] > SYMPTOM_AGAINST
    assert explain(HANG_PROSE + WRITE_WORDS).diagnoses[0].code == "TD455"


def test_rule_10_reads_a_confirmation_of_the_words_family_as_the_lead(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A prose hang plus torchrun's '-9' line (recorded by the lab): the hang leads; when the words point hard at
    host-oom, the '-9' confirmation is read as the host-oom hypothesis and leads, the hang after it. A cascade that
    leads (the survivor's 'connection closed' of a killed peer) is a line the failure printed: never overruled."""
    from pathlib import Path

    fixture = Path(__file__).parent / "fixtures" / "logs" / "TD459" / "lab-torchrun-peer-killed.log"
    minus9 = next(line for line in fixture.read_text(encoding="utf-8").splitlines() if "(exitcode: -9)" in line)
    text = HANG_PROSE + minus9 + "\n"
    as_is = explain(text).diagnoses
    assert (as_is[0].code, as_is[0].role) == ("TD455", "hypothesis")
    assert any(d.code == "TD459" and d.role == "confirmation" for d in as_is)

    model = _words_model({})
    model["families"]["host-oom"] = {"bias": 0.0, "weights": {"exitcode": 6.0}}  # type: ignore[index]
    monkeypatch.setattr(cues, "model", lambda: model)
    report = explain(text)
    lead = report.diagnoses[0]
    assert (lead.code, lead.role, lead.family) == ("TD459", "hypothesis", "host-oom")
    assert lead.confirm and "dmesg" in lead.confirm
    assert [d.code for d in report.diagnoses[1:]][:1] == ["TD455"]

    recorded = fixture.read_text(encoding="utf-8").split("# ---\n", 1)[1]
    killed = explain(recorded)
    assert killed.diagnoses[0].code == "TD454" and killed.diagnoses[0].role == "cascade"


def test_words_that_name_the_cause_behind_a_hang_lead_even_when_weak(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Rule 10, second road: ranks that took different paths show as a hang (``families.SHOWS_AS``). When the
    words rank rank-divergence first, it leads over the hang hypothesis even below WORDS_LEAD and with the hang's
    family not ruled out; words that rank a family which does not show as a hang (concurrent-write) just as
    weakly change nothing. 10-fold CV on the tuning half (765 reports): six answers went from wrong to right,
    none the other way."""
    from torchdoctor.explain.triage import WORDS_LEAD
    from torchdoctor.families import SHOWS_AS

    assert "dist-hang" in SHOWS_AS["rank-divergence"]
    bar = "The progress bar stops moving.\n"

    def model(family: str) -> dict[str, object]:
        m = _words_model({})
        m["families"][family] = {"bias": 0.0, "weights": {"progress": 0.9, "moving": 0.9}}  # type: ignore[index]
        m["codes"][family] = {"TD499" if family == "rank-divergence" else "TD659": {"docs": 1, "cues": {}}}  # type: ignore[index]
        return m

    monkeypatch.setattr(cues, "model", lambda: model("rank-divergence"))
    probs = cues.probabilities({"dist-hang": 0.0, "nccl": 0.0, "concurrent-write": 0.0, "rank-divergence": 1.8})
    assert max(probs, key=lambda f: probs[f]) == "rank-divergence" and probs["rank-divergence"] < WORDS_LEAD
    report = explain(HANG_PROSE + bar)
    lead = report.diagnoses[0]
    assert (lead.family, lead.role) == ("rank-divergence", "guess")
    assert any("usually shows as dist-hang" in n for n in lead.notes)
    hang = next(d for d in report.diagnoses if d.code == "TD455")
    assert hang.confidence <= lead.confidence and "the cause behind it" in hang.notes[-1]

    monkeypatch.setattr(cues, "model", lambda: model("concurrent-write"))
    assert explain(HANG_PROSE + bar).diagnoses[0].code == "TD455"


def test_character_grams_read_words_the_word_model_cannot() -> None:
    """The character model reads the 3- to 5-grams of each distinct word, padded with a space: identifiers glued to
    values and other languages give grams where the word model's tokens (ASCII letters only) give nothing."""
    grams = cues.char_grams("export NCCL_SOCKET_IFNAME=eth0; 多机多卡训练卡住")
    assert {" ncc", "ifnam", "eth0;", " 多机多", "训练卡住 "} <= grams
    assert not cues.tokens("多机多卡训练卡住")  # the word model sees nothing here
    assert all(3 <= len(g) <= 5 for g in grams)
    long_word = "x" * 100
    assert max(len(g.strip()) for g in cues.char_grams(long_word)) <= 5
    assert cues.char_grams(long_word) == cues.char_grams("x" * cues.CHAR_WORD)  # long words are cut
    assert cues.char_grams("see https://github.com/pytorch/pytorch/issues/1 ![img](x.png)") == cues.char_grams("see")


def test_a_long_text_is_read_at_its_start_and_its_end() -> None:
    """explain appends the error lines it kept after the log's head: the character model reads the start and the
    end of a long text, not only its first bytes."""
    filler = "epoch step loss\n" * (cues.CHAR_BYTES // 8)
    text = "alpha_first\n" + filler + "middle_word\n" + filler + "omega_last\n"
    grams = cues.char_grams(text)
    assert "alpha" in grams and "omega" in grams and "middl" not in grams


def test_the_committed_model_mixes_a_word_and_a_character_model() -> None:
    m = cues.model()
    chars = m["chars"]
    assert sorted(chars["families"]) == sorted(m["families"]) and len(chars["bias"]) == len(chars["families"])
    assert chars["weights"] and all(len(row.split()) == len(chars["families"]) for row in chars["weights"].values())
    probs, supports = cues.family_probabilities(PROSE_SHM, m)
    assert abs(sum(probs.values()) - 1) < 1e-9 and set(supports) == set(m["families"])
    words_only = {**m, "chars": None}
    by_words, _ = cues.family_probabilities(PROSE_SHM, words_only)
    by_chars = cues.char_probabilities(PROSE_SHM, m)
    assert abs(sum(by_chars.values()) - 1) < 1e-9
    for family, p in probs.items():
        assert abs(p - (cues.WORDS_SHARE * by_words[family] + (1 - cues.WORDS_SHARE) * by_chars[family])) < 1e-9


def test_the_guess_is_the_likeliest_family_that_the_words_back() -> None:
    """A family can lead on its prior alone (a large bias, no word of the text for it): the guess skips it for the
    likeliest family the words back; with no family backed, there is no guess."""
    m = {
        "families": {
            "host-oom": {"bias": 3.0, "weights": {}},
            "concurrent-write": {"bias": 0.0, "weights": {"jsonl": 0.8, "interleaved": 0.7}},
        },
        "codes": {
            "host-oom": {"TD270": {"docs": 1, "cues": {}}},
            "concurrent-write": {"TD659": {"docs": 1, "cues": {}}},
        },
    }
    probs, _ = cues.family_probabilities(WRITE_WORDS, m)
    assert max(probs, key=lambda f: probs[f]) == "host-oom"
    g = cues.guess(WRITE_WORDS, m=m)
    assert g is not None and (g.family, g.code) == ("concurrent-write", "TD659")
    assert g.confidence == round(max(cues.MIN_CONFIDENCE, probs["concurrent-write"]), 2)
    assert set(g.cues) == {"jsonl", "interleaved"}
    assert cues.guess("The progress bar stops moving.", m=m) is None
