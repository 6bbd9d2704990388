"""Python client library for inference.v1.InferenceService.

* :class:`InferenceClient` (sync) and :class:`AsyncInferenceClient` (asyncio):
  ``generate`` (streamed events), ``generate_many`` (many requests on one
  stream), ``generate_json``, ``cancel``, ``metrics``, ``health``, ``tokenize``,
  ``detokenize``, ``count_tokens``, ``model_info``.
* Events: :class:`Delta`, :class:`Done` (and :class:`ErrorEvent` on multiplexed streams); with
  ``tools=``, the model's calls as :class:`ToolCall` (``Delta.tool_calls``, ``Done.tool_calls``).
* Failures: :class:`InferenceError` with the gRPC status ``code``.
* Retries: :class:`RetryPolicy` (client side), or gRPC's native retries via
  :func:`retry_service_config` + :func:`channel_options`.
"""

from __future__ import annotations

from .aio import AsyncInferenceClient
from .aio_stream import AsyncGenerateStream, AsyncGeneration
from .client import DEFAULT_TARGET, InferenceClient
from .errors import InferenceError
from .events import Delta, Done, ErrorEvent, Event, Result, StreamEvent, Timing, Usage
from .generation import Generation
from .metrics import format_metrics, metrics_to_dict
from .model_calls import format_model_info, model_info_to_dict
from .retry import NO_RETRY, RetryPolicy
from .security import secure_credentials, token_metadata
from .service_config import channel_options, retry_service_config
from .spec import GenerateOptions, RequestSpec, SamplingOptions
from .stream import GenerateStream
from .tools import ToolCall

__all__ = [
    "DEFAULT_TARGET",
    "NO_RETRY",
    "AsyncGenerateStream",
    "AsyncGeneration",
    "AsyncInferenceClient",
    "Delta",
    "Done",
    "ErrorEvent",
    "Event",
    "GenerateOptions",
    "GenerateStream",
    "Generation",
    "InferenceClient",
    "InferenceError",
    "RequestSpec",
    "Result",
    "RetryPolicy",
    "SamplingOptions",
    "StreamEvent",
    "Timing",
    "ToolCall",
    "Usage",
    "channel_options",
    "format_metrics",
    "format_model_info",
    "metrics_to_dict",
    "model_info_to_dict",
    "retry_service_config",
    "secure_credentials",
    "token_metadata",
]
