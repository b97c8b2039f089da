"""The handler process: starting it (``spawn``), its environment, its life (``handler``), and
what its end means for the job (``policy``)."""
