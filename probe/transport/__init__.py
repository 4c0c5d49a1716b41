"""Getting frames to the monitor: the publisher and its sender thread, a bye on SIGTERM."""
