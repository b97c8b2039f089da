"""Review 34k (issue 34): the channel's rest under a flood (447ddc8) is in the code and not in the
docs, which still say the opposite.

447ddc8 made the channel's thread rest REST_MS (2 ms) after each wake that read messages,
where net.unix.max_dgram_qlen + 1 >= REST_BACKLOG (systemd's 512; not at the kernel's 10) and
none of them brought descriptors, and measured it at qlen 512 ("the flood costs the loop
0.035 of a core (was 0.085-0.118)"); ed0b188 gave bench/notify_flood.py ``--qlen``. Neither
commit touched docs/ or CHANGELOG.md. docs/handlers-talking-back.md still says "the socket's
queue holds 10 datagrams by the kernel's default, so a wake reads few … a rest after a flood's
wake, to read more a wake, made no measurable difference", names no rest, no 2 ms, no 512, and
its throughput figures are the qlen-10 ones. An operator tuning net.unix.max_dgram_qlen (or
running under systemd) is told nothing of what changes: the rest itself, a message sent during
one read up to 2 ms later (``jobd notify`` waits for it), and the larger ``sync`` target
(``test_review34k_rest_last_message.py``). The rules ask for a line in CHANGELOG.md too."""

from __future__ import annotations

from pathlib import Path

from jobd.daemon import channel

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_say_what_the_channels_rest_does() -> None:
    page = " ".join((ROOT / "docs" / "handlers-talking-back.md").read_text().split())
    assert channel.REST_MS > 0  # the rest is in the code
    assert "made no measurable difference" not in page, "the page says a rest was not worth it"
    assert f"{channel.REST_MS} ms" in page and "512" in page, (
        "the page names neither the rest's length nor the queue length it applies at"
    )


def test_the_changelog_says_it() -> None:
    sections = (ROOT / "CHANGELOG.md").read_text().split("\n## ")[1:]
    unreleased = " ".join(" ".join(x.split()) for x in sections if x.startswith("Unreleased"))
    assert "max_dgram_qlen" in unreleased and f"{channel.REST_MS} ms" in unreleased, (
        "no line in CHANGELOG.md (Unreleased) for the rest under a flood"
    )
