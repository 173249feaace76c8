"""Front ends: OpenAI HTTP, Triton HTTP and Triton gRPC, plus API keys and SSE framing."""
