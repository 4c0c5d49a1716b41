"""The demo: a small GPT trained with DDP on CPU (gloo), watched live by flowtop."""
