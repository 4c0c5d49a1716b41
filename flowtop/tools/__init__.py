"""The subcommands besides top and serve (run, relay, demo, doctor, keys, analyze, calibrate)
and what they share. ``flowtop.cli`` dispatches to them; they never import it."""
