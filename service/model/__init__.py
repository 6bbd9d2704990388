"""The model: the only package that touches llama.cpp (runner), chat templates, sampling, logprobs, speculative proposals."""
