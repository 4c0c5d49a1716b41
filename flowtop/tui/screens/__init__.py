"""Screens of the flowtop UI (one per module, named after its class)."""
