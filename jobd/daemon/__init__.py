"""The daemon: the loop (``loop``), the threads that feed it (``reader``) and record what it
decided (``recorder``), and the periodic duties (``duties`` and the modules that own one)."""
