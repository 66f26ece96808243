"""llama.cpp\x27s server (the ``xllamacpp`` wheel) as kvspec\x27s third engine family: the only package that imports xllamacpp and gguf."""
