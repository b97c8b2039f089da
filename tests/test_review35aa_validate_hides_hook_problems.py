"""low: `jobd validate` says nothing of a queue's `on_dead_letter` (a queue not in the config, or
one whose max_payload is under 1 KiB, or a hook cycle) while the same queue's `then:` has a
problem of its own: one typo in a step hides every problem of the hook beside it.

What is wrong: docs/reference/cli.md (and the contract): `jobd validate` prints "one line per
problem, all of them, in file order"; jobd/config/validation.py: "A check that needs a value
the schema refused is skipped; all others run". config/chains.py ``chain_problems`` reads a
queue's steps with ``steps_of``, which reads `then:` and `on_dead_letter` together; when the
schema refused `then:` (``Unchecked``), the whole queue is skipped (``continue``), its
`on_dead_letter` too, though no check of the hook needs `then:`.

Reproduce: the config below (a `then:` step with `dealy:` for `delay:`, and an
`on_dead_letter` naming queue 'alrets'): `jobd validate` prints only the `dealy` line. Fix it,
run again, and only then the hook's unknown queue appears; `jobd run` would have refused both.

What should happen: both lines in one run (`queues.a.then.0.dealy: unknown key …` and
`queues.a.on_dead_letter.queue: queue 'alrets' is not in the config: did you mean
'alerts'?`). Why it matters: the promise "all of them" is what lets an operator fix a config
in one pass, before a reload (a refused reload keeps the old config running).

Suggested fix: read `then:` and `on_dead_letter` each under its own ``Unchecked`` in
``steps_of`` (a refused `then:` leaves its steps out, not the hook).

Fixed (review 35aa): config/chains.py ``chain_problems`` reads a queue's `then:` steps and its
`on_dead_letter` each on its own (``_then_steps``, ``_hook_steps``), each under its own
``Unchecked``: a refused `then:` leaves out its own steps only, and the hook's unknown queue,
too small queue and cycle are told in the same run (the second test).
"""

from __future__ import annotations

from pathlib import Path

from support import jobd_cli

CONFIG = """\
redis: {url: redis://127.0.0.1:1/0}
queues:
  a:
    command: [/bin/true]
    then: [{queue: alerts, dealy: 1s}]
    on_dead_letter: {queue: alrets}
  alerts:
    command: [/bin/true]
"""


def test_a_typo_in_then_hides_no_hook_problem(tmp_path: Path) -> None:
    cfg = tmp_path / "jobd.yaml"
    cfg.write_text(CONFIG)
    out = jobd_cli("validate", str(cfg))
    assert out.returncode == 78, out.stdout + out.stderr
    said = (out.stdout + out.stderr).decode()
    assert "queues.a.then.0.dealy: unknown key 'dealy'" in said, said
    assert "queues.a.on_dead_letter.queue: queue 'alrets' is not in the config" in said, said


HOOKS = """\
redis: {url: redis://127.0.0.1:1/0}
queues:
  a:
    command: [/bin/true]
    then: [{queue: small, dealy: 1s}]
    on_dead_letter: {queue: small}
  c:
    command: [/bin/true]
    then: [{queue: small, payload: nothing}]
    on_dead_letter: {queue: c}
  small:
    command: [/bin/true]
    max_payload: 100
"""


def test_a_refused_then_hides_no_small_hook_queue_nor_hook_cycle(tmp_path: Path) -> None:
    cfg = tmp_path / "jobd.yaml"
    cfg.write_text(HOOKS)
    out = jobd_cli("validate", str(cfg))
    assert out.returncode == 78, out.stdout + out.stderr
    said = (out.stdout + out.stderr).decode()
    assert "queues.a.then.0.dealy: unknown key 'dealy'" in said, said
    assert "queues.a.on_dead_letter.queue: queue 'small' takes payloads of 100 bytes" in said, said
    assert "queues.c.then.0.payload:" in said, said
    assert "queues.c.on_dead_letter.queue: the chain c → c leads back to queue 'c'" in said, said
