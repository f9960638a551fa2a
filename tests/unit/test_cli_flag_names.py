"""A refusal names the flag the user typed, and no flag for a value chosen by default
(``preemptible`` from ``-p``), and ``--add-member`` where that was typed."""

from __future__ import annotations

from fgpu.cli.flags import QUEUE_FLAGS, SUBMIT_FLAGS, flag_message, was_typed

REASON = "non-preemptible work (priority high (100) is non-preemptible by default) needs..."


def test_a_default_that_no_flag_set_is_refused_without_naming_a_flag() -> None:
    argv = ["submit", "-p", "high", "-g", "0.5", "--", "python", "--non-preemptible"]
    message = flag_message("preemptible", REASON, {"preemptible": None}, SUBMIT_FLAGS, argv)
    assert message == REASON  # not "--non-preemptible: ...": the user typed neither
    assert not was_typed(SUBMIT_FLAGS["preemptible"], argv)  # after -- is the command's


def test_the_flag_typed_is_named_when_one_was() -> None:
    argv = ["submit", "--non-preemptible", "-g", "1", "--", "true"]
    message = flag_message("preemptible", "refused", {"preemptible": False}, SUBMIT_FLAGS, argv)
    assert message.startswith("--non-preemptible"), message
    argv = ["queue", "set", "team", "--add-member", "nosuchuser"]
    message = flag_message(
        "members", "unknown user nosuchuser", {"members": ["nosuchuser"]}, QUEUE_FLAGS, argv
    )
    assert message.startswith("--add-member"), message
