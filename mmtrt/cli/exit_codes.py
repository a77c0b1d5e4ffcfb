"""The exit codes every command shares."""

EXIT_USER_ERROR = 2
EXIT_COMPARE_FAILED = 1
EXIT_NOT_ALL_BUILT = 1  # build-engines: some TensorRT segment was skipped or failed (each record says why)
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
EXIT_BROKEN_PIPE = 141
