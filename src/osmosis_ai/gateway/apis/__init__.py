"""The APIs a rollout's endpoint speaks, each translated onto the policies' chat completions."""

from osmosis_ai.gateway.apis.base import Api, ApiCall
from osmosis_ai.gateway.apis.chat import ChatCompletionsApi
from osmosis_ai.gateway.apis.messages import MessagesApi, chat_payload_of_messages_request
from osmosis_ai.gateway.apis.responses import ResponsesApi, chat_payload_of_response_request

__all__ = [
    "Api",
    "ApiCall",
    "ChatCompletionsApi",
    "MessagesApi",
    "ResponsesApi",
    "chat_payload_of_messages_request",
    "chat_payload_of_response_request",
]
