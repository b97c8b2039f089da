"""Exit statuses of the jobd command line (sysexits.h where one fits)."""

OK = 0
FAILURE = 1  # a command ran and failed (e.g. Redis answered with an error)
USAGE = 2  # bad command line: argparse's own convention
DUPLICATE = 3  # `enqueue --unique`: the job id is already queued, running, or done: not added
NOT_FOUND = 3  # `cancel`: no job of the ids was found running, waiting or delayed
DATAERR = 65  # EX_DATAERR: `enqueue --lines/--ndjson`: some line was refused (the others enqueued)
UNAVAILABLE = 69  # EX_UNAVAILABLE: Redis could not be reached by a one-shot command
SOFTWARE = 70  # EX_SOFTWARE: a bug in jobd
TEMPFAIL = 75  # EX_TEMPFAIL: `enqueue --wait-replicas`: enqueued, but not confirmed durable
CONFIG = 78  # EX_CONFIG: the config file is invalid; systemd units refuse to restart on it
