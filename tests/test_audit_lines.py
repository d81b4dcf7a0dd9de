"""The audit's last lines: the one that says everything matched (and what it adds for a study that
is incomplete, stopped by a rule or redrawn), and its exit status, as the reader sees them."""

from __future__ import annotations

import itertools

import pytest

import audit.cli as cli

ROWS = [("record hashes", "records/x", "ok: 4 records")]
#: Each note's marker, and the sentence the matched line adds for it, in the order the line says them.
ADDS = [
    ("x: INCOMPLETE: 2 of 6 planned runs have no ok record", " The study is INCOMPLETE (see above)."),
    ("x: STOPPED BY THE BUDGET RULE: ...", " The study was STOPPED BY THE BUDGET RULE (see above)."),
    ("x: STOPPED BY THE FAILURE RULE: ...", " The study was STOPPED BY THE FAILURE RULE (see above)."),
    (
        "x: REDRAWN: 1 run(s) analysed from a later attempt",
        " Some runs were REDRAWN (see above): the records are intact, but an earlier attempt "
        "of each could have been seen before it was run again (exit status 4).",
    ),
]


@pytest.mark.parametrize("chosen", [c for n in range(len(ADDS) + 1) for c in itertools.combinations(ADDS, n)])
def test_the_matched_line_adds_each_note_once_in_its_order(chosen, capsys):
    """Every subset of the notes, given in reverse order: the line names each once, in the fixed order."""
    notes = [note for note, _ in reversed(chosen)]
    cli._print_findings(ROWS, notes, [])
    last = capsys.readouterr().out.rstrip("\n").splitlines()[-1]
    assert last == "Integrity: everything matched." + "".join(add for _, add in chosen)


def test_problems_replace_the_matched_line(capsys):
    cli._print_findings(ROWS, [ADDS[0][0]], ["records/x: field spec is missing"])
    out = capsys.readouterr().out
    assert "Integrity:" not in out and out.rstrip().endswith("- records/x: field spec is missing")


@pytest.mark.parametrize(
    ("problems", "notes", "reasons", "status"),
    [
        ([], [], [], 0),
        ([], [], ["no signed head"], cli.NOT_VERIFIED),
        ([], [ADDS[3][0]], ["no signed head"], 4),
        (["a problem"], [ADDS[3][0]], ["no signed head"], 1),
        ([], [ADDS[0][0]], [], 0),  # an incomplete study that matched exits 0 (its line says so)
    ],
)
def test_the_exit_status_puts_a_problem_before_a_redraw_before_trust(problems, notes, reasons, status):
    assert cli._status(problems, notes, reasons) == status
