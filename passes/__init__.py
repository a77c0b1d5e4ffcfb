"""mmtrt's graph passes, one per file, registered through the `mmtrt.passes` entry point group."""
