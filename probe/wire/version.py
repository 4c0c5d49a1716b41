"""The wire's version (probe.wire): a frame says ``"v": [MAJOR, MINOR]``; a different MAJOR is
rejected, a newer MINOR accepted (new optional fields are ignored by older monitors)."""

MAJOR = 1
#: 1: kernels carry raw records (names, ops, acts); 2: "steps" batches, "relay" figures;
#: 3: "stepcols" (step records as columns, probe.wire.steps); 4: the "hello_now" command, and
#: the flops message's optional "attention_masking", "peak_kind" and "peak_by_dtype_kind"
#: (probe.wire.control: the monitor asks a rank it forgot for its hello and FLOP count)
MINOR = 4
