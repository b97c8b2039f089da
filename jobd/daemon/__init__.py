"""The daemon: the loop (``loop``), the threads that feed it (``reader``) and record what it
decided (``recorder``), and the periodic duties (``duties`` and the modules that own one).

Redis stays off the loop: reader threads fetch jobs (``reader``), a recorder thread writes
outcomes (``recorder``), a ticker thread renews leases and runs the other periodic duties
(``duties``); a handler's follow-up file is parsed on a thread of its own (``endings``). Each
thread owns its state; work crosses threads through queues only: readers put
jobs in the loop's inbox (``inbox``), the lease renewal puts lost entries there too (both wake
the loop), the loop puts outcomes in the recorder's inbox and freed slots in each queue's
``Slots``. The one structure several threads touch is the lease ledger (``lease.Holdings``):
an entry must be renewed from the instant a reader gets it until its outcome is written,
whichever thread has it then, so it is one lock-guarded set, not a message. Signals only leave
a byte in a pipe; the loop acts on them (``poller``).

With ``processes`` over 1, `jobd run` is a ``supervisor`` of that many daemons, each a whole
daemon as above, less what the supervisor does once for the host (``child``).

Starting handlers. The loop starts handlers itself, and does not wait for them to reach exec:
``spawn`` clones each one and returns its pid at once (a vfork-based spawn waited for the exec,
a few hundred microseconds a start on a busy machine, most of the loop's time a job; it is still
the way where the C extension is not built, see ``spawn``). A handler that could not reach exec
tells so when it is reaped (``Handler.start_error``), and its job ends as one that could not
start. Handing the spawn to threads was measured slower (bench/spawn.py, bench/compare.py):
every hand-over is a GIL round trip between threads, and those cost more than the wait they
hide. For the same reason the loop hands work to the other threads once per pass, never once per
job.
"""
