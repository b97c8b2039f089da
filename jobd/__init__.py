"""jobd: a job worker on Redis Streams that runs each job as a subprocess."""

__version__ = "0.1.0"
