"""The LLM handed to another engine: the Hugging Face export, vLLM, TensorRT-LLM (their environments, workers and
runners together). Nothing here is imported at mmtrt's import; each module imports its engine lazily."""
