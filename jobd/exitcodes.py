"""Exit statuses of the jobd command line (sysexits.h where one fits)."""

OK = 0
FAILURE = 1  # a command ran and failed (e.g. Redis answered with an error)
USAGE = 2  # bad command line: argparse's own convention
DUPLICATE = 3  # `enqueue --unique`: the job id is already queued, running, or done: not added
NOT_FOUND = 3  # `cancel`: no job of the ids was found running, waiting or delayed
UNCONFIRMED = 4  # `cancel --wait`: every job found running is settled, but one by another daemon
# than the one that ran it (taken over from a daemon dead or cut off from Redis, acked unrun):
# a handler still running there, unseen from Redis, stops only when that daemon reaches Redis
# `enqueue --wait`: the job ended, not done (the job itself; the command did what it was asked)
JOB_DEAD = 5  # dead-lettered: failed for good (its attempts spent, poison, malformed, refused)
JOB_CANCELLED = 6  # cancelled (`jobd cancel`)
JOB_EXPIRED = 7  # expired: not started by its jobd_expires_at, or within its queue's max_wait
WAIT_TIMEOUT = 124  # `enqueue --wait --wait-timeout`: not ended by then (as timeout(1) exits)
DATAERR = 65  # EX_DATAERR: `enqueue --lines/--ndjson`: some line was refused (the others enqueued)
UNAVAILABLE = 69  # EX_UNAVAILABLE: Redis could not be reached by a one-shot command
SOFTWARE = 70  # EX_SOFTWARE: a bug in jobd
TEMPFAIL = 75  # EX_TEMPFAIL: `enqueue --wait-replicas`: enqueued, but not confirmed durable;
# `cancel --wait DURATION`: cancelled, but a job found running had not stopped by then
CONFIG = 78  # EX_CONFIG: the config file is invalid; systemd units refuse to restart on it
