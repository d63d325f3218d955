"""Test helpers for langgraph-cancel: a scripted chat model that needs no API key."""

from langgraph_cancel.testing.fake_model import (
    OnExhausted,
    ScriptedChatModel,
    ScriptedReply,
    ScriptExhaustedError,
    Turn,
    split_tokens,
    tool_call,
    tool_calls_turn,
)

__all__ = [
    "OnExhausted",
    "ScriptExhaustedError",
    "ScriptedChatModel",
    "ScriptedReply",
    "Turn",
    "split_tokens",
    "tool_call",
    "tool_calls_turn",
]
