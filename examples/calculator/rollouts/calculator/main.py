"""Calculator rollout: the model answers arithmetic questions, with a calculator tool.

The workflow talks to the rollout's OpenAI-compatible endpoint with plain HTTP, so it runs
unchanged under local evaluation and under training. The grader compares the last number of
the final answer with the dataset's ground truth; with ``CALCULATOR_GRADER=judge`` (an
``[env]`` of the config) a model judge grades it instead, given the ground truth as reference
(the config's ``[judge]`` names the judge's model).
"""

from __future__ import annotations

import ast
import json
import operator
import os
import re
from typing import Any

import httpx2

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    JudgeGrader,
    JudgeGraderConfig,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.model_pool import tls_context
from osmosis_ai.rollout.server import create_rollout_server

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression such as 17*23 or (4+5)/3.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculate(expression: str) -> str:
    """Evaluate +, -, *, / and parentheses over numbers; anything else is an error string."""

    def evaluate(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return evaluate(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](evaluate(node.operand))
        raise ValueError("only numbers and + - * / ( ) are allowed")

    try:
        value = evaluate(ast.parse(expression.strip(), mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return str(int(value)) if value.is_integer() else f"{value:.6g}"


class CalculatorConfig(AgentWorkflowConfig):
    name: str = "calculator"
    max_turns: int = 3
    temperature: float = 0.0
    max_tokens: int = 96


class CalculatorWorkflow(AgentWorkflow[CalculatorConfig]):
    async def run(self, ctx: AgentWorkflowContext[CalculatorConfig]) -> list[dict[str, Any]]:
        config = ctx.config or CalculatorConfig()
        rollout = get_rollout_context()
        assert rollout is not None, "run() is called inside a rollout context"
        messages = list(ctx.prompt)
        headers = {"Authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else {}
        # The process's one TLS context: a client that builds its own spends ~50 ms of CPU.
        async with httpx2.AsyncClient(timeout=300, verify=tls_context()) as http:
            for _ in range(config.max_turns):
                response = await http.post(
                    f"{rollout.chat_completions_url}/chat/completions",
                    json={
                        "model": "policy",
                        "messages": messages,
                        "tools": [CALCULATOR],
                        "temperature": config.temperature,
                        "max_tokens": config.max_tokens,
                    },
                    headers=headers,
                )
                response.raise_for_status()
                message = response.json()["choices"][0]["message"]
                messages.append(message)
                calls = message.get("tool_calls") or []
                if not calls:
                    break
                for call in calls:
                    result = await self.call_tool(call)
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        return messages

    async def call_tool(self, call: dict[str, Any]) -> str:
        """The result of one tool call (a subclass may reach a real service here)."""
        arguments = json.loads(call["function"]["arguments"] or "{}")
        return calculate(str(arguments.get("expression", "")))


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def final_number(messages: list[dict[str, Any]]) -> float | None:
    """The last number of the last assistant message (None: it states none)."""
    final = next(
        (m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), ""
    )
    numbers = _NUMBER.findall(final)
    return float(numbers[-1]) if numbers else None


class ExactAnswer(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        answer = final_number(ctx.sample.messages)
        ctx.set_reward(1.0 if answer is not None and answer == float(ctx.label or "nan") else 0.0)


class CloseAnswer(Grader):
    """Partial credit: 1 for the exact answer; a wrong number gets up to 0.5, less the further
    it is from the answer (relative to its size); no number gets 0. A small model's group of
    attempts then rarely has all-equal rewards, so more of its steps learn."""

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        answer, truth = final_number(ctx.sample.messages), float(ctx.label or "nan")
        if answer is None:
            ctx.set_reward(0.0)
        elif answer == truth:
            ctx.set_reward(1.0)
        else:
            ctx.set_reward(0.5 / (1 + abs(answer - truth) / max(1.0, abs(truth))))


JUDGE_RUBRIC = (
    "The agent was asked an arithmetic question and could use a calculator. Score 1 if its "
    "final answer states the same number as the reference answer, and 0 otherwise."
)

calculator_config = CalculatorConfig()
if os.environ.get("CALCULATOR_GRADER", "exact") == "judge":
    backend = LocalBackend(
        workflow=CalculatorWorkflow,
        workflow_config=calculator_config,
        grader=JudgeGrader,
        grader_config=JudgeGraderConfig(rubric=JUDGE_RUBRIC, scores=(0, 1)),
    )
else:
    backend = LocalBackend(
        workflow=CalculatorWorkflow, workflow_config=calculator_config, grader=ExactAnswer
    )
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))
