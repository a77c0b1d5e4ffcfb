"""Image preprocessing: the bundle's TorchVision spec run in numpy (the runtime) or TorchVision (the compiler),
and any-resolution tiling. Used by ir/, quant/ and runtime/; depends on nothing above it."""
