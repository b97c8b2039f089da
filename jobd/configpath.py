"""Where jobd looks for its config when told nothing (``DEFAULT_CONFIG``): apart from
``jobd.config`` so that the command line's parser (--help, --version, completion) does not
import the config's loader, its schema validator and Redis's client (0.2 s of start-up)."""

DEFAULT_CONFIG = "/etc/jobd/jobd.yaml"
