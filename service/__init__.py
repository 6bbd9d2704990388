"""CPU LLM inference microservice: continuous batching over llama.cpp behind gRPC."""

__version__ = "0.1.0"
